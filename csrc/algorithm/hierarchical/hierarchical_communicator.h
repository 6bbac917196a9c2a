// The hierarchical schedules: a node stage over the node's shared memory
// (single-copy reads of the peers' buffers) composed with the ring of the
// rail (the ranks with the same local rank, one per node) over sockets.
//
// Drawn for 2 nodes x 2 ranks; rank (node, local) = 0:(0,0) 1:(0,1)
// 2:(1,0) 3:(1,1); rails {0,2} and {1,3}:
//
//     node 0:  0 ==shm== 1          AllGather      rails, then node
//              |         |          ReduceScatter  node, then rails
//             tcp       tcp         AllReduce      node ReduceScatter, rail
//              |         |                         AllReduce, node AllGather
//     node 1:  2 ==shm== 3          Broadcast      root's rail, then nodes
//
// Each collective draws its schedule in its own file (all_gather.h,
// reduce_scatter.h, all_reduce.h, broadcast.h); what they share, and how a
// call runs its stages pipelined on two threads or one after the other, is
// in stages.h; the policies that choose are in tuning.h. Both ways reduce
// in the same order: the result does not depend on the path.
//
// Only inter-node traffic crosses sockets: each rank sends (N-1)/N of its
// rail's data instead of the flat ring's share of everyone's.
//
// Threading and failures: as Communicator; the first error of either stage
// aborts the node arena (the node peers fail at once) and, from the
// backend, is sent to the rail peers (abort()).
#pragma once

#include <memory>
#include <string>

#include "algorithm/communicator.h"
#include "algorithm/hierarchical/stages.h"
#include "transport/shm/node_arena.h"

namespace smddp::algorithm {

class HierarchicalCommunicator : public Communicator {
 public:
  // Requires a uniform topology and single-copy reads inside the node;
  // `network` carries the rails.
  HierarchicalCommunicator(
      Store& store,
      const topology::Topology& topology,
      const Config& config,
      std::unique_ptr<transport::Network> network,
      std::unique_ptr<transport::NodeArena> arena);

  void allGather(const OpArgs& args) override;
  void reduceScatter(const OpArgs& args) override;
  void allReduce(const OpArgs& args) override;
  void broadcast(const OpArgs& args) override;
  void barrier(const OpArgs& args) override;
  void abort(const std::string& why) override;
  void interrupt(const std::string& why) override;
  std::string describe() const override;

 private:
  hierarchical::Stages stages_;
};

} // namespace smddp::algorithm
