#include "algorithm/protocol.h"

#include <new>
#include <string>

#include "common/error.h"

namespace smddp::algorithm::protocol {

transport::MessageTag tagOf(const OpArgs& args) {
  transport::MessageTag t;
  t.seq = args.seq;
  t.kind = args.kind;
  t.dtype = args.dtype();
  const bool reduces = args.kind == CollectiveKind::kAllReduce || args.kind == CollectiveKind::kReduceScatter;
  t.redop = reduces ? args.reduce.op : ReduceOp::kSum;
  t.root = args.kind == CollectiveKind::kBroadcast ? args.root : 0;
  t.count = args.count;
  return t;
}

const char* pathName(Path path) {
  switch (path) {
    case Path::kStaged:
      return "staged";
    case Path::kSingleCopy:
      return "single-copy";
    case Path::kDevice:
      return "device";
  }
  return "unknown path";
}

CallDesc& myCall(transport::NodeArena& arena, uint64_t seq) {
  // The slot's bytes hold a CallDesc (an implicit-lifetime type) from the
  // moment the arena's control block exists.
  return *std::launder(reinterpret_cast<CallDesc*>(arena.myDesc(seq).bytes));
}

const CallDesc& peerCall(const transport::NodeArena& arena, int l, uint64_t seq) {
  return *std::launder(reinterpret_cast<const CallDesc*>(arena.peerDesc(l, seq).bytes));
}

void openCall(transport::NodeArena& arena, const OpArgs& args, Path path) {
  CallDesc& d = myCall(arena, args.seq);
  d.tag = tagOf(args);
  d.path = path;
  d.in_addr = reinterpret_cast<uint64_t>(args.in);
  d.out_addr = reinterpret_cast<uint64_t>(args.out);
  d.progress_base = arena.progress();
}

void verifyCall(const transport::NodeArena& arena, const OpArgs& args) {
  const CallDesc& mine = peerCall(arena, arena.localRank(), args.seq);
  bool differ = false;
  for (int l = 0; l < arena.localSize(); ++l) {
    const CallDesc& p = peerCall(arena, l, args.seq);
    differ = differ || !p.tag.sameCall(mine.tag) || p.path != mine.path;
  }
  if (!differ) {
    return;
  }
  std::string calls;
  for (int l = 0; l < arena.localSize(); ++l) {
    const CallDesc& p = peerCall(arena, l, args.seq);
    calls += str("; rank ", arena.groupRankOf(l), ": #", p.tag.seq, " ", p.tag.describe(), " ", pathName(p.path));
  }
  SMDDP_THROW(
      kMismatch,
      "ranks disagree on collective #",
      args.seq,
      calls,
      ". Every rank of a group must make the same collective calls in the "
      "same order, with the same sizes, dtypes and reduce ops (and the same "
      "SMDDP_* settings)");
}

} // namespace smddp::algorithm::protocol
