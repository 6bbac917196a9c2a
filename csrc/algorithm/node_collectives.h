// Collectives among the ranks of one node, over the node's shared-memory
// arena: the flat schedules of a single node and the node-local stage of the
// hierarchical ones.
//
// Two data paths, chosen per call from the message size and SMDDP_SINGLE_COPY
// (the same choice on every rank):
//
//  staged       each rank copies its data into its own slot of the arena,
//               everybody reads the slots; two slots per rank (by round
//               parity) let the next round's writes overlap this round's
//               reads. No system calls: best for small messages.
//  single-copy  each rank publishes the addresses of its buffers and the
//               others read them directly with process_vm_readv (one copy
//               instead of two); a last round keeps the buffers alive until
//               every reader is done.
//
// Schedules, drawn for one node of 2 ranks (A, B), blocks a and b:
//
//   AllGather  staged:       A: a -> slot A        B: b -> slot B
//                            A: slot B -> out[1]   B: slot A -> out[0]
//              single-copy:  A: read B's b -> out[1], B: read A's a -> out[0]
//   ReduceScatter (rank r keeps block r, reduced in rank order 0,1,...):
//              staged:       each rank stages chunk t of every block; rank r
//                            reduces sub-chunk r of every slot
//              single-copy:  rank r reads block r of every peer's input and
//                            reduces it with its own, chunk by chunk
//   AllReduce  staged:       each rank stages a chunk, every rank reduces all
//                            slots in rank order (identical on every rank)
//              single-copy:  ReduceScatter into the output, a round, then
//                            AllGather of the reduced slices from the peers'
//                            outputs
//
// Every call starts with a round that publishes the rank's call descriptor
// (protocol::openCall); each rank compares every peer's with its own and
// throws kMismatch (on every rank) if they differ (protocol::verifyCall).
// The reduction order is always local rank 0, 1, ..., so results are
// bitwise identical on every rank and every run.
//
// Threading: driven by one thread at a time (the group's executor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "algorithm/op.h"
#include "algorithm/reduce.h"
#include "common/config.h"
#include "common/host_buffer.h"
#include "transport/shm/node_arena.h"

namespace smddp::algorithm {

class NodeCollectives {
 public:
  NodeCollectives(transport::NodeArena& arena, const Config& config);

  int localRank() const {
    return arena_.localRank();
  }
  int localSize() const {
    return arena_.localSize();
  }

  void allGather(const OpArgs& args);
  void reduceScatter(const OpArgs& args);
  void allReduce(const OpArgs& args);
  void broadcast(const OpArgs& args);
  void barrier(const OpArgs& args);

  // Whether a call moving `bytes_per_rank` takes the single-copy path.
  // With SMDDP_SINGLE_COPY=auto: from the configured size, and at least `floor`.
  bool useSingleCopy(size_t bytes_per_rank, size_t floor = 0) const;
  size_t singleCopyMinBytes() const;
  // Whether an AllReduce of `bytes` (the whole tensor) takes it.
  bool useSingleCopyForAllReduce(size_t bytes) const;

  // The building blocks, public for the hierarchical schedules that run a
  // node stage of their own (after protocol::openCall).

  // Posts a round and waits for every peer to post it.
  void round(const Deadline& deadline);
  // Reduces `n` elements at byte `offset_bytes` of every rank's input (peers
  // read through single-copy from the address in their descriptor) into
  // dst, in local rank order. With `extra` (n elements of a partial result
  // from elsewhere, not inputs): dst = extra (+) that sum, rounded to the
  // dtype first, exactly as a ring step would combine a received partial
  // with the node's; only this last step gives `result`. dst may be my_in +
  // offset_bytes.
  void reduceFromPeers(
      const OpArgs& args,
      const uint8_t* my_in,
      size_t offset_bytes,
      size_t n,
      void* dst,
      Sources sources,
      Result result,
      const void* extra = nullptr);
  // Staged ReduceScatter of the inputs in which every local rank takes
  // `blocks` blocks: block m of local rank j starts at element
  // block_of(j, m) * args.count of each input. Reduces my blocks, in local
  // rank order, into dst (block m at element m * args.count). After
  // protocol::openCall(); verifies the descriptors.
  void reduceScatterStagedBlocks(
      const OpArgs& args,
      int blocks,
      const std::function<size_t(int rank, int block)>& block_of,
      uint8_t* dst,
      Result result);

 private:
  void allGatherStaged(const OpArgs& args);
  void allGatherSingleCopy(const OpArgs& args);
  void reduceScatterStaged(const OpArgs& args);
  void reduceScatterSingleCopy(const OpArgs& args);
  void allReduceStaged(const OpArgs& args);
  void allReduceSingleCopy(const OpArgs& args);

  uint8_t* scratch(size_t bytes);
  // A reusable array of `n` source pointers (no allocation per call).
  std::vector<const void*>& sourcePointers(int n) {
    sources_.assign(static_cast<size_t>(n), nullptr);
    return sources_;
  }

  transport::NodeArena& arena_;
  const Config config_;
  HostBuffer scratch_;
  std::vector<const void*> sources_;
};

} // namespace smddp::algorithm
