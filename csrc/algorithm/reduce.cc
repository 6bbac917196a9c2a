#include "algorithm/reduce.h"

#include <atomic>
#include <cstring>
#include <string>


#include "common/error.h"

namespace smddp::algorithm {

namespace detail {
void reduceGeneric(
    const ReduceSpec& spec,
    void* dst,
    const void* const* srcs,
    int nsrc,
    size_t count,
    bool raw,
    bool finalize);
bool reduceAvx512(
    const ReduceSpec& spec,
    void* dst,
    const void* const* srcs,
    int nsrc,
    size_t count,
    bool raw,
    bool finalize);
} // namespace detail

namespace {

bool cpuHasAvx512() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

// 1: avx512, 0: generic.
std::atomic<int> gIsa{cpuHasAvx512() ? 1 : 0};

} // namespace

void reduce(
    const ReduceSpec& spec,
    void* dst,
    const void* const* srcs,
    int nsrc,
    size_t count,
    bool raw,
    bool finalize) {
  if (count == 0 || nsrc <= 0) {
    return;
  }
  if (gIsa.load(std::memory_order_relaxed) == 1 &&
      detail::reduceAvx512(spec, dst, srcs, nsrc, count, raw, finalize)) {
    return;
  }
  detail::reduceGeneric(spec, dst, srcs, nsrc, count, raw, finalize);
}

void finalizeInPlace(const ReduceSpec& spec, void* dst, size_t count, bool raw) {
  const bool scales = raw && spec.op == ReduceOp::kPremulSum && spec.premul != 1.0;
  const bool divides = spec.op == ReduceOp::kAvg && spec.divisor != 1.0;
  if (!scales && !divides) {
    return;
  }
  const void* src[1] = {dst};
  reduce(spec, dst, src, 1, count, raw, true);
}

ReduceSpec collectiveReduceSpec(DataType dtype, ReduceOp op, double premul, int group_size) {
  ReduceSpec spec;
  spec.dtype = dtype;
  spec.op = op;
  spec.premul = op == ReduceOp::kPremulSum ? premul : 1.0;
  spec.divisor = static_cast<double>(group_size);
  if (op == ReduceOp::kAvg && dtype == DataType::kFloat16) {
    spec.op = ReduceOp::kPremulSum;
    spec.premul = 1.0 / static_cast<double>(group_size);
    spec.divisor = 1.0;
  }
  return spec;
}

const char* reduceKernelIsa() {
  return gIsa.load() == 1 ? "avx512" : "generic";
}

void setReduceKernelIsa(const char* isa) {
  std::string s = isa;
  if (s == "auto") {
    gIsa.store(cpuHasAvx512() ? 1 : 0);
  } else if (s == "avx512") {
    SMDDP_CHECK_ARG(cpuHasAvx512(), "this CPU has no AVX-512");
    gIsa.store(1);
  } else if (s == "generic") {
    gIsa.store(0);
  } else {
    SMDDP_THROW(kInvalidArgument, "unknown kernel set '", s, "'; use auto, avx512 or generic");
  }
}

} // namespace smddp::algorithm
