// The element operations shared by the CPU and CUDA kernels
// (algorithm/reduce_ops.h), checked on the host:
//  - the software float16 conversions the CUDA kernels use equal the
//    compiler's _Float16 conversions the CPU kernels use, on every float16
//    value and on the float values around every rounding boundary;
//  - a model of the CUDA kernel's per-element work (the shared operations
//    and conversions, in its order) equals the CPU reduction's bits for every
//    dtype, op, raw/finalize and source count, special values included: NaN
//    results agree as NaN (IEEE leaves an arithmetic result's payload open);
//  - AVG on float16 is a premultiplied sum (collectiveReduceSpec).
#include <cmath>
#include <cstring>
#include <random>

#include "algorithm/reduce.h"
#include "algorithm/reduce_ops.h"
#include "harness.h"

using namespace smddp;
using algorithm::ReduceSpec;
namespace ops = algorithm::ops;

namespace {

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t compilerToF16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

float compilerFromF16(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}

// The CUDA kernel's work on one element (device_reduce.cu), on the host.
template <ops::Combine C>
float modelElement(const float* x, int nsrc, bool scale, float s, bool divide, float d) {
  float acc = scale ? ops::mul(x[0], s) : x[0];
  for (int k = 1; k < nsrc; ++k) {
    acc = ops::combine<C>(acc, scale ? ops::mul(x[k], s) : x[k]);
  }
  return divide ? acc / d : acc;
}

float load(DataType t, const uint8_t* p) {
  uint16_t h;
  switch (t) {
    case DataType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DataType::kFloat16:
      std::memcpy(&h, p, 2);
      return ops::f16ToFloat(h);
    default:
      std::memcpy(&h, p, 2);
      return ops::bf16ToFloat(h);
  }
}

void store(DataType t, uint8_t* p, float v) {
  uint16_t h;
  switch (t) {
    case DataType::kFloat32:
      std::memcpy(p, &v, 4);
      return;
    case DataType::kFloat16:
      h = ops::floatToF16(v);
      std::memcpy(p, &h, 2);
      return;
    default:
      h = ops::floatToBf16(v);
      std::memcpy(p, &h, 2);
      return;
  }
}

bool isNan(DataType t, const uint8_t* p) {
  return std::isnan(load(t, p));
}

// Inputs with the values where implementations part: signed zeros,
// infinities, NaNs of several payloads, subnormals of each type, values that
// overflow float16 when summed, and ordinary ones.
std::vector<float> specials() {
  return {0.0f, -0.0f, 1.0f, -1.5f, 65504.0f, 60000.0f, -65504.0f, 1e-8f, -6e-8f, 3e-5f,
          floatOf(0x7fc00001u), floatOf(0xffc12345u), floatOf(0x7f800001u), INFINITY, -INFINITY,
          1e30f, 1e-40f, 0.1f, 3.0f, 7.25f};
}

} // namespace

SMDDP_TEST(f16_to_float_matches_the_compiler_on_every_value) {
  int bad = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint32_t want = bitsOf(compilerFromF16(static_cast<uint16_t>(b)));
    const uint32_t got = bitsOf(ops::f16ToFloat(static_cast<uint16_t>(b)));
    if (want != got && ++bad <= 5) {
      test::fail(__FILE__, __LINE__, str("f16 0x", std::hex, b, ": compiler 0x", want, ", shared 0x", got));
    }
  }
  EXPECT_EQ(bad, 0);
}

SMDDP_TEST(float_to_f16_matches_the_compiler_around_every_boundary) {
  // Every sign/exponent/top-mantissa pattern, with the low 16 bits at the
  // rounding boundaries of normal (bit 12) and subnormal (bits 13-15 and
  // above, covered by the top bits) float16 results.
  const uint16_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x2001, 0x3000,
                           0x3fff, 0x4000, 0x4001, 0x5555, 0x7fff, 0x8000, 0x8001, 0xaaaa, 0xbfff,
                           0xc000, 0xefff, 0xf000, 0xffff};
  int bad = 0;
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    for (uint16_t lo : lows) {
      const float f = floatOf((hi << 16) | lo);
      const uint16_t want = compilerToF16(f);
      const uint16_t got = ops::floatToF16(f);
      if (want != got && ++bad <= 5) {
        test::fail(__FILE__, __LINE__,
                   str("float 0x", std::hex, bitsOf(f), ": compiler 0x", want, ", shared 0x", got));
      }
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    const float f = floatOf(static_cast<uint32_t>(rng()));
    if (compilerToF16(f) != ops::floatToF16(f) && ++bad <= 5) {
      test::fail(__FILE__, __LINE__, str("float 0x", std::hex, bitsOf(f)));
    }
  }
  EXPECT_EQ(bad, 0);
}

