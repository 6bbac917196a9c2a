// What the hierarchical collectives share: the node's arena and its
// collectives (the node stage), the rail's channels of the network between
// nodes (the rail stage),
// the thread that runs the rail beside the node, the hand-off between them,
// and the scratch kept between calls.
//
// A call runs its two stages one of two ways (sequential(), the same on
// every rank of a node, see tuning.h):
//   pipelined   runPipelined(): the rail stage on the stage thread while the
//               calling thread runs the node stage, chunk by chunk. The node
//               stage hands contributions to the rail's ReduceScatter in the
//               order the ring consumes them (railReadiness, handToRail; an
//               eventfd wakes the rail), and learns of the chunks a node
//               peer's rail landed from the peer's progress counter
//               (protocol::ProgressUnits, counted from the base that
//               startCall publishes).
//   sequential  runRail(): both on the calling thread, one after the other.
// The rail sends the same messages either way.
//
// Threading: one call at a time, from the group's executor thread; during
// runPipelined() the rail stage runs on the stage thread and touches only
// what the call gives it, the rail's channels and the ring scratch.
// interrupt() may be called from any thread.
//
// Failures: the first error of either stage aborts the node arena (the node
// peers fail at once rather than at their timeout) and stops the other
// stage; the error that explains the failure is the one rethrown.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithm/communicator.h"
#include "algorithm/hierarchical/stage_thread.h"
#include "algorithm/node_collectives.h"
#include "algorithm/protocol.h"
#include "algorithm/reduce.h"
#include "algorithm/ring.h"
#include "common/host_buffer.h"
#include "transport/network.h"
#include "transport/shm/node_arena.h"

namespace smddp::algorithm::hierarchical {

// Where a rail stage runs. On the stage thread, beside a node stage, its
// waits also wake on the eventfd the node stage rings (a contribution
// handed over, or the node stage failed).
enum class RailOn : uint8_t { kCaller, kStageThread };

class Stages {
 public:
  // Requires a uniform topology and single-copy reads inside the node.
  // Collective over the group (the rail's connections over `network`).
  Stages(
      Store& store,
      const topology::Topology& topology,
      const Config& config,
      std::unique_ptr<transport::Network> network,
      std::unique_ptr<transport::NodeArena> arena);
  ~Stages();
  Stages(const Stages&) = delete;
  Stages& operator=(const Stages&) = delete;

  const topology::Topology& topo() const {
    return topo_;
  }
  const Config& config() const {
    return config_;
  }
  transport::NodeArena& arena() {
    return *arena_;
  }
  NodeCollectives& node() {
    return *node_;
  }
  const transport::Network& network() const {
    return *network_;
  }
  // Group ranks of my rail, by node.
  const std::vector<int>& rail() const {
    return rail_;
  }
  // My position on the rail and how the rail's ring orders its blocks.
  protocol::RingOrder railOrder() const {
    return {topo_.myNode(), topo_.numNodes()};
  }

  // ------------------------------------------------------------ the rail

  Ring railRing(const OpArgs& args, RailOn on);
  // The chunk of the rail's AllGather and ReduceScatter for blocks of `b`
  // bytes of elements of `es` bytes (tuning::kRailChunks), the same on every
  // path (rail peers may take different ones).
  size_t railChunk(size_t b, size_t es) const;
  // Byte offsets of my rail's blocks (of `b` bytes) in a rank-major buffer.
  std::vector<size_t> railOffsets(size_t b) const;
  // AllGather of my rail's blocks in args.out: mine already there, or sent
  // from `own` and copied into place as the rail runs (ringAllGather).
  void railAllGather(
      const OpArgs& args,
      RailOn on,
      const std::function<void(uint64_t unit)>& on_landed = nullptr,
      const uint8_t* own = nullptr);
  // ReduceScatter of `contrib` (block m: node m's) into args.out, final.
  void railReduceScatter(const OpArgs& args, const Contributions& contrib, Sources sources, RailOn on);
  // AllReduce of `count` elements over my rail, final, on this thread.
  void railAllReduce(const OpArgs& args, const void* in, void* out, size_t count, Sources sources);
  // The scratch of the rail's ring (received partials), kept between calls.
  HostBuffer* ringScratch() {
    return &ring_scratch_;
  }

  // ------------------------------------------------------------ the node

  // Reserves the node partials (a block of `b` bytes per node) and
  // describes them as the rail's contributions.
  Contributions partialContributions(size_t b);
  uint8_t* partials() {
    return partials_.data();
  }
  // A reusable array of `n` reduction sources.
  std::vector<const void*>& sources(int n) {
    sources_.assign(static_cast<size_t>(n), nullptr);
    return sources_;
  }

  // ------------------------------------------------------------ running

  // Whether a call with rail blocks of `block_bytes` runs its stages one
  // after the other (tuning::kSequentialBytes, SMDDP_PIPELINE).
  bool sequential(size_t block_bytes) const;
  // Runs `stage` (rail work) on this thread; its failure releases the node
  // peers.
  void runRail(const std::function<void()>& stage);
  // Runs `rail_stage` on the stage thread and `node_stage` here; the first
  // failure of either stops the other.
  void runPipelined(const std::function<void()>& rail_stage, const std::function<void()>& node_stage);
  // A call's first round, when nothing else goes with it: publishes this
  // rank's descriptor, waits for every node peer's and checks that they
  // agree (kMismatch). Returns this rank's progress base.
  uint32_t startCall(const OpArgs& args, protocol::Path path);
  // The node stage hands the rail's ReduceScatter its contributions in the
  // order the ring consumes them (protocol::RingOrder::consumedAt), `chunks`
  // per block: railReadiness() starts a call and says which are ready;
  // handToRail(j, c) marks chunk c of the j-th block in that order, and
  // wakes the rail.
  std::function<bool(int block, size_t chunk)> railReadiness(size_t chunks);
  void handToRail(int j, size_t c, size_t chunks);

  // ------------------------------------------------------------ failures

  void abort(const std::string& why);
  void interrupt(const std::string& why);

 private:
  void wakeRail();

  topology::Topology topo_;
  Config config_;
  std::unique_ptr<transport::NodeArena> arena_;
  std::unique_ptr<NodeCollectives> node_;
  std::unique_ptr<transport::Network> network_;
  std::unique_ptr<transport::Mesh> mesh_;
  std::vector<int> rail_;
  transport::Channel* rail_next_ = nullptr;
  transport::Channel* rail_prev_ = nullptr;
  int wake_fd_ = -1;
  std::atomic<bool> cancel_{false};
  std::atomic<uint64_t> partials_ready_{0};
  HostBuffer partials_;
  HostBuffer ring_scratch_;
  std::vector<const void*> sources_;
  StageThread stage_;
};

} // namespace smddp::algorithm::hierarchical
