// The reduction kernels against a scalar reference that combines in the same
// order (so the comparison is exact), for every dtype and op, and the AVX-512
// kernels against the generic ones, bit for bit.
#include <cmath>
#include <cstring>
#include <random>

#include "algorithm/reduce.h"
#include "harness.h"

using namespace smddp;
using algorithm::ReduceSpec;

namespace {

float bf16ToFloat(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t floatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>(((u & 0xffff0000u) | 0x00400000u) >> 16);
  }
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Reference for one element: combine in source order in the accumulator type.
template <typename Acc>
Acc combine(ReduceOp op, Acc a, Acc b) {
  switch (op) {
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return (a < b || a != a) ? a : b;
    case ReduceOp::kMax:
      return (a > b || a != a) ? a : b;
    default:
      return a + b;
  }
}

std::vector<uint8_t> randomBytes(std::mt19937& rng, DataType t, size_t count) {
  std::vector<uint8_t> out(count * elementSize(t));
  std::uniform_real_distribution<float> uf(-4.f, 4.f);
  std::uniform_int_distribution<int> ui(-100, 100);
  for (size_t i = 0; i < count; ++i) {
    uint8_t* p = out.data() + i * elementSize(t);
    switch (t) {
      case DataType::kFloat32: {
        float v = uf(rng);
        std::memcpy(p, &v, 4);
        break;
      }
      case DataType::kFloat64: {
        double v = uf(rng);
        std::memcpy(p, &v, 8);
        break;
      }
      case DataType::kBFloat16: {
        uint16_t v = floatToBf16(uf(rng));
        std::memcpy(p, &v, 2);
        break;
      }
      case DataType::kFloat16: {
        _Float16 v = static_cast<_Float16>(uf(rng));
        std::memcpy(p, &v, 2);
        break;
      }
      case DataType::kInt8:
        p[0] = static_cast<uint8_t>(ui(rng));
        break;
      case DataType::kUInt8:
        p[0] = static_cast<uint8_t>(ui(rng) + 100);
        break;
      case DataType::kInt32: {
        int32_t v = ui(rng) * 1000003;
        std::memcpy(p, &v, 4);
        break;
      }
      case DataType::kInt64: {
        int64_t v = static_cast<int64_t>(ui(rng)) * 100000000007LL;
        std::memcpy(p, &v, 8);
        break;
      }
      case DataType::kBool:
        p[0] = static_cast<uint8_t>(ui(rng) > 0);
        break;
      default:
        break;
    }
  }
  return out;
}

template <typename T>
T load(const std::vector<uint8_t>& v, size_t i) {
  T x;
  std::memcpy(&x, v.data() + i * sizeof(T), sizeof(T));
  return x;
}

// Expected bytes of reducing `srcs` (raw inputs, finalized).
std::vector<uint8_t> reference(const ReduceSpec& spec, const std::vector<std::vector<uint8_t>>& srcs, size_t count) {
  const DataType t = spec.dtype;
  std::vector<uint8_t> out(count * elementSize(t));
  const bool premul = spec.op == ReduceOp::kPremulSum;
  const bool avg = spec.op == ReduceOp::kAvg;
  for (size_t i = 0; i < count; ++i) {
    uint8_t* p = out.data() + i * elementSize(t);
    switch (t) {
      case DataType::kFloat32:
      case DataType::kBFloat16:
      case DataType::kFloat16: {
        auto get = [&](size_t s) -> float {
          if (t == DataType::kFloat32) {
            return load<float>(srcs[s], i);
          }
          uint16_t b = load<uint16_t>(srcs[s], i);
          if (t == DataType::kBFloat16) {
            return bf16ToFloat(b);
          }
          _Float16 h;
          std::memcpy(&h, &b, 2);
          return static_cast<float>(h);
        };
        const float f = static_cast<float>(spec.premul);
        float acc = premul ? get(0) * f : get(0);
        for (size_t s = 1; s < srcs.size(); ++s) {
          acc = combine<float>(spec.op, acc, premul ? get(s) * f : get(s));
        }
        if (avg) {
          acc = acc / static_cast<float>(spec.divisor);
        }
        if (t == DataType::kFloat32) {
          std::memcpy(p, &acc, 4);
        } else if (t == DataType::kBFloat16) {
          uint16_t b = floatToBf16(acc);
          std::memcpy(p, &b, 2);
        } else {
          _Float16 h = static_cast<_Float16>(acc);
          std::memcpy(p, &h, 2);
        }
        break;
      }
      case DataType::kFloat64: {
        double acc = premul ? load<double>(srcs[0], i) * spec.premul : load<double>(srcs[0], i);
        for (size_t s = 1; s < srcs.size(); ++s) {
          double x = load<double>(srcs[s], i);
          acc = combine<double>(spec.op, acc, premul ? x * spec.premul : x);
        }
        if (avg) {
          acc = acc / spec.divisor;
        }
        std::memcpy(p, &acc, 8);
        break;
      }
      case DataType::kBool: {
        bool any = spec.op == ReduceOp::kSum || spec.op == ReduceOp::kMax;
        bool acc = srcs[0][i] != 0;
        for (size_t s = 1; s < srcs.size(); ++s) {
          acc = any ? (acc || srcs[s][i] != 0) : (acc && srcs[s][i] != 0);
        }
        p[0] = acc ? 1 : 0;
        break;
      }
      default: {
        // Integers: wrap-around arithmetic in 64 bits, truncated.
        const size_t es = elementSize(t);
        auto get = [&](size_t s) -> int64_t {
          switch (t) {
            case DataType::kInt8:
              return static_cast<int8_t>(srcs[s][i]);
            case DataType::kUInt8:
              return srcs[s][i];
            case DataType::kInt32:
              return load<int32_t>(srcs[s], i);
            default:
              return load<int64_t>(srcs[s], i);
          }
        };
        auto wrap = [&](int64_t v) -> int64_t {
          switch (t) {
            case DataType::kInt8:
              return static_cast<int8_t>(static_cast<uint8_t>(v));
            case DataType::kUInt8:
              return static_cast<uint8_t>(v);
            case DataType::kInt32:
              return static_cast<int32_t>(static_cast<uint32_t>(v));
            default:
              return v;
          }
        };
        int64_t acc = get(0);
        for (size_t s = 1; s < srcs.size(); ++s) {
          int64_t x = get(s);
          if (spec.op == ReduceOp::kProduct) {
            acc = wrap(static_cast<int64_t>(static_cast<uint64_t>(acc) * static_cast<uint64_t>(x)));
          } else if (spec.op == ReduceOp::kMin) {
            acc = std::min(acc, x);
          } else if (spec.op == ReduceOp::kMax) {
            acc = std::max(acc, x);
          } else {
            acc = wrap(static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(x)));
          }
        }
        std::memcpy(p, &acc, es);
        break;
      }
    }
  }
  return out;
}