SMDDP_TEST(the_device_kernel_model_gives_the_cpu_bits) {
  std::mt19937 rng(11);
  const auto sp = specials();
  std::uniform_real_distribution<float> uf(-8.f, 8.f);
  const size_t n = 61;
  const DataType types[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16};
  const ReduceOp opsList[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct,
                              ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kPremulSum};
  int bad = 0;
  for (const char* isa : {"generic", "avx512"}) {
    try {
      algorithm::setReduceKernelIsa(isa);
    } catch (const Error&) {
      continue;  // no AVX-512 here
    }
    for (DataType t : types) {
      const size_t es = elementSize(t);
      for (ReduceOp op : opsList) {
        for (int nsrc = 1; nsrc <= 17; ++nsrc) {
          for (int flags = 0; flags < 4; ++flags) {
            const bool raw = flags & 1;
            const bool finalize = flags & 2;
            std::vector<std::vector<uint8_t>> src(static_cast<size_t>(nsrc), std::vector<uint8_t>(n * es));
            for (auto& s : src) {
              for (size_t i = 0; i < n; ++i) {
                const float v = i < sp.size() && (rng() % 3 == 0) ? sp[i] : uf(rng);
                store(t, s.data() + i * es, v);
              }
            }
            ReduceSpec spec;
            spec.dtype = t;
            spec.op = op;
            spec.premul = 0.3;
            spec.divisor = 3.0;
            std::vector<const void*> ptrs;
            for (auto& s : src) {
              ptrs.push_back(s.data());
            }
            std::vector<uint8_t> cpu(n * es);
            algorithm::reduce(spec, cpu.data(), ptrs.data(), nsrc, n, raw, finalize);
            const ops::OpTraits tr = ops::traitsOf(op);
            const bool scale = raw && tr.scales_inputs;
            const bool divide = finalize && tr.divides;
            for (size_t i = 0; i < n; ++i) {
              std::vector<float> x(static_cast<size_t>(nsrc));
              for (int k = 0; k < nsrc; ++k) {
                x[static_cast<size_t>(k)] = load(t, src[static_cast<size_t>(k)].data() + i * es);
              }
              float r = 0;
              const float s = static_cast<float>(spec.premul);
              const float d = static_cast<float>(spec.divisor);
              switch (tr.combine) {
                case ops::Combine::kSum:
                  r = modelElement<ops::Combine::kSum>(x.data(), nsrc, scale, s, divide, d);
                  break;
                case ops::Combine::kProduct:
                  r = modelElement<ops::Combine::kProduct>(x.data(), nsrc, scale, s, divide, d);
                  break;
                case ops::Combine::kMin:
                  r = modelElement<ops::Combine::kMin>(x.data(), nsrc, scale, s, divide, d);
                  break;
                case ops::Combine::kMax:
                  r = modelElement<ops::Combine::kMax>(x.data(), nsrc, scale, s, divide, d);
                  break;
              }
              uint8_t dev[4];
              store(t, dev, r);
              const uint8_t* c = cpu.data() + i * es;
              const bool same = std::memcmp(dev, c, es) == 0 || (isNan(t, dev) && isNan(t, c));
              if (!same && ++bad <= 5) {
                test::fail(__FILE__, __LINE__,
                           str(isa, " ", dataTypeName(t), " ", reduceOpName(op), " nsrc ", nsrc, " raw ", raw,
                               " finalize ", finalize, " element ", i, ": model ", load(t, dev), ", cpu ", load(t, c)));
              }
            }
          }
        }
      }
    }
  }
  algorithm::setReduceKernelIsa("auto");
  EXPECT_EQ(bad, 0);
}

SMDDP_TEST(avg_on_float16_is_a_premultiplied_sum) {
  ReduceSpec h = algorithm::collectiveReduceSpec(DataType::kFloat16, ReduceOp::kAvg, 1.0, 8);
  EXPECT_TRUE(h.op == ReduceOp::kPremulSum);
  EXPECT_EQ(h.premul, 0.125);
  EXPECT_EQ(h.divisor, 1.0);
  ReduceSpec f = algorithm::collectiveReduceSpec(DataType::kFloat32, ReduceOp::kAvg, 1.0, 8);
  EXPECT_TRUE(f.op == ReduceOp::kAvg);
  EXPECT_EQ(f.divisor, 8.0);
  ReduceSpec p = algorithm::collectiveReduceSpec(DataType::kBFloat16, ReduceOp::kPremulSum, 0.5, 4);
  EXPECT_TRUE(p.op == ReduceOp::kPremulSum);
  EXPECT_EQ(p.premul, 0.5);
}
