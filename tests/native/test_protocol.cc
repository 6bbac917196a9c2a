// The cross-rank protocol (algorithm/protocol.h) and the chunking every rank
// computes alike (algorithm/chunks.h): the tag of a call, the descriptor a
// rank publishes in its node arena and the check of it (every path by name,
// the device path included), and the orders the ring schedules move blocks
// in, checked against real rings over shared-memory channels, so that the
// stages that count in those orders (progress units, hand-offs to the
// rail) name the chunks the ring really moves.
#include <algorithm>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "algorithm/chunks.h"
#include "algorithm/protocol.h"
#include "algorithm/ring.h"
#include "harness.h"
#include "transport/shm/node_arena.h"
#include "transport/shm/shm_channel.h"

using namespace smddp;
using test::iota;
using test::smallSlots;
using algorithm::OpArgs;
using algorithm::protocol::CallDesc;
using algorithm::protocol::Path;
using algorithm::protocol::ProgressUnits;
using algorithm::protocol::RingOrder;
using algorithm::protocol::RingUnit;
using transport::NodeArena;

namespace {

OpArgs call(CollectiveKind kind, size_t count, uint64_t seq) {
  OpArgs a;
  a.kind = kind;
  a.reduce = {DataType::kBFloat16, ReduceOp::kMax, 1.0, 1.0};
  a.count = count;
  a.root = 3;
  a.seq = seq;
  a.deadline = Deadline::after(std::chrono::seconds(10));
  return a;
}

uint8_t pattern(int block, size_t i) {
  return static_cast<uint8_t>(block * 37 + static_cast<int>(i % 251));
}

} // namespace

SMDDP_TEST(tag_names_what_matters_to_the_call) {
  const auto tag = [](CollectiveKind kind) { return algorithm::protocol::tagOf(call(kind, 12, 5)); };
  for (CollectiveKind kind : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                              CollectiveKind::kAllReduce, CollectiveKind::kBroadcast, CollectiveKind::kBarrier}) {
    const transport::MessageTag t = tag(kind);
    EXPECT_EQ(t.seq, uint64_t{5});
    EXPECT_TRUE(t.kind == kind);
    EXPECT_TRUE(t.dtype == DataType::kBFloat16);
    EXPECT_EQ(t.count, uint64_t{12});
    const bool reduces = kind == CollectiveKind::kReduceScatter || kind == CollectiveKind::kAllReduce;
    EXPECT_TRUE(t.redop == (reduces ? ReduceOp::kMax : ReduceOp::kSum));
    EXPECT_EQ(t.root, kind == CollectiveKind::kBroadcast ? 3 : 0);
  }
  // A reduce op or root that does not matter to the call does not make two
  // ranks disagree.
  OpArgs a = call(CollectiveKind::kAllGather, 12, 5);
  OpArgs b = a;
  b.reduce.op = ReduceOp::kMin;
  b.root = 1;
  EXPECT_TRUE(algorithm::protocol::tagOf(a).sameCall(algorithm::protocol::tagOf(b)));
  b.count = 13;
  EXPECT_TRUE(!algorithm::protocol::tagOf(a).sameCall(algorithm::protocol::tagOf(b)));
}

SMDDP_TEST(paths_have_names) {
  EXPECT_EQ(std::string(algorithm::protocol::pathName(Path::kStaged)), std::string("staged"));
  EXPECT_EQ(std::string(algorithm::protocol::pathName(Path::kSingleCopy)), std::string("single-copy"));
  EXPECT_EQ(std::string(algorithm::protocol::pathName(Path::kDevice)), std::string("device"));
  EXPECT_EQ(static_cast<int>(Path::kDevice), 2);
}

// openCall publishes the tag, the path, the addresses and the progress
// counter at the time, in the slot of the call's parity; the other parity's
// descriptor (a previous call's, which a peer may still read) is untouched.
SMDDP_TEST(open_call_publishes_the_descriptor) {
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(1, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    NodeArena arena(store, "arena", rank, iota(1), smallSlots());
    std::vector<uint8_t> in(4), out(4);
    OpArgs a = call(CollectiveKind::kAllReduce, 4, 6);
    a.in = in.data();
    a.out = out.data();
    arena.postProgress(41);
    algorithm::protocol::openCall(arena, a, Path::kDevice);
    const CallDesc& d = algorithm::protocol::peerCall(arena, 0, 6);
    EXPECT_TRUE(&d == &algorithm::protocol::myCall(arena, 6));
    EXPECT_TRUE(d.tag.sameCall(algorithm::protocol::tagOf(a)));
    EXPECT_TRUE(d.path == Path::kDevice);
    EXPECT_EQ(d.in_addr, reinterpret_cast<uint64_t>(in.data()));
    EXPECT_EQ(d.out_addr, reinterpret_cast<uint64_t>(out.data()));
    EXPECT_EQ(d.progress_base, uint32_t{41});
    const CallDesc& other = algorithm::protocol::peerCall(arena, 0, 7);
    EXPECT_EQ(other.in_addr, uint64_t{0});
    EXPECT_EQ(other.progress_base, uint32_t{0});
    EXPECT_TRUE(other.path == Path::kStaged);
    algorithm::protocol::verifyCall(arena, a);  // alone, it agrees with itself
  });
}