const DataType kTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
                           DataType::kInt8,    DataType::kUInt8,   DataType::kInt32,   DataType::kInt64,
                           DataType::kBool};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct,
                         ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kPremulSum};
const size_t kCounts[] = {0, 1, 7, 511, 512, 513, 1500};

void checkAll(const char* isa) {
  algorithm::setReduceKernelIsa(isa);
  std::mt19937 rng(1234);
  for (DataType t : kTypes) {
    for (ReduceOp op : kOps) {
      if (!reduceOpSupported(t, op)) {
        continue;
      }
      for (size_t count : kCounts) {
        for (int nsrc : {1, 2, 3, 5}) {
          ReduceSpec spec{t, op, 0.375, 3.0};
          std::vector<std::vector<uint8_t>> srcs;
          std::vector<const void*> ptrs;
          for (int s = 0; s < nsrc; ++s) {
            srcs.push_back(randomBytes(rng, t, count));
          }
          for (auto& s : srcs) {
            ptrs.push_back(s.data());
          }
          std::vector<uint8_t> out(count * elementSize(t) + 1, 0xAB);
          algorithm::reduce(spec, out.data(), ptrs.data(), nsrc, count, true, true);
          auto want = reference(spec, srcs, count);
          bool same = want.empty() || std::memcmp(out.data(), want.data(), want.size()) == 0;
          if (!same) {
            ::smddp::test::fail(__FILE__, __LINE__,
                                str(isa, ": ", dataTypeName(t), " ", reduceOpName(op), " count ", count, " nsrc ",
                                    nsrc, " differs from the reference"));
          }
          EXPECT_EQ(static_cast<int>(out[want.size()]), 0xAB);  // no write past the end
          // In place: the destination is one of the sources (the rank's own
          // input of an in-place collective), first or last.
          for (int which : {0, nsrc - 1}) {
            std::vector<uint8_t> inplace = srcs[static_cast<size_t>(which)];
            std::vector<const void*> p2 = ptrs;
            p2[static_cast<size_t>(which)] = inplace.data();
            algorithm::reduce(spec, inplace.data(), p2.data(), nsrc, count, true, true);
            if (!want.empty() && std::memcmp(inplace.data(), want.data(), want.size()) != 0) {
              ::smddp::test::fail(__FILE__, __LINE__,
                                  str(isa, ": ", dataTypeName(t), " ", reduceOpName(op), " count ", count, " nsrc ",
                                      nsrc, " in place into source ", which, " differs from the reference"));
            }
          }
        }
      }
    }
  }
  algorithm::setReduceKernelIsa("auto");
}

} // namespace

SMDDP_TEST(generic_kernels_match_reference) {
  checkAll("generic");
}

SMDDP_TEST(avx512_kernels_match_reference) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) {
    std::fprintf(stderr, "  (no AVX-512 on this CPU: skipped)\n");
    return;
  }
  checkAll("avx512");
}

SMDDP_TEST(in_place_accumulate) {
  std::vector<float> a = {1, 2, 3}, b = {10, 20, 30};
  const void* srcs[2] = {a.data(), b.data()};
  algorithm::reduce(ReduceSpec{DataType::kFloat32, ReduceOp::kSum}, a.data(), srcs, 2, 3, true, true);
  EXPECT_EQ(a[2], 33.0f);
}

SMDDP_TEST(nan_propagates_through_min_max) {
  std::vector<float> a = {NAN, 1}, b = {0, NAN}, out(2);
  const void* srcs[2] = {a.data(), b.data()};
  algorithm::reduce(ReduceSpec{DataType::kFloat32, ReduceOp::kMin}, out.data(), srcs, 2, 2, true, true);
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1]));
}
