#include "algorithm/communicator.h"

#include "algorithm/hierarchical/hierarchical_communicator.h"
#include "algorithm/node_collectives.h"
#include "algorithm/ring_communicator.h"
#include "common/error.h"
#include "common/log.h"
#include "transport/shm/node_arena.h"

namespace smddp::algorithm {

transport::WaitPolicy waitPolicyOf(const Config& config) {
  // With more ranks than cores, a spinning waiter keeps the core from the
  // very peer it waits for: yield at once, and for longer.
  const bool oversubscribed = config.oversubscribed();
  transport::WaitPolicy p;
  p.spin_us =
      config.spin_us >= 0 ? config.spin_us : (oversubscribed ? autos::kSpinUsOversubscribed : autos::kSpinUs);
  p.yield_us =
      config.yield_us >= 0 ? config.yield_us : (oversubscribed ? autos::kYieldUsOversubscribed : autos::kYieldUs);
  return p;
}

namespace {

// One node: the flat schedules over the node's shared memory.
class NodeCommunicator : public Communicator {
 public:
  NodeCommunicator(const topology::Topology& topo, const Config& config, std::unique_ptr<transport::NodeArena> arena)
      : topo_(topo), arena_(std::move(arena)), node_(std::make_unique<NodeCollectives>(*arena_, config)) {}

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
  void interrupt(const std::string& why) override {
    arena_->abort(why);
  }
  std::string describe() const override {
    return str("shm", arena_->singleCopyAvailable() ? "+single-copy" : "", ", ", topo_.describe());
  }

 private:
  topology::Topology topo_;
  std::unique_ptr<transport::NodeArena> arena_;
  std::unique_ptr<NodeCollectives> node_;
};

std::unique_ptr<transport::NodeArena> makeArena(
    Store& store,
    const topology::Topology& topo,
    const Config& config,
    std::chrono::milliseconds timeout) {
  transport::NodeArena::Options o;
  o.slot_bytes = config.shm_slot_bytes;
  o.slot_setting = "SMDDP_SHM_SLOT_BYTES";
  o.wait = waitPolicyOf(config);
  o.timeout = timeout;
  return std::make_unique<transport::NodeArena>(
      store, str("smddp/arena/", topo.myNode()), topo.myLocalRank(), topo.nodeRanks(topo.myNode()), o);
}

} // namespace

std::unique_ptr<Communicator> createCommunicator(
    Store& store,
    const topology::Topology& topology,
    const Config& config,
    const NetOptions& net,
    std::chrono::milliseconds timeout) {
  NetOptions n = net;
  n.timeout = timeout;
  const bool multi_node = topology.numNodes() > 1;
  if (!config.shm) {
    return std::make_unique<RingCommunicator>(
        store, topology, config, transport::createNetwork(config, n), nullptr, "SMDDP_SHM=0");
  }
  std::string why;
  if (config.algo == Algo::kRing) {
    why = "SMDDP_ALGO=ring";
  } else if (!topology.uniform()) {
    why = str("the topology is not uniform (", topology.describe(), ")");
  }
  // Every rank must choose the same schedule: hierarchical needs single-copy
  // transfers on every node, which the ranks learn from each other below.
  const bool ask_nodes = multi_node && why.empty();
  const std::string kHierOk = "smddp/hier-ok";
  const std::string kArenasMade = "smddp/arenas-made";
  std::unique_ptr<transport::NodeArena> arena;
  try {
    arena = makeArena(store, topology, config, timeout);
  } catch (const Error& e) {
    // The other nodes wait for this rank below (for its answer, or at the
    // barrier before the flat ring's sockets): they get its failure
    // instead (a full /dev/shm on one host), not the timeout.
    try {
      if (ask_nodes) {
        storeAllGatherFailed(store, kHierOk, topology.rank(), e.what());
      } else if (multi_node) {
        storeBarrier(store, kArenasMade, topology.size(),
                     str("rank ", topology.rank(), " could not set up the group: ", e.what()));
      }
    } catch (const std::exception&) {
      // Telling them failed too: this rank's own error is the one to raise.
    }
    throw;
  }
  if (!multi_node) {
    return std::make_unique<NodeCommunicator>(topology, config, std::move(arena));
  }
  if (!ask_nodes) {
    const std::string failed = storeBarrier(store, kArenasMade, topology.size());
    if (!failed.empty()) {
      SMDDP_THROW(kComm, failed);
    }
  } else {
    auto all = storeAllGather(
        store, kHierOk, topology.rank(), topology.size(),
        {static_cast<uint8_t>(arena->singleCopyAvailable() ? 1 : 0)});
    for (int r = 0; r < topology.size() && why.empty(); ++r) {
      if (all[static_cast<size_t>(r)].empty() || all[static_cast<size_t>(r)][0] != 1) {
        why = str("single-copy transfers are unavailable on the node of rank ", r,
                  " (cross-memory attach refused; is ptrace restricted?)");
      }
    }
  }
  if (!why.empty()) {
    if (config.algo == Algo::kHierarchical && topology.rank() == 0) {
      SMDDP_LOG(kWarn, "SMDDP_ALGO=hierarchical cannot be honoured: ", why, "; using the flat ring");
    } else if (topology.rank() == 0 && config.algo != Algo::kRing) {
      SMDDP_LOG(kWarn, "using the flat ring: ", why);
    }
    return std::make_unique<RingCommunicator>(
        store, topology, config, transport::createNetwork(config, n), std::move(arena), why);
  }
  return std::make_unique<HierarchicalCommunicator>(
      store, topology, config, transport::createNetwork(config, n), std::move(arena));
}

} // namespace smddp::algorithm
