#include "algorithm/hierarchical/all_reduce.h"

#include <algorithm>

#include "algorithm/chunks.h"
#include "algorithm/protocol.h"

namespace smddp::algorithm::hierarchical {

using protocol::Path;

namespace {

void allReducePipelined(Stages& s, const OpArgs& args) {
  const topology::Topology& topo = s.topo();
  transport::NodeArena& arena = s.arena();
  const int N = topo.numNodes();
  const auto Nz = static_cast<size_t>(N);
  const int L = topo.localSize();
  const int l = topo.myLocalRank();
  const size_t es = args.elemSize();
  const Slices slices{args.count, static_cast<size_t>(L)};
  const auto* in = static_cast<const uint8_t*>(args.in);
  auto* out = static_cast<uint8_t*>(args.out);
  const size_t my_begin = slices.begin(static_cast<size_t>(l)) * es;
  uint8_t* mine = out + my_begin;
  // My slice as the rail ring sees it: N sub-slices, the ring's blocks.
  const Slices sub{slices.size(static_cast<size_t>(l)), Nz};
  std::vector<size_t> counts(Nz);
  std::vector<size_t> offsets(Nz);
  std::vector<size_t> sizes(Nz);
  for (size_t m = 0; m < Nz; ++m) {
    counts[m] = sub.size(m);
    offsets[m] = sub.begin(m) * es;
    sizes[m] = counts[m] * es;
  }
  // Chunks as the ring cuts them: its ReduceScatter in whole elements, its
  // AllGather in bytes.
  const size_t rs_chunk = std::max<size_t>(1, s.config().chunk_bytes / es) * es;
  const size_t rs_chunks = chunkCount(sizes[0], rs_chunk);
  const size_t ag_chunk = s.config().chunk_bytes;

  const uint32_t base = s.startCall(args, Path::kSingleCopy);

  // The node stage reduces my slice into place, the rail's contributions.
  Contributions contrib;
  contrib.base = mine;
  contrib.offsets = offsets;
  contrib.ready = s.railReadiness(rs_chunks);

  // Progress units, as every rank of the node counts them for its own
  // slice: the chunks of its rail block (final when the rail's
  // ReduceScatter returns), then the chunks of the AllGather as they land.
  auto rail_stage = [&] {
    const Ring ring = s.railRing(args, RailOn::kStageThread);
    const transport::MessageTag tag = protocol::tagOf(args);
    ringReduceScatter(ring, args.reduce, contrib, mine + offsets[static_cast<size_t>(topo.myNode())], counts,
                      Sources::kPartials, Result::kFinal, tag, args.deadline, s.ringScratch());
    const size_t own = chunkCount(sizes[0], ag_chunk);
    arena.postProgress(protocol::progressAfter(base, own));
    ringAllGather(ring, mine, offsets, sizes, tag, args.deadline,
                  [&](uint64_t u) { arena.postProgress(protocol::progressAfter(base, own + u + 1)); });
  };

  auto node_stage = [&] {
    for (int j = 0; j < N; ++j) {
      const auto m = static_cast<size_t>(s.railOrder().consumedAt(j));
      for (size_t c = 0; c < rs_chunks; ++c) {
        const size_t len = chunkLen(sizes[m], rs_chunk, c);
        const size_t off = offsets[m] + c * rs_chunk;
        if (len > 0) {
          // PREMUL_SUM scales here; AVG divides at the rail's end.
          s.node().reduceFromPeers(args, in, my_begin + off, len / es, mine + off, Sources::kInputs,
                                   Result::kPartial);
        }
        s.handToRail(j, c, rs_chunks);
      }
    }
    // Each peer's slice, unit by unit as its rail finalizes it. Reading a
    // unit of peer p into my output also waits until p has read its slice
    // of my input (which an in-place call overwrites here): p reduced all
    // of it before its rail could end its ReduceScatter.
    struct Peer {
      int local;
      size_t begin;
      Slices sub;
      protocol::ProgressUnits units;
      uint32_t base;
      uint64_t addr;
    };
    std::vector<Peer> peers;
    uint64_t units = 0;
    for (int k = 1; k < L; ++k) {
      const int p = (l + k) % L;
      const Slices ps{slices.size(static_cast<size_t>(p)), Nz};
      const protocol::CallDesc& d = protocol::peerCall(arena, p, args.seq);
      // Of p's slice (p is on node n too, so on the same rail position).
      const protocol::ProgressUnits pu{s.railOrder(), chunkCount(ps.size(0) * es, ag_chunk)};
      peers.push_back({p, slices.begin(static_cast<size_t>(p)) * es, ps, pu, d.progress_base, d.out_addr});
      units = std::max<uint64_t>(units, pu.count());
    }
    for (uint64_t u = 0; u < units; ++u) {
      for (const Peer& p : peers) {
        if (u >= p.units.count()) {
          continue;
        }
        const protocol::RingUnit unit = p.units.at(u);
        const auto m = static_cast<size_t>(unit.block);
        arena.waitProgress(p.local, protocol::progressAfter(p.base, u + 1), args.deadline);
        const size_t len = chunkLen(p.sub.size(m) * es, ag_chunk, unit.chunk);
        if (len > 0) {
          const size_t off = p.begin + p.sub.begin(m) * es + unit.chunk * ag_chunk;
          arena.readFrom(p.local, out + off, p.addr + off, len);
        }
      }
    }
  };
  s.runPipelined(rail_stage, node_stage);
  // Nobody returns while a peer may still read its output.
  s.node().round(args.deadline);
}

// Up to a slot, through the staging slots.
void allReduceStaged(Stages& s, const OpArgs& args) {
  transport::NodeArena& arena = s.arena();
  const int L = s.topo().localSize();
  const int me = s.topo().myLocalRank();
  const size_t es = args.elemSize();
  const Slices slices{args.count, static_cast<size_t>(L)};
  const size_t begin = slices.begin(static_cast<size_t>(me)) * es;
  protocol::openCall(arena, args, Path::kStaged);
  const uint32_t parity = arena.phase() + 1;
  copyBytes(arena.slot(me, parity), args.in, args.count * es);
  s.node().round(args.deadline);
  protocol::verifyCall(arena, args);
  // My slice, reduced over the node in local rank order (as the single-copy
  // path does), into my slot of the other parity: no peer reads it before
  // the next round, and it is next written after the round that follows.
  std::vector<const void*>& srcs = s.sources(L);
  for (int l = 0; l < L; ++l) {
    srcs[static_cast<size_t>(l)] = arena.slot(l, parity) + begin;
  }
  uint8_t* mine = arena.slot(me, parity + 1) + begin;
  const size_t count = slices.size(static_cast<size_t>(me));
  reduce(args.reduce, mine, srcs.data(), L, count, Sources::kInputs, Result::kPartial);
  s.runRail([&] { s.railAllReduce(args, mine, mine, count, Sources::kPartials); });
  s.node().round(args.deadline);
  auto* out = static_cast<uint8_t*>(args.out);
  for (int k = 0; k < L; ++k) {
    const int l = (me + k) % L;
    const size_t off = slices.begin(static_cast<size_t>(l)) * es;
    copyBytes(out + off, arena.slot(l, parity + 1) + off, slices.size(static_cast<size_t>(l)) * es);
  }
}

} // namespace

void allReduce(Stages& s, const OpArgs& args) {
  const topology::Topology& topo = s.topo();
  transport::NodeArena& arena = s.arena();
  const int N = topo.numNodes();
  const int L = topo.localSize();
  if (N == 1) {
    s.node().allReduce(args);
    return;
  }
  if (L == 1) {
    s.railAllReduce(args, args.in, args.out, args.count, Sources::kInputs);
    return;
  }
  const size_t b = args.count * args.elemSize();
  if (b <= arena.slotBytes() && !s.node().useSingleCopyForAllReduce(b)) {
    allReduceStaged(s, args);
    return;
  }
  const int l = topo.myLocalRank();
  const size_t es = args.elemSize();
  const Slices slices{args.count, static_cast<size_t>(L)};
  // The rail's blocks are the N sub-slices of a slice (the first the largest).
  const size_t rail_block = Slices{slices.size(0), static_cast<size_t>(N)}.size(0) * es;
  if (!s.sequential(rail_block)) {
    allReducePipelined(s, args);
    return;
  }
  auto* out = static_cast<uint8_t*>(args.out);
  const size_t my_begin = slices.begin(static_cast<size_t>(l)) * es;
  const size_t my_count = slices.size(static_cast<size_t>(l));
  uint8_t* mine = out + my_begin;

  s.startCall(args, Path::kSingleCopy);
  // Node stage: my slice, reduced over the node (PREMUL_SUM scales here).
  s.node().reduceFromPeers(args, static_cast<const uint8_t*>(args.in), my_begin, my_count, mine, Sources::kInputs,
                           Result::kPartial);
  // Rail stage: my slice, reduced over the nodes.
  s.runRail([&] { s.railAllReduce(args, mine, mine, my_count, Sources::kPartials); });
  // Every rank has read the inputs (which may be the outputs) and finished
  // its slice: gather the slices.
  s.node().round(args.deadline);
  for (int k = 1; k < L; ++k) {
    const int peer = (l + k) % L;
    const size_t off = slices.begin(static_cast<size_t>(peer)) * es;
    arena.readFrom(peer, out + off, protocol::peerCall(arena, peer, args.seq).out_addr + off,
                   slices.size(static_cast<size_t>(peer)) * es);
  }
  s.node().round(args.deadline);
}

} // namespace smddp::algorithm::hierarchical
