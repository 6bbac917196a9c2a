// Revoking the node peers' mappings of a rank's memory before it is freed
// (transport/shm/revocations.h), in forked processes over a real node arena:
// revoke() returns only after every peer's close ran; a peer that serves no
// more (teardown) or has exited does not hold the owner up; a peer that does
// not answer makes revoke() return false at its deadline, naming it.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "algorithm/node_collectives.h"
#include "harness.h"
#include "transport/shm/node_arena.h"
#include "transport/shm/revocations.h"

using namespace smddp;
using test::iota;
using algorithm::NodeCollectives;
using algorithm::OpArgs;
using transport::NodeArena;
using transport::RevokeBox;
using transport::Revocations;

namespace {

RevokeBox* boxOf(NodeArena& arena, int l) {
  return reinterpret_cast<RevokeBox*>(arena.slot(l, 0));
}

void barrier(NodeCollectives& node) {
  OpArgs a;
  a.kind = CollectiveKind::kBarrier;
  a.deadline = Deadline::after(std::chrono::seconds(20));
  node.barrier(a);
}

using Clock = std::chrono::steady_clock;

} // namespace

SMDDP_TEST(revoke_returns_only_after_every_peer_closed) {
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(3, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    NodeArena arena(store, "arena", rank, iota(3), test::smallSlots());
    NodeCollectives node(arena, Config::fromEnv([](const char*) -> const char* { return nullptr; }));
    std::vector<std::pair<int, uint64_t>> closed;
    std::mutex mu;
    {
      Revocations r(arena, [&](int l) { return boxOf(arena, l); }, [&](int owner, uint64_t id) {
        std::this_thread::sleep_for(std::chrono::milliseconds(rank == 2 ? 300 : 50));
        std::lock_guard<std::mutex> lock(mu);
        closed.emplace_back(owner, id);
      });
      barrier(node);
      if (rank == 0) {
        for (uint64_t id : {41u, 42u}) {
          const auto t0 = Clock::now();
          std::string late;
          EXPECT_TRUE(r.revoke(id, Deadline::after(std::chrono::seconds(10)), &late));
          // Rank 2 takes 300 ms to close: the owner may not go on before.
          EXPECT_TRUE(Clock::now() - t0 >= std::chrono::milliseconds(290));
        }
      }
      barrier(node);
    }
    std::lock_guard<std::mutex> lock(mu);
    if (rank == 0) {
      EXPECT_TRUE(closed.empty());
    } else {
      EXPECT_TRUE((closed == std::vector<std::pair<int, uint64_t>>{{0, 41}, {0, 42}}));
    }
    barrier(node);
  });
}

SMDDP_TEST(a_peer_that_holds_nothing_or_exited_does_not_hold_the_owner_up) {
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(
      3,
      [&](int rank) {
        ::smddp::test::DirStore store(dir);
        NodeArena arena(store, "arena", rank, iota(3), test::smallSlots());
        NodeCollectives node(arena, Config::fromEnv([](const char*) -> const char* { return nullptr; }));
        auto box = [&](int l) { return boxOf(arena, l); };
        if (rank == 1) {
          // Torn down: closed all it mapped, serves no more.
          { Revocations r(arena, box, [](int, uint64_t) {}); }
          barrier(node);
          while (!arena.peerExited(0)) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
          return;
        }
        if (rank == 2) {
          barrier(node);
          _exit(0);  // exits without a word
        }
        Revocations r(arena, box, [](int, uint64_t) {});
        barrier(node);
        while (!arena.peerExited(2)) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        const auto t0 = Clock::now();
        std::string late;
        EXPECT_TRUE(r.revoke(7, Deadline::after(std::chrono::seconds(10)), &late));
        EXPECT_TRUE(Clock::now() - t0 < std::chrono::seconds(2));
      },
      std::chrono::seconds(60), [](int rank) { return rank == 2; });
}

SMDDP_TEST(a_peer_that_does_not_serve_is_named_at_the_deadline) {
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(2, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    NodeArena arena(store, "arena", rank, iota(2), test::smallSlots());
    NodeCollectives node(arena, Config::fromEnv([](const char*) -> const char* { return nullptr; }));
    if (rank == 1) {
      // Alive, but no service thread: nothing closes its mappings.
      barrier(node);
      barrier(node);
      return;
    }
    Revocations r(arena, [&](int l) { return boxOf(arena, l); }, [](int, uint64_t) {});
    barrier(node);
    const auto t0 = Clock::now();
    std::string late;
    EXPECT_TRUE(!r.revoke(9, Deadline::after(std::chrono::milliseconds(300)), &late));
    EXPECT_TRUE(Clock::now() - t0 < std::chrono::seconds(3));
    EXPECT_EQ(late, std::string("local rank 1 (rank 1)"));
    barrier(node);
  });
}

SMDDP_TEST(a_peer_behind_a_timed_out_revocation_still_closes_each_allocation) {
  // The owner gives up on a slow peer and revokes the next allocation: the
  // peer must close both, each once, in order.
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(2, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    NodeArena arena(store, "arena", rank, iota(2), test::smallSlots());
    NodeCollectives node(arena, Config::fromEnv([](const char*) -> const char* { return nullptr; }));
    std::vector<uint64_t> closed;
    std::mutex mu;
    {
      Revocations r(arena, [&](int l) { return boxOf(arena, l); }, [&](int, uint64_t id) {
        std::lock_guard<std::mutex> lock(mu);
        if (closed.empty()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(400));
        }
        closed.push_back(id);
      });
      barrier(node);
      if (rank == 0) {
        std::string late;
        EXPECT_TRUE(!r.revoke(5, Deadline::after(std::chrono::milliseconds(100)), &late));
        EXPECT_TRUE(r.revoke(6, Deadline::after(std::chrono::seconds(10)), &late));
      }
      barrier(node);
    }
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(rank == 0 ? closed.empty() : (closed == std::vector<uint64_t>{5, 6}));
    barrier(node);
  });
}
