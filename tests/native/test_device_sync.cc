// A host model of the device synchronization protocol (SMDDP_CUDA_SYNC=device,
// algorithm/device_sync_protocol.h): threads play a node's ranks and run the
// very steps the GPU kernel runs (exchangeSteps, runSyncStep) with host
// atomics for the flags, filling and reading each other's stages. A rank must
// see only the current exchange's data in every peer's stage; a wait without
// its peer ends with a timeout, and the abort word ends it at once.
#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "algorithm/device_sync_protocol.h"
#include "harness.h"

using namespace smddp;
using algorithm::cuda::ExchangeFlags;
using algorithm::cuda::ExchangeSteps;
using algorithm::cuda::exchangeSteps;
using algorithm::cuda::runSyncStep;
using algorithm::cuda::SyncEnd;
using algorithm::cuda::SyncWords;

namespace {

struct HostOps {
  static std::atomic_ref<uint64_t> flag(const uint64_t* p) {
    return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(p));
  }
  uint64_t loadAcquire(const uint64_t* p) {
    return flag(p).load(std::memory_order_acquire);
  }
  void storeRelease(uint64_t* p, uint64_t v) {
    flag(p).store(v, std::memory_order_release);
  }
  // On the device the stage was written by other work of the stream, hence
  // the fence; here the posting thread wrote it itself, and the release
  // store that follows orders those writes.
  void fence() {}
  uint64_t now() {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  }
  void pause(unsigned ns) {
    std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
  }
  uint32_t loadWord(const uint32_t* p) {
    return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(p)).load(std::memory_order_relaxed);
  }
  void storeWord(uint32_t* p, uint32_t v) {
    std::atomic_ref<uint32_t>(*p).store(v, std::memory_order_relaxed);
  }
};

constexpr int kCells = 64;
constexpr uint64_t kSecond = 1000000000;

// A node of L ranks: each one's counter, words, flags and stage.
struct Node {
  explicit Node(int l) : L(l), counter(l), words(l), ready(l), done(l), stage(l * kCells) {}

  ExchangeFlags flagsOf(int me, uint64_t timeout_ns) {
    ExchangeFlags f;
    f.counter = &counter[me];
    f.words = &words[me];
    f.timeout_ns = timeout_ns;
    f.local_size = L;
    f.me = me;
    for (int l = 0; l < L; ++l) {
      f.ready[l] = &ready[l];
      f.done[l] = &done[l];
    }
    return f;
  }

  static uint32_t stamp(int exchange, int rank) {
    return static_cast<uint32_t>(exchange) * 64 + static_cast<uint32_t>(rank);
  }

  int L;
  std::vector<uint64_t> counter;
  std::vector<SyncWords> words;
  std::vector<uint64_t> ready;
  std::vector<uint64_t> done;
  std::vector<std::atomic<uint32_t>> stage;  // rank l's cells at l * kCells
};

struct Outcome {
  int stale = 0;  // cells of a peer's stage that held another exchange's data
  int unmet = 0;  // steps that ended without their flags
};

