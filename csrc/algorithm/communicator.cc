#include "algorithm/communicator.h"

#include "algorithm/node_collectives.h"
#include "common/error.h"
#include "common/log.h"
#include "transport/shm/node_arena.h"

namespace smddp::algorithm {

namespace {

transport::WaitPolicy waitPolicy(const Config& config) {
  transport::WaitPolicy p;
  p.spin_us = config.spin_us;
  return p;
}

// One node: the flat schedules over the node's shared memory.
class NodeCommunicator : public Communicator {
 public:
  NodeCommunicator(
      Store& store,
      const topology::Topology& topo,
      const Config& config,
      std::chrono::milliseconds timeout)
      : topo_(topo) {
    transport::NodeArena::Options o;
    o.slot_bytes = config.shm_slot_bytes;
    o.wait = waitPolicy(config);
    o.timeout = timeout;
    arena_ = std::make_unique<transport::NodeArena>(
        store, str("smddp/arena/", topo.myNode()), topo.myLocalRank(),
        topo.nodeRanks(topo.myNode()), o);
    node_ = std::make_unique<NodeCollectives>(*arena_, config);
  }

  void allGather(const OpArgs& args) override {
    node_->allGather(args);
  }
  void reduceScatter(const OpArgs& args) override {
    node_->reduceScatter(args);
  }
  void allReduce(const OpArgs& args) override {
    node_->allReduce(args);
  }
  void broadcast(const OpArgs& args) override {
    OpArgs a = args;
    a.root = topo_.localRankOf(args.root);
    node_->broadcast(a);
  }
  void barrier(const OpArgs& args) override {
    node_->barrier(args);
  }
  void abort(const std::string& why) override {
    arena_->abort(why);
  }
  std::string describe() const override {
    return str(
        "shm", arena_->singleCopyAvailable() ? "+single-copy" : "", ", ",
        topo_.describe());
  }

 private:
  topology::Topology topo_;
  std::unique_ptr<transport::NodeArena> arena_;
  std::unique_ptr<NodeCollectives> node_;
};

} // namespace

std::unique_ptr<Communicator> createCommunicator(
    Store& store,
    const topology::Topology& topology,
    const Config& config,
    std::chrono::milliseconds timeout) {
  if (topology.numNodes() == 1 && config.shm) {
    return std::make_unique<NodeCommunicator>(store, topology, config, timeout);
  }
  return nullptr;
}

} // namespace smddp::algorithm
