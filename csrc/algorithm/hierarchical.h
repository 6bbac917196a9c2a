// The hierarchical schedules: a node stage over the node's shared memory
// (single-copy reads of the peers' buffers) composed with the ring of the
// rail (the ranks with the same local rank, one per node) over sockets.
//
// Drawn for 2 nodes x 2 ranks; rank (node, local) = 0:(0,0) 1:(0,1)
// 2:(1,0) 3:(1,1); rails {0,2} and {1,3}; blocks a b c d of ranks 0..3.
//
//   AllGather, rails first:
//     rails   0<->2: a, c        1<->3: b, d          (sockets)
//     node    0<-1: b, d  1<-0: a, c  2<-3: b, d  3<-2: a, c   (shm)
//   ReduceScatter, node first (x_r is rank r's contribution to block x):
//     node    0: a0+a1, c0+c1   1: b0+b1, d0+d1   2: a2+a3, c2+c3   3: ...
//     rails   0<->2 exchange the partials of a and c: 0 ends with
//             (a2+a3)+(a0+a1), 2 with (c0+c1)+(c2+c3); likewise 1 and 3
//     (one stage after the other, by single-copy reads, rank 0 does not
//     write the partial a0+a1 to memory: the rail's last step reduces it
//     chunk by chunk through the cache and adds it to the received a2+a3)
//   AllReduce: node ReduceScatter of L slices, rail AllReduce of each
//     slice, node AllGather of the slices (through the staging slots for
//     messages up to a slot, by single-copy reads above).
//
// Pipelining: the rail stage runs on a thread of its own while the calling
// thread runs the node stage, chunk by chunk (SMDDP_CHUNK_BYTES):
//   AllGather      each chunk that lands from the rail is announced in the
//                  node arena (progress counter) and read by the node peers
//                  at once, while the rail moves the next.
//   ReduceScatter  each chunk of node partials is handed to the rail (an
//                  eventfd wakes it) as soon as it is reduced, in the order
//                  the rail ring consumes them.
//   AllReduce      both at once: the chunks of my slice go to the rail's
//                  ReduceScatter as they are reduced over the node, and the
//                  node peers read each chunk of the result as the rail's
//                  AllGather lands it (or, for my rail block, as its
//                  ReduceScatter ends). The rail sends the same messages
//                  as on the one-after-the-other path below, so rail peers
//                  on hosts that chose differently still agree.
// Small messages (one chunk per block, a rail's data up to 512K), and every
// message when the host's ranks outnumber its CPUs (the second thread has no
// core to overlap on), run both stages on the calling thread, one after the
// other: there the two thread hand-offs of the pipeline cost more than the
// overlap saves, and the node stage goes through the staging slots when
// single-copy reads do not pay (NodeCollectives::useSingleCopy).
// SMDDP_PIPELINE overrides the choice.
// Both paths reduce in the same order: the result does not depend on the
// path.
//
// Only inter-node traffic crosses sockets: each rank sends (N-1)/N of its
// rail's data instead of the flat ring's share of everyone's.
//
// Failures: the first error of either stage aborts the node arena (the node
// peers fail at once) and, from the backend, is sent to the rail peers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "algorithm/communicator.h"
#include "algorithm/node_collectives.h"
#include "algorithm/protocol.h"
#include "algorithm/reduce.h"
#include "algorithm/ring.h"
#include "transport/shm/node_arena.h"
#include "transport/socket/socket_mesh.h"

namespace smddp::algorithm {

// Where a rail stage runs. On the stage thread, beside a node stage, its
// waits also wake on the eventfd the node stage rings (a contribution
// handed over, or the node stage failed).
enum class RailOn : uint8_t { kCaller, kStageThread };

// A thread that runs one job at a time for its owner.
class StageThread {
 public:
  StageThread();
  ~StageThread();
  void start(std::function<void()> job);
  // Waits for the job; returns its exception, if any.
  std::exception_ptr join();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool has_job_ = false;
  bool busy_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

class HierarchicalCommunicator : public Communicator {
 public:
  // Requires a uniform topology and single-copy reads inside the node.
  HierarchicalCommunicator(
      Store& store,
      const topology::Topology& topology,
      const Config& config,
      const NetOptions& net,
      std::unique_ptr<transport::NodeArena> arena);
  ~HierarchicalCommunicator() override;

