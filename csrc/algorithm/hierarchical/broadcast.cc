#include "algorithm/hierarchical/broadcast.h"

#include "algorithm/protocol.h"

namespace smddp::algorithm::hierarchical {

void broadcast(Stages& s, const OpArgs& args) {
  const topology::Topology& topo = s.topo();
  const int root_node = topo.nodeOf(args.root);
  const int root_local = topo.localRankOf(args.root);
  auto* out = static_cast<uint8_t*>(args.out);
  const size_t b = args.count * args.elemSize();
  if (topo.rank() == args.root) {
    copyBytes(out, args.in, b);
  }
  if (topo.numNodes() > 1 && topo.myLocalRank() == root_local) {
    s.runRail([&] {
      ringBroadcast(s.railRing(args, RailOn::kCaller), out, b, root_node, protocol::tagOf(args), args.deadline);
    });
  }
  OpArgs node_args = args;
  node_args.in = out;
  node_args.root = root_local;
  s.node().broadcast(node_args);
}

void barrier(Stages& s, const OpArgs& args) {
  s.node().barrier(args);
  if (s.topo().numNodes() > 1) {
    const auto N = static_cast<size_t>(s.topo().numNodes());
    s.runRail([&] {
      ringAllGather(s.railRing(args, RailOn::kCaller), nullptr, std::vector<size_t>(N, 0), std::vector<size_t>(N, 0),
                    protocol::tagOf(args), args.deadline);
    });
  }
  s.node().barrier(args);
}

} // namespace smddp::algorithm::hierarchical
