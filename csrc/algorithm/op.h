// The description of one collective call as the algorithms see it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "algorithm/reduce.h"
#include "common/clock.h"
#include "common/types.h"

namespace smddp::algorithm {

struct OpArgs {
  CollectiveKind kind = CollectiveKind::kBarrier;
  // dtype and reduce op (reduce.dtype is the element type of every op).
  ReduceSpec reduce;
  const void* in = nullptr;
  void* out = nullptr;
  // Elements: AllGather, the input of one rank; ReduceScatter, the output of
  // one rank; AllReduce and Broadcast, the whole tensor.
  size_t count = 0;
  // Broadcast: the root's rank in the group the algorithm runs on.
  int root = 0;
  // Position of this call in the group's sequence, the same on every rank.
  uint64_t seq = 0;
  Deadline deadline;
  // CUDA: in and out are memory of torch's caching allocator, which reports
  // a segment's free before it happens (SMDDP_CUDA_ZERO_COPY may map them).
  bool traced_memory = false;

  DataType dtype() const {
    return reduce.dtype;
  }
  size_t elemSize() const {
    return elementSize(reduce.dtype);
  }
};

} // namespace smddp::algorithm
