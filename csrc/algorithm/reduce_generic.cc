// The reduction kernels for any CPU (see reduce_kernels.inc).
#include <type_traits>

#include "algorithm/reduce_kernels.inc"

namespace smddp::algorithm::detail {

void reduceGeneric(
    const ReduceSpec& spec,
    void* dst,
    const void* const* srcs,
    int nsrc,
    size_t count,
    bool raw,
    bool finalize) {
  reduceAny(spec, dst, srcs, nsrc, count, raw, finalize);
}

} // namespace smddp::algorithm::detail