// Every rank runs `exchanges` exchanges; `slow_rank` pauses halfway through
// reading each peer's stage (the window a protocol error would fall into),
// the others at random. `tamper` edits each rank's steps.
template <typename Tamper>
Outcome runNode(int L, int exchanges, int slow_rank, Tamper tamper) {
  Node node(L);
  std::vector<Outcome> out(static_cast<size_t>(L));
  std::vector<std::thread> ranks;
  for (int me = 0; me < L; ++me) {
    ranks.emplace_back([&, me] {
      HostOps ops;
      std::mt19937 rng(static_cast<unsigned>(me));
      ExchangeSteps steps = exchangeSteps(node.flagsOf(me, 20 * kSecond));
      tamper(steps);
      Outcome& o = out[static_cast<size_t>(me)];
      for (int x = 1; x <= exchanges; ++x) {
        o.unmet += runSyncStep(steps.before, ops) != SyncEnd::kMet;
        for (int k = 0; k < kCells; ++k) {
          node.stage[static_cast<size_t>(me * kCells + k)].store(Node::stamp(x, me), std::memory_order_relaxed);
        }
        o.unmet += runSyncStep(steps.between, ops) != SyncEnd::kMet;
        for (int l = 0; l < L; ++l) {
          if (l == me) {
            continue;
          }
          for (int k = 0; k < kCells; ++k) {
            if (k == kCells / 2 && (me == slow_rank || rng() % 8 == 0)) {
              std::this_thread::sleep_for(std::chrono::microseconds(me == slow_rank ? 2000 : 50));
            }
            const uint32_t v = node.stage[static_cast<size_t>(l * kCells + k)].load(std::memory_order_relaxed);
            o.stale += v != Node::stamp(x, l);
          }
        }
        o.unmet += runSyncStep(steps.after, ops) != SyncEnd::kMet;
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
  for (int l = 0; l < L; ++l) {
    EXPECT_EQ(node.counter[static_cast<size_t>(l)], static_cast<uint64_t>(exchanges));
  }
  return total;
}

} // namespace

SMDDP_TEST(exchanges_see_only_the_current_stage) {
  for (int L : {2, 3, 4}) {
    const Outcome o = runNode(L, 300, 1, [](ExchangeSteps&) {});
    EXPECT_EQ(o.stale, 0);
    EXPECT_EQ(o.unmet, 0);
  }
}

SMDDP_TEST(the_model_catches_a_rank_that_refills_before_its_peers_read) {
  // Without the wait for the peers' `done`, rank 0 overwrites its stage
  // while the slow rank still reads the previous exchange from it.
  const Outcome o = runNode(2, 20, 1, [](ExchangeSteps& s) { s.before.nwait = 0; });
  EXPECT_TRUE(o.stale > 0);
}

SMDDP_TEST(the_model_catches_a_rank_that_reads_before_its_peers_filled) {
  const Outcome o = runNode(2, 20, 0, [](ExchangeSteps& s) { s.between.nwait = 0; });
  EXPECT_TRUE(o.stale > 0);
}

SMDDP_TEST(steps_name_every_peer_and_post_only_their_own_flags) {
  Node node(4);
  const ExchangeSteps s = exchangeSteps(node.flagsOf(2, kSecond));
  EXPECT_EQ(s.before.nwait, 3);
  EXPECT_EQ(s.between.nwait, 3);
  EXPECT_EQ(s.after.nwait, 0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(s.before.wait[i] != &node.done[2] && s.between.wait[i] != &node.ready[2]);
  }
  EXPECT_TRUE(!s.before.bump && s.between.bump && !s.after.bump);
  EXPECT_TRUE(s.before.post == nullptr);
  EXPECT_TRUE(s.between.post == &node.ready[2]);
  EXPECT_TRUE(s.after.post == &node.done[2]);
}

SMDDP_TEST(a_wait_without_its_peer_times_out_and_says_so) {
  Node node(2);
  HostOps ops;
  const ExchangeSteps s = exchangeSteps(node.flagsOf(0, 50 * 1000000));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(runSyncStep(s.before, ops) == SyncEnd::kMet);  // nothing to wait for yet
  EXPECT_TRUE(runSyncStep(s.between, ops) == SyncEnd::kTimeout);
  const double s_taken = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(s_taken >= 0.05 && s_taken < 2.0);
  EXPECT_EQ(node.words[0].error, static_cast<uint32_t>(SyncEnd::kTimeout));
  EXPECT_EQ(node.ready[0], uint64_t{1});  // it posted before it waited
}

SMDDP_TEST(the_abort_word_ends_a_wait_at_once) {
  Node node(2);
  HostOps ops;
  const ExchangeSteps s = exchangeSteps(node.flagsOf(0, 60 * kSecond));
  std::thread host([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ops.storeWord(&node.words[0].abort, 1);
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(runSyncStep(s.between, ops) == SyncEnd::kAborted);
  const double s_taken = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  host.join();
  EXPECT_TRUE(s_taken < 2.0);
  EXPECT_EQ(node.words[0].error, static_cast<uint32_t>(SyncEnd::kAborted));
}

