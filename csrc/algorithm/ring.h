// Ring collectives over the members of a sub-group, written against the
// Channel interface: the flat ring of a whole group (any mix of socket and
// shared-memory hops) and the rail stage of the hierarchical schedules.
//
// Member i sends to member i+1 and receives from member i-1 (mod n). Every
// block is cut into chunks of `chunk_bytes`; chunk c of step s+1 leaves as
// soon as chunk c of step s has arrived, so the steps overlap. Both ends
// post the same messages in the same order (step-major, chunk-minor), which
// is what lets a message carry only a tag to be checked. Which block each
// step moves is protocol::RingOrder's; blocks of unequal size are cut alike
// (chunkCount of the largest; a chunk past the end of a shorter block is an
// empty message), so every member agrees on the schedule.
//
// Schedules, drawn for n = 3 members A, B, C with blocks a, b, c:
//
//   AllGather (block of member i ends everywhere):
//     step 0:  A->B a    B->C b    C->A c
//     step 1:  A->B c    B->C a    C->A b        (forwarding what arrived)
//
//   ReduceScatter (member i ends with block i; x_Y is member Y's
//   contribution to block x; block k is reduced in the order k+1, k+2, ...,
//   k, fixed, hence deterministic):
//     step 0:  A->B c_A          B->C a_B          C->A b_C
//     step 1:  A->B (b_C+b_A)    B->C (c_A+c_B)    C->A (a_B+a_C)
//     end:     A: a_B+a_C+a_A    B: b_C+b_A+b_B    C: c_A+c_B+c_C
//
//   AllReduce: ReduceScatter of n slices, then AllGather of the results.
//   Broadcast: the root's chunks travel the ring once; each member forwards
//   every chunk it receives, except the member before the root.
//
// Memory: ReduceScatter receives into a scratch of (n-1) blocks owned by the
// caller (kept between calls, so pages are touched once).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "algorithm/chunks.h"
#include "algorithm/op.h"
#include "algorithm/reduce.h"
#include "common/host_buffer.h"
#include "transport/channel.h"

namespace smddp::algorithm {

struct Ring {
  int index = 0;  // my position, 0..size-1
  int size = 1;
  transport::Channel* next = nullptr;  // to index+1
  transport::Channel* prev = nullptr;  // from index-1
  size_t chunk_bytes = 1 << 20;
  transport::DriveOptions drive;
};

// AllGather; member i's block of sizes[i] bytes is at out + offsets[i];
// `tag` is the call's (protocol::tagOf). My own block is sent from `own`
// when given, and copied to its place in `out` while the first messages
// are on the wire (a copy before the ring would delay its first byte by
// the copy's time); otherwise it must already be in `out`.
// on_landed(u) is called as chunks arrive, in order: unit u is
// protocol::RingOrder::landed(u, chunks).
void ringAllGather(
    const Ring& ring,
    uint8_t* out,
    const std::vector<size_t>& offsets,
    const std::vector<size_t>& sizes,
    const transport::MessageTag& tag,
    const Deadline& deadline,
    const std::function<void(uint64_t unit)>& on_landed = nullptr,
    const uint8_t* own = nullptr);

// Where a member's contribution to each block is, and whether a chunk of it
// is ready yet (the hierarchical schedule produces contributions while the
// ring runs; `ready` returning false makes the ring wait for `wake_fd`).
struct Contributions {
  const uint8_t* base = nullptr;
  std::vector<size_t> offsets;  // of block i's contribution, in bytes
  std::function<bool(int block, size_t chunk)> ready;
  // If set, the last step of my own block, in place of the ring's
  // dst = part (+) mine: `part` is the other members' contributions,
  // reduced, for `n` elements at byte `offset` of the block; finish applies
  // AVG's division itself when the ring's result is final. My own
  // block's entry in base/offsets and `ready` are then never used. Lets a
  // caller compute its contribution as it goes rather than store it in base.
  // Not with PREMUL_SUM inputs as contributions (the ring scales them first).
  std::function<void(void* dst, const void* part, size_t offset, size_t n)> finish;
};

// ReduceScatter: block i (counts[i] elements) of every member reduced into
// member i's `out`. Sources::kInputs: the contributions are the collective's
// inputs (PREMUL_SUM's factor scales each of them before anything is added,
// so they must be whole at the start: no `ready`, no `finish`).
// Result::kFinal: apply AVG's division to the result. Chunks are chunk_bytes
// rounded down to whole elements.
void ringReduceScatter(
    const Ring& ring,
    const ReduceSpec& spec,
    const Contributions& contrib,
    void* out,
    const std::vector<size_t>& counts,
    Sources sources,
    Result result,
    const transport::MessageTag& tag,
    const Deadline& deadline,
    HostBuffer* scratch);

// AllReduce of `count` elements (in may equal out).
void ringAllReduce(
    const Ring& ring,
    const ReduceSpec& spec,
    const void* in,
    void* out,
    size_t count,
    Sources sources,
    Result result,
    const transport::MessageTag& tag,
    const Deadline& deadline,
    HostBuffer* scratch);

// Broadcast of `bytes` at buf from member `root`.
void ringBroadcast(
    const Ring& ring,
    uint8_t* buf,
    size_t bytes,
    int root,
    const transport::MessageTag& tag,
    const Deadline& deadline);

} // namespace smddp::algorithm