// Ranks whose paths differ (here one on the device path) fail alike, and the
// message names each rank's call and path.
SMDDP_TEST(verify_call_names_every_rank_and_path) {
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(2, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    NodeArena arena(store, "arena", rank, iota(2), smallSlots());
    OpArgs a = call(CollectiveKind::kAllGather, 8, 0);
    algorithm::protocol::openCall(arena, a, rank == 0 ? Path::kStaged : Path::kDevice);
    arena.post();
    arena.waitAllPhase(arena.phase(), a.deadline);
    EXPECT_THROWS(algorithm::protocol::verifyCall(arena, a), kMismatch,
                  "rank 0: #0 allgather(bfloat16, 8 elements) staged; rank 1: #0 allgather(bfloat16, 8 elements) "
                  "device");
    // The same call on the same path agrees.
    OpArgs b = call(CollectiveKind::kAllGather, 8, 1);
    algorithm::protocol::openCall(arena, b, Path::kSingleCopy);
    arena.post();
    arena.waitAllPhase(arena.phase(), b.deadline);
    algorithm::protocol::verifyCall(arena, b);
  });
}

SMDDP_TEST(chunks_and_slices) {
  EXPECT_EQ(algorithm::chunkCount(0, 64), size_t{1});
  EXPECT_EQ(algorithm::chunkCount(64, 64), size_t{1});
  EXPECT_EQ(algorithm::chunkCount(65, 64), size_t{2});
  EXPECT_EQ(algorithm::chunkLen(0, 64, 0), size_t{0});
  EXPECT_EQ(algorithm::chunkLen(65, 64, 0), size_t{64});
  EXPECT_EQ(algorithm::chunkLen(65, 64, 1), size_t{1});
  EXPECT_EQ(algorithm::chunkLen(65, 64, 2), size_t{0});
  EXPECT_EQ(algorithm::mod(-1, 3), 2);
  EXPECT_EQ(algorithm::mod(4, 3), 1);
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{12}}) {
    const algorithm::Slices s{count, 5};
    size_t next = 0;
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(s.begin(i), next);
      EXPECT_TRUE(s.size(i) >= s.size(4) && s.size(i) <= s.size(0));
      next += s.size(i);
    }
    EXPECT_EQ(next, count);
  }
}

// Every order visits every block once: an AllGather brings every other
// block, a ReduceScatter consumes every contribution and the own last; the
// progress units of a node name each chunk of each rail block once, the own
// block's first.
SMDDP_TEST(ring_orders_visit_every_block_once) {
  for (int n = 1; n <= 5; ++n) {
    for (int r = 0; r < n; ++r) {
      const RingOrder o{r, n};
      std::set<int> gathered;
      for (int s = 0; s + 1 < n; ++s) {
        gathered.insert(o.gatheredAt(s));
      }
      EXPECT_EQ(gathered.size(), static_cast<size_t>(n - 1));
      EXPECT_TRUE(gathered.count(r) == 0);
      std::set<int> consumed;
      for (int j = 0; j < n; ++j) {
        consumed.insert(o.consumedAt(j));
        EXPECT_EQ(o.consumeOrder(o.consumedAt(j)), j);
      }
      EXPECT_EQ(consumed.size(), static_cast<size_t>(n));
      EXPECT_EQ(o.consumedAt(n - 1), r);
      const size_t chunks = 3;
      const ProgressUnits units{o, chunks};
      std::set<std::pair<int, size_t>> seen;
      for (uint64_t u = 0; u < units.count(); ++u) {
        const RingUnit unit = units.at(u);
        if (u < chunks) {
          EXPECT_EQ(unit.block, r);
        } else {
          const RingUnit landed = o.landed(u - chunks, chunks);
          EXPECT_EQ(unit.block, landed.block);
          EXPECT_EQ(unit.chunk, landed.chunk);
        }
        seen.insert({unit.block, unit.chunk});
      }
      EXPECT_EQ(seen.size(), static_cast<size_t>(n) * chunks);
    }
  }
  EXPECT_EQ(algorithm::protocol::progressAfter(0xFFFFFFFFu, 2), uint32_t{1});  // wraps like the counter
}

