#include "algorithm/node_collectives.h"

#include <algorithm>
#include <cstring>

#include "algorithm/chunks.h"
#include "algorithm/protocol.h"
#include "common/error.h"

namespace smddp::algorithm {

using protocol::Path;

namespace {

// The single-copy thresholds are the knobs' "auto" values (config.h,
// autos): a cross-memory read moves a block in one copy where the staging
// slots take two, but each read is a system call that pins the source pages,
// and pays from the size where the copy saved outweighs that fixed cost;
// where the host's ranks outnumber its CPUs the calls compete with the very
// peers a rank waits for (docs/design.md, "Where the time goes, as design
// rules"). The single-copy AllReduce takes three rounds to the staged
// path's one or two, so its slices must be larger still.
using autos::kAllReduceSingleCopyMinBytes;
using autos::kSingleCopyMinBytes;
using autos::kSingleCopyMinBytesOversubscribed;

// reduceFromPeers reads a chunk of every peer's data into scratch and
// reduces the chunks together: all of them fit in this budget, and none
// exceeds the upper bound, so that they are still in the L2 cache when
// reduced; none is under the lower bound, so that a read is long enough to
// amortise its system call.
constexpr size_t kPeerChunksBytes = size_t{1} << 20;
constexpr size_t kMinPeerChunkBytes = size_t{64} << 10;
constexpr size_t kMaxPeerChunkBytes = size_t{256} << 10;

// The staged AllReduce: every rank reducing the whole chunk repeats the
// other ranks' work but saves the round that gathers their slices. The
// repetition is accepted while the others' share of a round's chunk is at
// most this, and always at 2 ranks.
constexpr size_t kStagedSplitBytes = size_t{128} << 10;

} // namespace

NodeCollectives::NodeCollectives(transport::NodeArena& arena, const Config& config)
    : arena_(arena), config_(config) {}

bool NodeCollectives::useSingleCopy(size_t bytes_per_rank, size_t floor) const {
  if (localSize() < 2 || !arena_.singleCopyAvailable()) {
    return false;
  }
  switch (config_.single_copy) {
    case Tristate::kOn:
      return true;
    case Tristate::kOff:
      return false;
    default:
      return bytes_per_rank >= std::max(singleCopyMinBytes(), floor);
  }
}

size_t NodeCollectives::singleCopyMinBytes() const {
  if (config_.single_copy_min_bytes != kAutoBytes) {
    return config_.single_copy_min_bytes;
  }
  return config_.oversubscribed() ? kSingleCopyMinBytesOversubscribed : kSingleCopyMinBytes;
}

bool NodeCollectives::useSingleCopyForAllReduce(size_t bytes) const {
  return useSingleCopy(bytes / static_cast<size_t>(localSize()), kAllReduceSingleCopyMinBytes);
}

uint8_t* NodeCollectives::scratch(size_t bytes) {
  return scratch_.reserve(bytes);
}

void NodeCollectives::round(const Deadline& deadline) {
  arena_.post();
  arena_.waitAllPhase(arena_.phase(), deadline);
}

// ---------------------------------------------------------------- AllGather

void NodeCollectives::allGather(const OpArgs& args) {
  const size_t b = args.count * args.elemSize();
  if (localSize() == 1) {
    protocol::openCall(arena_, args, Path::kStaged);
    copyBytes(args.out, args.in, b);
    return;
  }
  if (useSingleCopy(b)) {
    allGatherSingleCopy(args);
  } else {
    allGatherStaged(args);
  }
}

void NodeCollectives::allGatherStaged(const OpArgs& args) {
  const size_t b = args.count * args.elemSize();
  const size_t slot = arena_.slotBytes();
  const size_t rounds = chunkCount(b, slot);
  const int me = localRank();
  const auto* in = static_cast<const uint8_t*>(args.in);
  auto* out = static_cast<uint8_t*>(args.out);
  protocol::openCall(arena_, args, Path::kStaged);
  for (size_t t = 0; t < rounds; ++t) {
    const size_t off = t * slot;
    const size_t n = chunkLen(b, slot, t);
    const uint32_t parity = arena_.phase() + 1;
    copyBytes(arena_.slot(me, parity), in + off, n);
    round(args.deadline);
    if (t == 0) {
      protocol::verifyCall(arena_, args);
    }
    for (int k = 0; k < localSize(); ++k) {
      const int l = (me + k) % localSize();
      uint8_t* dst = out + static_cast<size_t>(l) * b + off;
      const uint8_t* src = l == me ? in + off : arena_.slot(l, parity);
      if (dst != src) {
        copyBytes(dst, src, n);
      }
    }
  }
}

void NodeCollectives::allGatherSingleCopy(const OpArgs& args) {
  const size_t b = args.count * args.elemSize();
  const int me = localRank();
  auto* out = static_cast<uint8_t*>(args.out);
  protocol::openCall(arena_, args, Path::kSingleCopy);
  // Peers read only this rank's input: the own block can be placed while
  // they arrive.
  copyBytes(out + static_cast<size_t>(me) * b, args.in, b);
  round(args.deadline);
  protocol::verifyCall(arena_, args);
  for (int k = 1; k < localSize(); ++k) {
    const int l = (me + k) % localSize();
    arena_.readFrom(l, out + static_cast<size_t>(l) * b, protocol::peerCall(arena_, l, args.seq).in_addr, b);
  }
  // Nobody returns (and lets its input change) before every reader is done.
  round(args.deadline);
}

// ------------------------------------------------------------ ReduceScatter

void NodeCollectives::reduceScatter(const OpArgs& args) {
  const size_t b = args.count * args.elemSize();
  if (localSize() == 1) {
    protocol::openCall(arena_, args, Path::kStaged);
    copyBytes(args.out, args.in, b);
    finalizeInPlace(args.reduce, args.out, args.count, Sources::kInputs);
    return;
  }
  if (useSingleCopy(b)) {
    reduceScatterSingleCopy(args);
  } else {
    reduceScatterStaged(args);
  }
}

void NodeCollectives::reduceScatterStaged(const OpArgs& args) {
  protocol::openCall(arena_, args, Path::kStaged);
  reduceScatterStagedBlocks(
      args, 1, [](int j, int) { return static_cast<size_t>(j); }, static_cast<uint8_t*>(args.out), Result::kFinal);
}

void NodeCollectives::reduceScatterStagedBlocks(
    const OpArgs& args,
    int blocks,
    const std::function<size_t(int rank, int block)>& block_of,
    uint8_t* dst,
    Result result) {
  const size_t es = args.elemSize();
  const int L = localSize();
  const int me = localRank();
  const size_t B = static_cast<size_t>(blocks);
  // Each round stages the same sub-chunk of every destination's blocks.
  // Slot layout: [destination local rank][its block][chunk].
  const size_t chunk = std::max<size_t>(1, arena_.slotBytes() / (static_cast<size_t>(L) * B * es));
  const size_t rounds = chunkCount(args.count, chunk);
  const auto* in = static_cast<const uint8_t*>(args.in);
  std::vector<const void*>& srcs = sourcePointers(L);
  for (size_t t = 0; t < rounds; ++t) {
    const size_t off = t * chunk;
    const size_t n = chunkLen(args.count, chunk, t);
    const uint32_t parity = arena_.phase() + 1;
    uint8_t* mine = arena_.slot(me, parity);
    for (int j = 0; j < L; ++j) {
      for (int m = 0; m < blocks && j != me; ++m) {
        copyBytes(mine + (static_cast<size_t>(j) * B + static_cast<size_t>(m)) * chunk * es,
                  in + (block_of(j, m) * args.count + off) * es, n * es);
      }
    }
    round(args.deadline);
    if (t == 0) {
      protocol::verifyCall(arena_, args);
    }
    for (int m = 0; m < blocks; ++m) {
      for (int l = 0; l < L; ++l) {
        srcs[static_cast<size_t>(l)] = l == me
            ? in + (block_of(me, m) * args.count + off) * es
            : arena_.slot(l, parity) + (static_cast<size_t>(me) * B + static_cast<size_t>(m)) * chunk * es;
      }
      reduce(args.reduce, dst + (static_cast<size_t>(m) * args.count + off) * es, srcs.data(), L, n,
             Sources::kInputs, result);
    }
  }
}

void NodeCollectives::reduceFromPeers(
    const OpArgs& args,
    const uint8_t* my_in,
    size_t offset_bytes,
    size_t n,
    void* dst,
    Sources sources,
    Result result,
    const void* extra) {
  const size_t es = args.elemSize();
  const int L = localSize();
  const int me = localRank();
  const size_t per_peer =
      std::clamp<size_t>(kPeerChunksBytes / static_cast<size_t>(L - 1), kMinPeerChunkBytes, kMaxPeerChunkBytes);
  const size_t chunk = std::max<size_t>(1, per_peer / es);
  uint8_t* buf = scratch(static_cast<size_t>(L) * chunk * es);
  std::vector<const void*>& srcs = sourcePointers(L);
  // With `extra`, the node's sum goes through my own (unused) slot of the
  // scratch, still in the cache when the ring's two-operand step reads it.
  uint8_t* sum = buf + static_cast<size_t>(me) * chunk * es;
  auto* d = static_cast<uint8_t*>(dst);
  for (size_t off = 0; off < n; off += chunk) {
    const size_t m = std::min(chunk, n - off);
    const size_t byte_off = offset_bytes + off * es;
    for (int l = 0; l < L; ++l) {
      if (l == me) {
        srcs[l] = my_in + byte_off;
      } else {
        uint8_t* tmp = buf + static_cast<size_t>(l) * chunk * es;
        arena_.readFrom(l, tmp, protocol::peerCall(arena_, l, args.seq).in_addr + byte_off, m * es);
        srcs[l] = tmp;
      }
    }
    if (extra == nullptr) {
      reduce(args.reduce, d + off * es, srcs.data(), L, m, sources, result);
      continue;
    }
    reduce(args.reduce, sum, srcs.data(), L, m, sources, Result::kPartial);
    const void* pair[2] = {static_cast<const uint8_t*>(extra) + off * es, sum};
    reduce(args.reduce, d + off * es, pair, 2, m, Sources::kPartials, result);
  }
}

void NodeCollectives::reduceScatterSingleCopy(const OpArgs& args) {
  const size_t es = args.elemSize();
  const int me = localRank();
  protocol::openCall(arena_, args, Path::kSingleCopy);
  round(args.deadline);
  protocol::verifyCall(arena_, args);
  reduceFromPeers(
      args,
      static_cast<const uint8_t*>(args.in),
      static_cast<size_t>(me) * args.count * es,
      args.count,
      args.out,
      Sources::kInputs,
      Result::kFinal);
  round(args.deadline);
}

// ---------------------------------------------------------------- AllReduce

void NodeCollectives::allReduce(const OpArgs& args) {
  const size_t b = args.count * args.elemSize();
  if (localSize() == 1) {
    protocol::openCall(arena_, args, Path::kStaged);
    copyBytes(args.out, args.in, b);
    finalizeInPlace(args.reduce, args.out, args.count, Sources::kInputs);
    return;
  }
  if (useSingleCopyForAllReduce(b)) {
    allReduceSingleCopy(args);
  } else {
    allReduceStaged(args);
  }
}

void NodeCollectives::allReduceStaged(const OpArgs& args) {
  const size_t es = args.elemSize();
  const int L = localSize();
  const int me = localRank();
  const size_t chunk = arena_.slotBytes() / es;
  const size_t rounds = chunkCount(args.count, chunk);
  const auto* in = static_cast<const uint8_t*>(args.in);
  auto* out = static_cast<uint8_t*>(args.out);
  std::vector<const void*>& srcs = sourcePointers(L);
  const bool split = L > 2 && static_cast<size_t>(L - 1) * std::min(args.count, chunk) * es >
      kStagedSplitBytes;
  protocol::openCall(arena_, args, Path::kStaged);
  for (size_t t = 0; t < rounds; ++t) {
    const size_t off = t * chunk;
    const size_t n = chunkLen(args.count, chunk, t);
    const uint32_t parity = arena_.phase() + 1;
    copyBytes(arena_.slot(me, parity), in + off * es, n * es);
    round(args.deadline);
    if (t == 0) {
      protocol::verifyCall(arena_, args);
    }
    if (!split) {
      // Every rank reduces the same slots in the same order: identical results.
      for (int l = 0; l < L; ++l) {
        srcs[l] = arena_.slot(l, parity);
      }
      reduce(args.reduce, out + off * es, srcs.data(), L, n, Sources::kInputs, Result::kFinal);
      continue;
    }
    // Rank l reduces slice l (in the same order as above, so the results do
    // not depend on the path) into its slot of the other parity, which no one
    // reads before the next round; then everyone gathers the slices. The
    // input slots are next written only after the next round, when every
    // rank has finished reading them.
    const Slices slices{n, static_cast<size_t>(L)};
    for (int l = 0; l < L; ++l) {
      srcs[l] = arena_.slot(l, parity) + slices.begin(me) * es;
    }
    reduce(args.reduce, arena_.slot(me, parity + 1) + slices.begin(me) * es, srcs.data(), L,
           slices.size(me), Sources::kInputs, Result::kFinal);
    round(args.deadline);
    for (int k = 0; k < L; ++k) {
      const int l = (me + k) % L;
      copyBytes(out + (off + slices.begin(l)) * es, arena_.slot(l, parity + 1) + slices.begin(l) * es,
                slices.size(l) * es);
    }
  }
}

void NodeCollectives::allReduceSingleCopy(const OpArgs& args) {
  const size_t es = args.elemSize();
  const int L = localSize();
  const int me = localRank();
  const Slices slices{args.count, static_cast<size_t>(L)};
  auto* out = static_cast<uint8_t*>(args.out);
  protocol::openCall(arena_, args, Path::kSingleCopy);
  round(args.deadline);
  protocol::verifyCall(arena_, args);
  // Reduce my slice from every rank's input into my output.
  reduceFromPeers(
      args,
      static_cast<const uint8_t*>(args.in),
      slices.begin(me) * es,
      slices.size(me),
      out + slices.begin(me) * es,
      Sources::kInputs,
      Result::kFinal);
  // Inputs may alias outputs: nobody overwrites other slices before every
  // rank has finished reading its inputs.
  round(args.deadline);
  for (int k = 1; k < L; ++k) {
    const int l = (me + k) % L;
    arena_.readFrom(
        l,
        out + slices.begin(l) * es,
        protocol::peerCall(arena_, l, args.seq).out_addr + slices.begin(l) * es,
        slices.size(l) * es);
  }
  round(args.deadline);
}

// ---------------------------------------------------------- Broadcast, Barrier

void NodeCollectives::broadcast(const OpArgs& args) {
  const size_t b = args.count * args.elemSize();
  const int me = localRank();
  auto* out = static_cast<uint8_t*>(args.out);
  if (localSize() == 1) {
    protocol::openCall(arena_, args, Path::kStaged);
    copyBytes(args.out, args.in, b);
    return;
  }
  if (useSingleCopy(b)) {
    protocol::openCall(arena_, args, Path::kSingleCopy);
    round(args.deadline);
    protocol::verifyCall(arena_, args);
    if (me == args.root) {
      copyBytes(out, args.in, b);
    } else {
      arena_.readFrom(args.root, out, protocol::peerCall(arena_, args.root, args.seq).in_addr, b);
    }
    round(args.deadline);
    return;
  }
  const size_t slot = arena_.slotBytes();
  const size_t rounds = chunkCount(b, slot);
  const auto* in = static_cast<const uint8_t*>(args.in);
  protocol::openCall(arena_, args, Path::kStaged);
  for (size_t t = 0; t < rounds; ++t) {
    const size_t off = t * slot;
    const size_t n = chunkLen(b, slot, t);
    const uint32_t parity = arena_.phase() + 1;
    if (me == args.root) {
      copyBytes(arena_.slot(me, parity), in + off, n);
    }
    round(args.deadline);
    if (t == 0) {
      protocol::verifyCall(arena_, args);
    }
    if (me == args.root) {
      if (out + off != in + off) {
        copyBytes(out + off, in + off, n);
      }
    } else {
      copyBytes(out + off, arena_.slot(args.root, parity), n);
    }
  }
}

void NodeCollectives::barrier(const OpArgs& args) {
  protocol::openCall(arena_, args, Path::kStaged);
  if (localSize() == 1) {
    return;
  }
  round(args.deadline);
  protocol::verifyCall(arena_, args);
}

} // namespace smddp::algorithm
