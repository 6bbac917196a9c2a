// The arithmetic of the CUDA schedules that needs no GPU: how a reduction is
// cut into a scalar head, 16-byte vectors and a scalar tail; how a node's
// AllReduce cuts its slices so that every slice starts 16-byte aligned; how a
// peer's blocks that land at regular offsets become one strided copy; in what
// order a sliced AllReduce enqueues its steps on two streams. Torch-
// and CUDA-free, so that the native tests check it on the host; the CUDA
// path (algorithm/cuda/) only executes the plans.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace smddp::algorithm {

// How a reduction of `count` elements of `elem_size` bytes over buffers at
// `addrs` (the destination and every source) is cut: `head` elements one at a
// time until every buffer is 16-byte aligned, `vectors` 16-byte vectors, the
// `tail` elements left one at a time. Buffers that are not all misaligned
// alike cannot be vectorized together: then everything is head.
struct AlignedSplit {
  size_t head = 0;
  size_t vectors = 0;
  size_t tail = 0;
  size_t elemsPerVector = 1;
};

inline AlignedSplit alignedSplit(const uintptr_t* addrs, int n, size_t count, size_t elem_size) {
  AlignedSplit s;
  s.elemsPerVector = 16 / elem_size;
  const uintptr_t mis = n > 0 ? addrs[0] % 16 : 0;
  bool alike = elem_size > 0 && 16 % elem_size == 0;
  for (int i = 0; i < n && alike; ++i) {
    alike = addrs[i] % 16 == mis;
  }
  const size_t to_align = (16 - mis) % 16;
  if (!alike || to_align % elem_size != 0) {
    s.head = count;
    return s;
  }
  s.head = to_align / elem_size < count ? to_align / elem_size : count;
  const size_t rest = count - s.head;
  s.vectors = rest / s.elemsPerVector;
  s.tail = rest - s.vectors * s.elemsPerVector;
  return s;
}

// The split of a reduction over `nseg` segments in one launch (the rails'
// ReduceScatter reduces every rail member's block of a chunk at once):
// segment s writes dst + s * dst_stride and reads srcs[k] + src_offset[s] for
// every source k. Segment 0 decides the split (every address it touches);
// the others share it only if each keeps segment 0's alignment, else
// everything is head.
inline AlignedSplit segmentsSplit(uintptr_t dst, const uintptr_t* srcs, int nsrc, const size_t* src_offset, int nseg,
                                  size_t dst_stride, size_t count, size_t elem_size) {
  constexpr int kMaxAddrs = 64;
  uintptr_t addrs[kMaxAddrs];
  int n = 0;
  addrs[n++] = dst;
  for (int k = 0; k < nsrc && n < kMaxAddrs; ++k) {
    addrs[n++] = srcs[k] + src_offset[0];
  }
  AlignedSplit split = alignedSplit(addrs, n, count, elem_size);
  for (int seg = 1; seg < nseg && split.vectors > 0; ++seg) {
    if (src_offset[seg] % 16 != src_offset[0] % 16 || (static_cast<size_t>(seg) * dst_stride) % 16 != 0) {
      split = AlignedSplit{count, 0, 0, split.elemsPerVector};
    }
  }
  return split;
}

// Slice i of `count` elements cut into `parts`: every boundary but the end is
// a multiple of `align` elements (a slice may be empty), the sizes as even as
// that allows, the same on every rank.
struct AlignedSlices {
  size_t count;
  size_t parts;
  size_t align;

  size_t begin(size_t i) const {
    const size_t units = (count + align - 1) / align;  // whole aligned units
    const size_t per = units / parts;
    const size_t extra = units % parts;
    const size_t at = (i * per + (i < extra ? i : extra)) * align;
    return at < count ? at : count;
  }
  size_t size(size_t i) const {
    return begin(i + 1 > parts ? parts : i + 1) - begin(i);
  }
};

// Whether `offsets` (two or more) are evenly spaced, and by how much: the
// blocks a peer contributes to an output then move in one strided copy.
inline bool evenlySpaced(const std::vector<size_t>& offsets, size_t* stride) {
  if (offsets.size() < 2 || offsets[1] <= offsets[0]) {
    return false;
  }
  const size_t d = offsets[1] - offsets[0];
  for (size_t i = 2; i < offsets.size(); ++i) {
    if (offsets[i] <= offsets[i - 1] || offsets[i] - offsets[i - 1] != d) {
      return false;
    }
  }
  *stride = d;
  return true;
}

// A sliced AllReduce (algorithm/cuda/schedules.h: slicedAllReduce) runs, for
// each chunk c, a reduction over the node of this rank's slice of the chunk
// and a gather of every rank's reduced slice of it; over the rails, a rail
// step all-reduces slices across the nodes in between:
//   kNone      (one node) chunk by chunk: reduce c, gather c;
//   kWhole     every chunk reduced into its own slot of this rank's memory,
//              one rail step over all the slots (the rail's latency paid
//              once per call), every chunk gathered from its slot; all on
//              the collective's stream;
//   kPerChunk  (SMDDP_CUDA_PIPELINE) chunk c reduced into slot c % 2, its
//              rail step on the rail's stream after an event of the
//              reduction, its gather after an event of the rail step; the
//              host enqueues chunk c+1's reduction and rail step before chunk
//              c's gather, so that chunk c is on the network while chunk c+1
//              crosses the node, and a slot is written again (chunk c+2)
//              only after chunk c's gather, earlier on the same stream, has
//              read it.
enum class RailSteps : uint8_t { kNone, kWhole, kPerChunk };
enum class SliceStep : uint8_t { kReduce, kRail, kGather };

// A step over chunks [first, first + count).
struct PlannedStep {
  SliceStep step;
  size_t first;
  size_t count = 1;
};

inline std::vector<PlannedStep> slicedAllReducePlan(size_t chunks, RailSteps rail) {
  std::vector<PlannedStep> plan;
  switch (rail) {
    case RailSteps::kNone:
      for (size_t c = 0; c < chunks; ++c) {
        plan.push_back({SliceStep::kReduce, c});
        plan.push_back({SliceStep::kGather, c});
      }
      break;
    case RailSteps::kWhole:
      for (size_t c = 0; c < chunks; ++c) {
        plan.push_back({SliceStep::kReduce, c});
      }
      if (chunks > 0) {
        plan.push_back({SliceStep::kRail, 0, chunks});
      }
      for (size_t c = 0; c < chunks; ++c) {
        plan.push_back({SliceStep::kGather, c});
      }
      break;
    case RailSteps::kPerChunk:
      for (size_t c = 0; c < chunks; ++c) {
        plan.push_back({SliceStep::kReduce, c});
        plan.push_back({SliceStep::kRail, c});
        if (c > 0) {
          plan.push_back({SliceStep::kGather, c - 1});
        }
      }
      if (chunks > 0) {
        plan.push_back({SliceStep::kGather, chunks - 1});
      }
      break;
  }
  return plan;
}

} // namespace smddp::algorithm
