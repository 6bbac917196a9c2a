// The reduction kernels compiled for AVX-512 (see reduce_kernels.inc); used
// only when the CPU has it.
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma,avx2,bmi2")
#define SMDDP_HAVE_AVX512_KERNELS 1
#endif

#include "algorithm/reduce_kernels.inc"

namespace smddp::algorithm::detail {

#if defined(SMDDP_HAVE_AVX512_KERNELS)
bool reduceAvx512(
    const ReduceSpec& spec,
    void* dst,
    const void* const* srcs,
    int nsrc,
    size_t count,
    bool raw,
    bool finalize) {
  reduceAny(spec, dst, srcs, nsrc, count, raw, finalize);
  return true;
}
#else
bool reduceAvx512(
    const ReduceSpec&, void*, const void* const*, int, size_t, bool, bool) {
  return false;
}
#endif

} // namespace smddp::algorithm::detail
