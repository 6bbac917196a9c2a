#include "algorithm/hierarchical/all_gather.h"

#include <algorithm>

#include "algorithm/chunks.h"
#include "algorithm/hierarchical/tuning.h"
#include "algorithm/protocol.h"

namespace smddp::algorithm::hierarchical {

using protocol::Path;

namespace {

// Visits bytes [from, from + n) of the concatenation of blocks of `b` bytes
// each: f(block, offset in the block, offset in the range, length).
template <class F>
void forEachPiece(size_t from, size_t n, size_t b, F f) {
  for (size_t pos = from; pos < from + n;) {
    const size_t k = pos / b;
    const size_t w = pos % b;
    const size_t len = std::min(b - w, from + n - pos);
    f(k, w, pos - from, len);
    pos += len;
  }
}

void allGatherPipelined(Stages& s, const OpArgs& args) {
  const topology::Topology& topo = s.topo();
  transport::NodeArena& arena = s.arena();
  const int L = topo.localSize();
  const int l = topo.myLocalRank();
  const size_t b = args.count * args.elemSize();
  const size_t chunk = s.railChunk(b, 1);
  const size_t C = chunkCount(b, chunk);
  const protocol::ProgressUnits units{s.railOrder(), C};
  auto* out = static_cast<uint8_t*>(args.out);
  const auto* in = static_cast<const uint8_t*>(args.in);

  // Round A: descriptors (output address, progress base), checked.
  const uint32_t base = s.startCall(args, Path::kSingleCopy);

  // Units, in the order every rank announces them: its own block's chunks,
  // which the peers read from its input (so they are announced at once, and
  // the rail sends them from there too, while it copies them into place),
  // then the rail's chunks as they land.
  arena.postProgress(protocol::progressAfter(base, C));
  auto rail_stage = [&] {
    s.railAllGather(
        args, RailOn::kStageThread,
        [&](uint64_t u) { arena.postProgress(protocol::progressAfter(base, C + u + 1)); }, in);
  };

  auto node_stage = [&] {
    for (uint64_t u = 0; u < units.count(); ++u) {
      const protocol::RingUnit unit = units.at(u);
      const size_t len = chunkLen(b, chunk, unit.chunk);
      for (int k = 1; k < L; ++k) {
        const int peer = (l + k) % L;
        const protocol::CallDesc& d = protocol::peerCall(arena, peer, args.seq);
        arena.waitProgress(peer, protocol::progressAfter(d.progress_base, u + 1), args.deadline);
        const size_t off = static_cast<size_t>(topo.nodeRanks(unit.block)[peer]) * b + unit.chunk * chunk;
        const uint64_t src = u < C ? d.in_addr + unit.chunk * chunk : d.out_addr + off;
        arena.readFrom(peer, out + off, src, len);
      }
    }
  };

  s.runPipelined(rail_stage, node_stage);
  // Nobody returns while a peer may still read its output.
  s.node().round(args.deadline);
}

void allGatherSequential(Stages& s, const OpArgs& args) {
  const topology::Topology& topo = s.topo();
  transport::NodeArena& arena = s.arena();
  const int N = topo.numNodes();
  const int L = topo.localSize();
  const int me = topo.myLocalRank();
  const size_t b = args.count * args.elemSize();
  const size_t total = static_cast<size_t>(N) * b;
  auto* out = static_cast<uint8_t*>(args.out);
  // Local rank p ends the rail stage with the blocks of its rail: block k
  // of p's rail is the one of node k's local rank p.
  auto block = [&](int p, size_t k) {
    return static_cast<size_t>(topo.nodeRanks(static_cast<int>(k))[static_cast<size_t>(p)]) * b;
  };
  const bool single = s.node().useSingleCopy(total);
  // The node agrees on the call before anyone waits on the rail: a rank
  // whose call differs (and so may take the pipelined path, which starts
  // with this round) must meet a kMismatch, not a wait on the rail.
  s.startCall(args, single ? Path::kSingleCopy : Path::kStaged);
  uint8_t* my_block = out + static_cast<size_t>(topo.rank()) * b;
  if (single) {
    // Push, not pull: each chunk of my block and of my rail's blocks goes to
    // every node peer right after this rank has read or received it, while
    // it is still in cache; a peer pulling it after the rail would read it
    // from memory.
    const size_t chunk = s.railChunk(b, 1);
    auto push = [&](size_t off, const uint8_t* src, size_t len) {
      for (int k = 1; k < L; ++k) {
        const int peer = (me + k) % L;
        arena.writeTo(peer, protocol::peerCall(arena, peer, args.seq).out_addr + off, src, len);
      }
    };
    const size_t C = chunkCount(b, chunk);
    const size_t mine = static_cast<size_t>(topo.rank()) * b;
    const auto* in = static_cast<const uint8_t*>(args.in);
    s.runRail([&] {
      const size_t piece = std::min<size_t>(chunk, tuning::kPushPieceBytes);
      for (size_t off = 0; off < b; off += piece) {
        const size_t len = std::min(piece, b - off);
        if (my_block != args.in) {
          copyBytes(my_block + off, in + off, len);
        }
        push(mine + off, in + off, len);
      }
      s.railAllGather(args, RailOn::kCaller, [&](uint64_t u) {
        const protocol::RingUnit unit = s.railOrder().landed(u, C);
        const size_t off = block(me, static_cast<size_t>(unit.block)) + unit.chunk * chunk;
        push(off, out + off, chunkLen(b, chunk, unit.chunk));
      });
    });
    // Every peer's pushes into my output have landed.
    s.node().round(args.deadline);
    return;
  }
  s.runRail([&] { s.railAllGather(args, RailOn::kCaller, nullptr, static_cast<const uint8_t*>(args.in)); });
  // Staged: each rank's rail blocks, packed, through its slot.
  const size_t slot = arena.slotBytes();
  const size_t rounds = chunkCount(total, slot);
  for (size_t t = 0; t < rounds; ++t) {
    const size_t off = t * slot;
    const size_t n = chunkLen(total, slot, t);
    const uint32_t parity = arena.phase() + 1;
    uint8_t* mine = arena.slot(me, parity);
    forEachPiece(off, n, b, [&](size_t k, size_t w, size_t at, size_t len) {
      copyBytes(mine + at, out + block(me, k) + w, len);
    });
    s.node().round(args.deadline);
    for (int k = 1; k < L; ++k) {
      const int peer = (me + k) % L;
      const uint8_t* theirs = arena.slot(peer, parity);
      forEachPiece(off, n, b, [&](size_t m, size_t w, size_t at, size_t len) {
        copyBytes(out + block(peer, m) + w, theirs + at, len);
      });
    }
  }
}

} // namespace

void allGather(Stages& s, const OpArgs& args) {
  const topology::Topology& topo = s.topo();
  if (topo.numNodes() == 1) {
    s.node().allGather(args);
    return;
  }
  const size_t b = args.count * args.elemSize();
  if (topo.localSize() == 1) {
    s.railAllGather(args, RailOn::kCaller, nullptr, static_cast<const uint8_t*>(args.in));
    return;
  }
  if (s.sequential(b)) {
    allGatherSequential(s, args);
  } else {
    allGatherPipelined(s, args);
  }
}

} // namespace smddp::algorithm::hierarchical