// A real ring AllGather of 3 members over shared-memory channels: when it
// reports unit u landed, the chunk RingOrder::landed(u) names is in place;
// a ring ReduceScatter asks for its contributions block by block in
// RingOrder::consumedAt order.
SMDDP_TEST(ring_schedules_move_blocks_in_ring_order) {
  constexpr int kN = 3;
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(kN, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    NodeArena arena(store, "arena", rank, iota(kN), smallSlots());
    const int next = (rank + 1) % kN;
    const int prev = (rank + kN - 1) % kN;
    transport::ShmChannel to_next(arena, next, next);
    transport::ShmChannel from_prev(arena, prev, prev);
    algorithm::Ring ring;
    ring.index = rank;
    ring.size = kN;
    ring.next = &to_next;
    ring.prev = &from_prev;
    ring.chunk_bytes = 64;
    ring.drive.what = [] { return std::string("ring peers"); };
    const RingOrder order{rank, kN};
    const Deadline dl = Deadline::after(std::chrono::seconds(20));

    // AllGather of blocks of 200 bytes: 4 chunks, the last of 8 bytes.
    const size_t b = 200;
    const size_t chunks = algorithm::chunkCount(b, ring.chunk_bytes);
    std::vector<uint8_t> out(kN * b, 0);
    std::vector<size_t> offsets, sizes(kN, b);
    for (int i = 0; i < kN; ++i) {
      offsets.push_back(static_cast<size_t>(i) * b);
    }
    for (size_t i = 0; i < b; ++i) {
      out[static_cast<size_t>(rank) * b + i] = pattern(rank, i);
    }
    uint64_t reported = 0;
    algorithm::ringAllGather(ring, out.data(), offsets, sizes, algorithm::protocol::tagOf(call(CollectiveKind::kAllGather, b, 0)),
                             dl, [&](uint64_t u) {
                               EXPECT_EQ(u, reported);
                               ++reported;
                               const RingUnit unit = order.landed(u, chunks);
                               const size_t at = unit.chunk * ring.chunk_bytes;
                               const size_t len = algorithm::chunkLen(b, ring.chunk_bytes, unit.chunk);
                               for (size_t i = at; i < at + len; ++i) {
                                 if (out[static_cast<size_t>(unit.block) * b + i] != pattern(unit.block, i)) {
                                   ::smddp::test::fail(__FILE__, __LINE__,
                                                       str("rank ", rank, ": unit ", u, " reported before block ",
                                                           unit.block, " chunk ", unit.chunk, " landed"));
                                   return;
                                 }
                               }
                             });
    EXPECT_EQ(reported, static_cast<uint64_t>(kN - 1) * chunks);
    for (int m = 0; m < kN; ++m) {
      for (size_t i = 0; i < b; ++i) {
        if (out[static_cast<size_t>(m) * b + i] != pattern(m, i)) {
          ::smddp::test::fail(__FILE__, __LINE__, str("rank ", rank, ": block ", m, " byte ", i));
          break;
        }
      }
    }

    // The same AllGather with my block sent from a separate input: the ring
    // also puts it in its place in the output (which starts without it).
    std::vector<uint8_t> mine(b), gathered(kN * b, 0);
    for (size_t i = 0; i < b; ++i) {
      mine[i] = pattern(rank, i);
    }
    algorithm::ringAllGather(ring, gathered.data(), offsets, sizes,
                             algorithm::protocol::tagOf(call(CollectiveKind::kAllGather, b, 1)), dl, nullptr,
                             mine.data());
    EXPECT_TRUE(gathered == out);

    // ReduceScatter of 50 floats per block: the order in which the ring
    // first asks for each block's contribution.
    const size_t count = 50;
    std::vector<float> in(kN * count, 1.f), res(count, 0.f);
    algorithm::Contributions contrib;
    contrib.base = reinterpret_cast<const uint8_t*>(in.data());
    for (int i = 0; i < kN; ++i) {
      contrib.offsets.push_back(static_cast<size_t>(i) * count * sizeof(float));
    }
    std::vector<int> asked;
    contrib.ready = [&](int block, size_t) {
      if (std::find(asked.begin(), asked.end(), block) == asked.end()) {
        asked.push_back(block);
      }
      return true;
    };
    HostBuffer scratch;
    algorithm::ringReduceScatter(ring, {DataType::kFloat32, ReduceOp::kSum}, contrib, res.data(),
                                 std::vector<size_t>(kN, count), algorithm::Sources::kInputs,
                                 algorithm::Result::kFinal,
                                 algorithm::protocol::tagOf(call(CollectiveKind::kReduceScatter, count, 2)), dl,
                                 &scratch);
    EXPECT_EQ(asked.size(), static_cast<size_t>(kN));
    for (size_t j = 0; j < asked.size(); ++j) {
      EXPECT_EQ(asked[j], order.consumedAt(static_cast<int>(j)));
    }
    EXPECT_EQ(res[0], static_cast<float>(kN));
    EXPECT_EQ(res[count - 1], static_cast<float>(kN));
  });
}
