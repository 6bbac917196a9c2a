// A host model of the memory-operation synchronization (SMDDP_CUDA_SYNC=memops,
// algorithm/memop_sync_protocol.h): threads play a node's ranks and run the
// very operations their streams would (memOpSteps), a write as a fenced
// release store and a wait as a bounded acquire poll, filling and reading
// each other's stages. A rank must see only the current exchange's data, a
// zero-copy step must end only when its peers have read this rank's tensor,
// the flags must be back at rest after every exchange (what lets a graph
// replay the same constants), and the release writes must carry a rank whose
// peer never comes through any number of exchanges.
#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "algorithm/memop_sync_protocol.h"
#include "harness.h"

using namespace smddp;
using algorithm::cuda::MemOp;
using algorithm::cuda::MemOpFlags;
using algorithm::cuda::MemOpSteps;
using algorithm::cuda::memOpSteps;
using algorithm::kMaxDeviceSources;

namespace {

constexpr int kCells = 64;
constexpr auto kWaitBound = std::chrono::seconds(20);

std::atomic_ref<uint32_t> word(uint32_t* p) {
  return std::atomic_ref<uint32_t>(*p);
}

// Runs `ops` as a stream would; false if a wait outlived kWaitBound (a
// protocol that deadlocks fails instead of hanging the test).
bool run(const std::vector<MemOp>& ops) {
  for (const MemOp& op : ops) {
    if (op.kind == MemOp::Kind::kWrite) {
      std::atomic_thread_fence(std::memory_order_seq_cst);
      word(op.word).store(op.value, std::memory_order_release);
      continue;
    }
    const auto end = std::chrono::steady_clock::now() + kWaitBound;
    unsigned spins = 0;
    while (word(op.word).load(std::memory_order_acquire) != op.value) {
      if (std::chrono::steady_clock::now() > end) {
        return false;
      }
      if (++spins > 64) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }
  return true;
}

// A node of L ranks: each one's inboxes (its own memory) and stage.
struct Node {
  explicit Node(int l)
      : L(l), ready(l * kMaxDeviceSources), busy(l * kMaxDeviceSources), stage(l * kCells), tensor(l * kCells) {}

  MemOpFlags flagsOf(int me) {
    MemOpFlags f;
    f.local_size = L;
    f.me = me;
    for (int l = 0; l < L; ++l) {
      f.ready[l] = &ready[static_cast<size_t>(l * kMaxDeviceSources)];
      f.busy[l] = &busy[static_cast<size_t>(l * kMaxDeviceSources)];
    }
    return f;
  }
  bool atRest() const {
    for (size_t i = 0; i < ready.size(); ++i) {
      if (ready[i] != 0 || busy[i] != 0) {
        return false;
      }
    }
    return true;
  }
  static uint32_t stamp(int exchange, int rank) {
    return static_cast<uint32_t>(exchange) * 64 + static_cast<uint32_t>(rank);
  }
  // `cells` is `stage` (the staging buffers) or `tensor` (the callers' own,
  // which a zero-copy step reads).
  static void fill(std::vector<std::atomic<uint32_t>>& cells, int me, int x) {
    for (int k = 0; k < kCells; ++k) {
      cells[static_cast<size_t>(me * kCells + k)].store(stamp(x, me), std::memory_order_relaxed);
    }
  }
  // Reads every peer's stage, pausing halfway (the window in which a peer
  // that refilled too early would be caught); counts cells of another exchange.
  int consume(const std::vector<std::atomic<uint32_t>>& cells, int me, int x, bool slow, std::mt19937& rng) {
    int stale = 0;
    for (int l = 0; l < L; ++l) {
      if (l == me) {
        continue;
      }
      for (int k = 0; k < kCells; ++k) {
        if (k == kCells / 2 && (slow || rng() % 8 == 0)) {
          std::this_thread::sleep_for(std::chrono::microseconds(slow ? 2000 : 50));
        }
        stale += cells[static_cast<size_t>(l * kCells + k)].load(std::memory_order_relaxed) != stamp(x, l);
      }
    }
    return stale;
  }

  int L;
  std::vector<uint32_t> ready;
  std::vector<uint32_t> busy;
  std::vector<std::atomic<uint32_t>> stage;
  std::vector<std::atomic<uint32_t>> tensor;
};

struct Outcome {
  int stale = 0;   // cells of a peer's stage or tensor that held another exchange's data
  int unmet = 0;   // waits that outlived the bound
  bool at_rest = false;
};

// Every rank runs `calls` calls of the same kinds (as every rank makes the
// same collectives): a staged exchange (before, fill, between, consume,
// after) or, where `zero_copy(x)`, a zero-copy step (the caller's tensor is
// written before the call; between, consume, after, before; the caller
// overwrites its tensor as soon as the call returns). `slow_rank` reads
// slowly; `tamper` edits each rank's steps.
template <typename ZeroCopy, typename Tamper>
Outcome runNode(int L, int calls, int slow_rank, ZeroCopy zero_copy, Tamper tamper) {
  Node node(L);
  std::vector<Outcome> out(static_cast<size_t>(L));
  std::vector<std::thread> ranks;
  for (int me = 0; me < L; ++me) {
    ranks.emplace_back([&, me] {
      std::mt19937 rng(static_cast<unsigned>(me) + 7);
      MemOpSteps steps = memOpSteps(node.flagsOf(me));
      tamper(steps);
      Outcome& o = out[static_cast<size_t>(me)];
      for (int x = 1; x <= calls; ++x) {
        if (zero_copy(x)) {
          Node::fill(node.tensor, me, x);  // the caller's own tensor
          o.unmet += !run(steps.between);
          o.stale += node.consume(node.tensor, me, x, me == slow_rank, rng);
          o.unmet += !run(steps.after);
          o.unmet += !run(steps.before);
          Node::fill(node.tensor, me, -x);  // the caller's next use of its tensor
          continue;
        }
        o.unmet += !run(steps.before);
        Node::fill(node.stage, me, x);
        o.unmet += !run(steps.between);
        o.stale += node.consume(node.stage, me, x, me == slow_rank, rng);
        o.unmet += !run(steps.after);
      }
    });
  }
  for (auto& t : ranks) {
    t.join();
  }
  Outcome total;
  for (const Outcome& o : out) {
    total.stale += o.stale;
    total.unmet += o.unmet;
  }
  total.at_rest = node.atRest();
  return total;
}

const auto kNone = [](MemOpSteps&) {};

} // namespace

SMDDP_TEST(exchanges_see_only_the_current_stage_and_leave_the_flags_at_rest) {
  for (int L : {2, 3, 4}) {
    const Outcome o = runNode(L, 300, 1, [](int) { return false; }, kNone);
    EXPECT_EQ(o.stale, 0);
    EXPECT_EQ(o.unmet, 0);
    EXPECT_TRUE(o.at_rest);
  }
}

SMDDP_TEST(zero_copy_steps_mixed_with_exchanges_end_after_the_peers_read) {
  for (int L : {2, 3, 4}) {
    // Runs of each kind and alternations, the same on every rank.
    const Outcome o = runNode(L, 300, 1, [](int x) { return (x / 3) % 2 == 1 || x % 7 == 0; }, kNone);
    EXPECT_EQ(o.stale, 0);
    EXPECT_EQ(o.unmet, 0);
    EXPECT_TRUE(o.at_rest);
  }
}

SMDDP_TEST(the_model_catches_a_rank_that_refills_before_its_peers_read) {
  const Outcome o = runNode(2, 20, 1, [](int) { return false; }, [](MemOpSteps& s) { s.before.clear(); });
  EXPECT_TRUE(o.stale > 0);
}

SMDDP_TEST(the_model_catches_a_rank_that_reads_before_its_peers_filled) {
  const Outcome o = runNode(2, 20, 0, [](int) { return false; }, [](MemOpSteps& s) {
    std::vector<MemOp> kept;
    for (const MemOp& op : s.between) {
      if (!(op.kind == MemOp::Kind::kWaitEq && op.value == 1)) {
        kept.push_back(op);
      }
    }
    s.between = kept;
  });
  EXPECT_TRUE(o.stale > 0);
}

SMDDP_TEST(the_model_catches_a_zero_copy_step_that_returns_before_its_peers_read) {
  // The trailing `before` is what keeps the caller from overwriting its
  // tensor while the slow peer still reads it.
  const Outcome o = runNode(2, 20, 1, [](int) { return true; }, [](MemOpSteps& s) { s.before.clear(); });
  EXPECT_TRUE(o.stale > 0);
}

SMDDP_TEST(the_model_catches_a_between_that_marks_peers_busy_before_they_finished) {
  // Without `between`'s own wait for `busy`, a zero-copy step that follows
  // an exchange marks a slow peer busy while that peer still reads the
  // exchange's stage; the peer's late reset then ends the step's trailing
  // wait early, and the caller overwrites a tensor the peer has yet to read.
  const Outcome o = runNode(2, 40, 1, [](int x) { return x % 2 == 0; }, [](MemOpSteps& s) {
    s.between.erase(s.between.begin(), s.between.begin() + static_cast<long>(s.before.size()));
  });
  EXPECT_TRUE(o.stale > 0);
}

SMDDP_TEST(steps_write_only_their_own_inbox_or_their_own_word_of_a_peers) {
  Node node(4);
  const int me = 2;
  const MemOpSteps s = memOpSteps(node.flagsOf(me));
  const uint32_t* my_ready = &node.ready[static_cast<size_t>(me * kMaxDeviceSources)];
  const uint32_t* my_busy = &node.busy[static_cast<size_t>(me * kMaxDeviceSources)];
  const auto mine = [&](const uint32_t* w) {
    return (w >= my_ready && w < my_ready + kMaxDeviceSources) || (w >= my_busy && w < my_busy + kMaxDeviceSources);
  };
  const auto peers_word_of_mine = [&](const uint32_t* w) {
    for (int l = 0; l < 4; ++l) {
      const size_t i = static_cast<size_t>(l * kMaxDeviceSources + me);
      if (l != me && (w == &node.ready[i] || w == &node.busy[i])) {
        return true;
      }
    }
    return false;
  };
  for (const auto* step : {&s.before, &s.between, &s.after, &s.release}) {
    for (const MemOp& op : *step) {
      // Waits read this rank's own inboxes; writes go there or to this
      // rank's own word of a peer's inbox.
      EXPECT_TRUE(op.kind == MemOp::Kind::kWaitEq ? mine(op.word) : mine(op.word) || peers_word_of_mine(op.word));
    }
  }
  EXPECT_EQ(s.before.size(), size_t{3});
  EXPECT_EQ(s.between.size(), size_t{15});
  EXPECT_EQ(s.after.size(), size_t{3});
  for (const MemOp& op : s.before) {
    EXPECT_TRUE(op.kind == MemOp::Kind::kWaitEq && mine(op.word));
  }
  // A node of one rank waits for nobody.
  Node alone(1);
  const MemOpSteps a = memOpSteps(alone.flagsOf(0));
  EXPECT_TRUE(a.before.empty() && a.between.empty() && a.after.empty() && a.release.empty());
}

SMDDP_TEST(release_writes_carry_a_rank_whose_peer_never_comes) {
  Node node(2);
  const MemOpSteps s = memOpSteps(node.flagsOf(0));
  std::atomic<bool> done{false};
  int unmet = 0;
  std::thread rank([&] {
    // Blocked at the first `between` until the host releases it; every later
    // step resets what the release wrote, so it must be written again.
    for (int x = 0; x < 5; ++x) {
      unmet += !run(s.before);
      unmet += !run(s.between);
      unmet += !run(s.after);
    }
    done.store(true);
  });
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(!done.load());  // it waits for its peer
  while (!done.load() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    run(s.release);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  rank.join();
  EXPECT_EQ(unmet, 0);
  EXPECT_TRUE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}
