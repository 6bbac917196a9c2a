// The flat ring over a whole group: members in group-rank order, each hop a
// shared-memory channel when both ends share a node (and SMDDP_SHM is on),
// a channel of the network between nodes otherwise. Used when asked for (SMDDP_ALGO=ring), when the
// topology is not uniform, and when hierarchical schedules cannot run.
//
// Drawn for 2 nodes x 2 ranks: 0 -shm-> 1 -tcp-> 2 -shm-> 3 -tcp-> 0.
// Every rank's data crosses the node boundary on its way around, which is
// what the hierarchical schedules avoid.
#pragma once

#include <memory>
#include <vector>

#include "algorithm/communicator.h"
#include "algorithm/ring.h"
#include "transport/network.h"
#include "transport/shm/node_arena.h"
#include "transport/shm/shm_channel.h"

namespace smddp::algorithm {

class RingCommunicator : public Communicator {
 public:
  // `network` reaches the other nodes; `arena` (optional) is the node's
  // arena, for the hops inside the node.
  RingCommunicator(
      Store& store,
      const topology::Topology& topology,
      const Config& config,
      std::unique_ptr<transport::Network> network,
      std::unique_ptr<transport::NodeArena> arena,
      const std::string& why);

  void allGather(const OpArgs& args) override;
  void reduceScatter(const OpArgs& args) override;
  void allReduce(const OpArgs& args) override;
  void broadcast(const OpArgs& args) override;
  void barrier(const OpArgs& args) override;
  void abort(const std::string& why) override;
  void interrupt(const std::string& why) override;
  std::string describe() const override;

 private:
  Ring ringFor(const OpArgs& args) const;

  topology::Topology topo_;
  Config config_;
  std::string why_;
  std::unique_ptr<transport::NodeArena> arena_;
  std::unique_ptr<transport::Network> network_;
  std::unique_ptr<transport::Mesh> mesh_;
  std::unique_ptr<transport::ShmChannel> shm_next_;
  std::unique_ptr<transport::ShmChannel> shm_prev_;
  transport::Channel* next_ = nullptr;
  transport::Channel* prev_ = nullptr;
  HostBuffer scratch_;
};

} // namespace smddp::algorithm