  void allGather(const OpArgs& args) override;
  void reduceScatter(const OpArgs& args) override;
  void allReduce(const OpArgs& args) override;
  void broadcast(const OpArgs& args) override;
  void barrier(const OpArgs& args) override;
  void abort(const std::string& why) override;
  void interrupt(const std::string& why) override;
  std::string describe() const override;

 private:
  Ring railRing(const OpArgs& args, RailOn on);
  // My position on the rail and how the rail's ring orders its blocks.
  protocol::RingOrder railOrder() const {
    return {topo_.myNode(), topo_.numNodes()};
  }
  // The chunk of the rail's AllGather and ReduceScatter for blocks of `b`
  // bytes of elements of `es` bytes, the same on every path (rail peers may
  // take different ones).
  size_t railChunk(size_t b, size_t es) const;
  // Byte offsets of my rail's blocks (of `b` bytes) in a rank-major buffer.
  std::vector<size_t> railOffsets(size_t b) const;
  // The rail stages: AllGather of my rail's blocks in args.out (mine already
  // there); ReduceScatter of `contrib` (block m: node m's) into args.out,
  // final.
  void railAllGather(
      const OpArgs& args,
      RailOn on,
      const std::function<void(uint64_t unit)>& on_landed = nullptr);
  void railReduceScatter(const OpArgs& args, const Contributions& contrib, Sources sources, RailOn on);
  // AllReduce of `count` elements over my rail, final, on this thread.
  void railAllReduce(const OpArgs& args, const void* in, void* out, size_t count, Sources sources);
  // Reserves the node partials (a block of `b` bytes per node) and
  // describes them as the rail's contributions.
  Contributions partialContributions(size_t b);
  // Runs the rail stage on the stage thread and `node_stage` here; the
  // first failure of either stops the other.
  void runStages(const std::function<void()>& rail_stage, const std::function<void()>& node_stage);
  void wakeRail();
  // The pipelined paths' first round: descriptors, with this rank's
  // progress base (returned), checked.
  uint32_t openProgressCall(const OpArgs& args);
  // A pipelined node stage hands the rail's ring ReduceScatter its
  // contributions in the order the ring consumes them (block n-1 first,
  // then n-2, ..., then n), `chunks` per block: railReadiness() starts a
  // call and says which are ready; handToRail(j, c) marks chunk c of the
  // j-th block in that order, and wakes the rail.
  std::function<bool(int block, size_t chunk)> railReadiness(size_t chunks);
  void handToRail(int j, size_t c, size_t chunks);
  void allGatherPipelined(const OpArgs& args);
  void reduceScatterPipelined(const OpArgs& args);
  void allReducePipelined(const OpArgs& args);
  void allGatherSequential(const OpArgs& args);
  void reduceScatterSequential(const OpArgs& args);
  // AllReduce of up to a slot, through the staging slots.
  void allReduceStaged(const OpArgs& args);
  // Whether a call with blocks of `block_bytes` runs sequentially.
  bool sequential(size_t block_bytes) const;
  // Runs a rail stage on this thread; its failure releases the node peers.
  void railStage(const std::function<void()>& stage);

  topology::Topology topo_;
  Config config_;
  std::unique_ptr<transport::NodeArena> arena_;
  std::unique_ptr<NodeCollectives> node_;
  std::unique_ptr<transport::SocketMesh> mesh_;
  std::vector<int> rail_;  // group ranks of my rail, by node
  transport::Channel* rail_next_ = nullptr;
  transport::Channel* rail_prev_ = nullptr;
  int wake_fd_ = -1;
  std::atomic<bool> cancel_{false};
  std::atomic<uint64_t> partials_ready_{0};
  HostBuffer partials_;
  HostBuffer ring_scratch_;
  std::vector<const void*> sources_;  // reduction sources, kept between calls
  StageThread stage_;
};

} // namespace smddp::algorithm
