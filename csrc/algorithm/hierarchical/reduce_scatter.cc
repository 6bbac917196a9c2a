#include "algorithm/hierarchical/reduce_scatter.h"

#include "algorithm/chunks.h"
#include "algorithm/protocol.h"

namespace smddp::algorithm::hierarchical {

using protocol::Path;

namespace {

void reduceScatterPipelined(Stages& s, const OpArgs& args) {
  const int N = s.topo().numNodes();
  const size_t es = args.elemSize();
  const size_t b = args.count * es;
  const size_t chunk = s.railChunk(b, es);
  const size_t C = chunkCount(b, chunk);
  const auto* in = static_cast<const uint8_t*>(args.in);

  s.startCall(args, Path::kSingleCopy);

  Contributions contrib = s.partialContributions(b);
  contrib.ready = s.railReadiness(C);

  auto rail_stage = [&] { s.railReduceScatter(args, contrib, Sources::kPartials, RailOn::kStageThread); };
  auto node_stage = [&] {
    for (int j = 0; j < N; ++j) {
      const int member = s.railOrder().consumedAt(j);
      const size_t block = static_cast<size_t>(s.rail()[member]) * b;
      for (size_t c = 0; c < C; ++c) {
        const size_t len = chunkLen(b, chunk, c);
        // PREMUL_SUM scales here; AVG divides at the rail's end.
        s.node().reduceFromPeers(args, in, block + c * chunk, len / es,
                                 s.partials() + static_cast<size_t>(member) * b + c * chunk, Sources::kInputs,
                                 Result::kPartial);
        s.handToRail(j, c, C);
      }
    }
  };
  s.runPipelined(rail_stage, node_stage);
  s.node().round(args.deadline);
}

void reduceScatterSequential(Stages& s, const OpArgs& args) {
  const topology::Topology& topo = s.topo();
  const int N = topo.numNodes();
  const int L = topo.localSize();
  const int me = topo.myLocalRank();
  const size_t es = args.elemSize();
  const size_t b = args.count * es;
  const auto* in = static_cast<const uint8_t*>(args.in);
  Contributions contrib = s.partialContributions(b);
  uint8_t* partials = s.partials();
  // Block m of local rank p's rail: the block of node m's local rank p.
  auto block = [&](int p, int m) {
    return static_cast<size_t>(topo.nodeRanks(m)[static_cast<size_t>(p)]);
  };
  // (Staging needs one element of every block in a slot.)
  const bool single = s.node().useSingleCopy(static_cast<size_t>(N) * b) ||
      static_cast<size_t>(L) * static_cast<size_t>(N) * es > s.arena().slotBytes();
  if (single) {
    s.startCall(args, Path::kSingleCopy);
    // Node stage: partial m = the node's contributions to block m of my
    // rail, reduced in local rank order (as the pipelined path does).
    const int n = topo.myNode();
    for (int m = 0; m < N; ++m) {
      if (m != n) {
        s.node().reduceFromPeers(args, in, block(me, m) * b, args.count, partials + static_cast<size_t>(m) * b,
                                 Sources::kInputs, Result::kPartial);
      }
    }
    // My own block skips the partial in memory: the rail's last step reduces
    // the node's inputs chunk by chunk, through the cache, and combines each
    // chunk with the other nodes' sum straight into the output, in the same
    // operations as with the partial (the same bits). No peer reads my block
    // of my input (an in-place output), but I read my block of theirs until
    // the rail ends: nobody returns before then.
    contrib.finish = [&](void* dst, const void* part, size_t offset, size_t count) {
      s.node().reduceFromPeers(args, in, block(me, n) * b + offset, count, dst, Sources::kInputs, Result::kFinal,
                               part);
    };
    s.runRail([&] { s.railReduceScatter(args, contrib, Sources::kPartials, RailOn::kCaller); });
    s.node().round(args.deadline);
    return;
  }
  protocol::openCall(s.arena(), args, Path::kStaged);
  s.node().reduceScatterStagedBlocks(args, N, block, partials, Result::kPartial);
  s.runRail([&] { s.railReduceScatter(args, contrib, Sources::kPartials, RailOn::kCaller); });
}

} // namespace

void reduceScatter(Stages& s, const OpArgs& args) {
  if (s.topo().numNodes() == 1) {
    s.node().reduceScatter(args);
    return;
  }
  const size_t b = args.count * args.elemSize();
  if (s.topo().localSize() == 1) {
    Contributions contrib;
    contrib.base = static_cast<const uint8_t*>(args.in);
    contrib.offsets = s.railOffsets(b);
    s.railReduceScatter(args, contrib, Sources::kInputs, RailOn::kCaller);
    return;
  }
  if (s.sequential(b)) {
    reduceScatterSequential(s, args);
  } else {
    reduceScatterPipelined(s, args);
  }
}

} // namespace smddp::algorithm::hierarchical
