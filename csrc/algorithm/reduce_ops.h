// The element operations of every reduction kernel, one definition for the
// CPU kernels (reduce_kernels.inc) and the CUDA ones (cuda/device_reduce.cu),
// so that both give the same bits for the same inputs.
//
// What stays apart is only how values are loaded and stored where hardware
// differs: the CPU kernels convert float16 with the compiler's _Float16 (one
// instruction on x86), the CUDA kernels with f16ToFloat()/floatToF16() below,
// which reproduce it exactly (round to nearest even, NaN quieted with its
// payload kept); tests/native/test_reduce.cc checks the two against each
// other on every float16 value and on the float values around every
// rounding boundary.
//
// Switches over ReduceOp and Combine name every enumerator and have no
// default (and the build makes -Wswitch an error), so a new reduce op is a
// compile error everywhere it must be handled.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/types.h"

#if defined(__CUDACC__)
#define SMDDP_HD __host__ __device__ __forceinline__
#else
#define SMDDP_HD inline
#endif

namespace smddp::algorithm::ops {

// How two values of a reduction combine.
enum class Combine : uint8_t { kSum, kProduct, kMin, kMax };

// What a reduce op does to its values: how they combine, whether the raw
// inputs are multiplied by a factor first (PREMUL_SUM), whether the result
// is divided at the end (AVG).
struct OpTraits {
  Combine combine;
  bool scales_inputs;
  bool divides;
};

constexpr OpTraits traitsOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return {Combine::kSum, false, false};
    case ReduceOp::kAvg:
      return {Combine::kSum, false, true};
    case ReduceOp::kPremulSum:
      return {Combine::kSum, true, false};
    case ReduceOp::kProduct:
      return {Combine::kProduct, false, false};
    case ReduceOp::kMin:
      return {Combine::kMin, false, false};
    case ReduceOp::kMax:
      return {Combine::kMax, false, false};
    case ReduceOp::kCount:
      break;
  }
  return {Combine::kSum, false, false};
}

template <typename T>
SMDDP_HD T bitsAs(const void* p) {
  T out;
  std::memcpy(&out, p, sizeof(T));
  return out;
}

// IEEE operations, rounded once each: never contracted into a fused
// multiply-add, which would round once for both and change the bits.
SMDDP_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SMDDP_HD double mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
SMDDP_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
SMDDP_HD double add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

// Combines two accumulator values. Integer SUM and PRODUCT wrap around (as
// torch's); floating MIN and MAX propagate NaN (the first NaN met wins).
template <Combine C, typename A>
SMDDP_HD A combine(A a, A b) {
  if constexpr (C == Combine::kSum) {
    if constexpr (std::is_integral_v<A>) {
      using U = std::make_unsigned_t<A>;
      return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return add(a, b);
    }
  } else if constexpr (C == Combine::kProduct) {
    if constexpr (std::is_integral_v<A>) {
      using U = std::make_unsigned_t<A>;
      // Promote to at least unsigned int so small types do not become int.
      using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
      return static_cast<A>(
          static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
    } else {
      return mul(a, b);
    }
  } else if constexpr (C == Combine::kMin) {
    if constexpr (std::is_floating_point_v<A>) {
      return (a < b || a != a) ? a : b;
    } else {
      return a < b ? a : b;
    }
  } else {
    if constexpr (std::is_floating_point_v<A>) {
      return (a > b || a != a) ? a : b;
    } else {
      return a > b ? a : b;
    }
  }
}

// bfloat16 <-> float32: the top half of the float, rounded to nearest even;
// NaN stays a quiet NaN with its top payload bits.
SMDDP_HD float bf16ToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  return bitsAs<float>(&u);
}

SMDDP_HD uint16_t floatToBf16(float f) {
  const uint32_t u = bitsAs<uint32_t>(&f);
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  const uint32_t nan = (u & 0xffff0000u) | 0x00400000u;
  const bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>((is_nan ? nan : rounded) >> 16);
}

// float16 -> float32, exact; a NaN is quieted and keeps its payload.
SMDDP_HD float f16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (mant != 0 ? 0x00400000u | (mant << 13) : 0u);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;
  } else {
    // Subnormal: normalize (the value is mant * 2^-24).
    uint32_t e = 113u;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    u = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  return bitsAs<float>(&u);
}

// float32 -> float16, rounded to nearest even (overflow to infinity,
// underflow through the subnormals); a NaN is quieted and keeps the top bits
// of its payload.
SMDDP_HD uint16_t floatToF16(float f) {
  const uint32_t u = bitsAs<uint32_t>(&f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) {
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  if (abs >= 0x477ff000u) {
    // From 65520 on (the midpoint above the largest float16), infinity.
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs >= 0x38800000u) {
    // Normal float16: drop 13 bits, rounding to nearest even; a carry into
    // the exponent is the right result.
    const uint32_t r = abs - 0x38000000u;
    const uint32_t half = (r >> 13) + (((r & 0x1fffu) > 0x1000u || ((r & 0x1fffu) == 0x1000u && ((r >> 13) & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | half);
  }
  if (abs < 0x33000000u) {
    // Below half the smallest subnormal (2^-25): zero (2^-25 itself ties to
    // even, which is zero too).
    return sign;
  }
  // Subnormal float16: the value in units of 2^-24, rounded to nearest even.
  const uint32_t exp = abs >> 23;
  const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exp;  // 14 + (112 - exp) + 0: bits below 2^-24
  const uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  const uint32_t rounded = q + ((rem > halfway || (rem == halfway && (q & 1u))) ? 1u : 0u);
  return static_cast<uint16_t>(sign | rounded);
}

} // namespace smddp::algorithm::ops
