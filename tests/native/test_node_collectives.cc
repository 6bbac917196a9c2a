// Node-local collectives in forked processes over a real shared-memory
// arena: every op, both data paths, several sizes (0, 1, odd, past one
// staging slot), results checked exactly; disagreeing ranks; a dead peer; a
// timeout; nothing left in /dev/shm.
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

#include "algorithm/node_collectives.h"
#include "harness.h"
#include "transport/shm/node_arena.h"
#include "transport/shm/shm_channel.h"

using namespace smddp;
using test::iota;
using algorithm::NodeCollectives;
using algorithm::OpArgs;
using transport::NodeArena;

namespace {

constexpr size_t kSlot = 4096;

using test::smallSlots;

Config configFor(const char* single_copy) {
  return Config::fromEnv([&](const char* name) -> const char* {
    if (std::strcmp(name, "SMDDP_SINGLE_COPY") == 0) {
      return single_copy;
    }
    if (std::strcmp(name, "SMDDP_SHM_SLOT_BYTES") == 0) {
      return "4096";
    }
    return nullptr;
  });
}

float value(int rank, size_t i) {
  return static_cast<float>(rank * 1000 + static_cast<int>(i % 997)) * 0.5f;
}

int countShmEntries() {
  int n = 0;
  DIR* d = ::opendir("/dev/shm");
  if (d == nullptr) {
    return 0;
  }
  std::string prefix = str("smddp-", ::getuid(), "-");
  while (auto* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) {
      ++n;
    }
  }
  ::closedir(d);
  return n;
}

void runAllOps(int rank, int L, NodeCollectives& node, uint64_t& seq) {
  const size_t sizes[] = {0, 1, 7, kSlot / 4 + 3, 3 * kSlot + 5};
  for (size_t n : sizes) {
    Deadline dl = Deadline::after(std::chrono::seconds(20));
    // AllGather
    {
      std::vector<float> in(n), out(n * static_cast<size_t>(L), -1.f);
      for (size_t i = 0; i < n; ++i) {
        in[i] = value(rank, i);
      }
      OpArgs a;
      a.kind = CollectiveKind::kAllGather;
      a.reduce.dtype = DataType::kFloat32;
      a.in = in.data();
      a.out = out.data();
      a.count = n;
      a.seq = seq++;
      a.deadline = dl;
      node.allGather(a);
      for (int r = 0; r < L; ++r) {
        for (size_t i = 0; i < n; ++i) {
          if (out[static_cast<size_t>(r) * n + i] != value(r, i)) {
            ::smddp::test::fail(__FILE__, __LINE__, str("allgather n=", n, " rank ", r, " elem ", i));
            return;
          }
        }
      }
    }
    // ReduceScatter SUM (integers in float: exact)
    {
      std::vector<float> in(n * static_cast<size_t>(L)), out(n, -1.f);
      for (size_t i = 0; i < in.size(); ++i) {
        in[i] = value(rank, i);
      }
      OpArgs a;
      a.kind = CollectiveKind::kReduceScatter;
      a.reduce = {DataType::kFloat32, ReduceOp::kSum, 1.0, static_cast<double>(L)};
      a.in = in.data();
      a.out = out.data();
      a.count = n;
      a.seq = seq++;
      a.deadline = dl;
      node.reduceScatter(a);
      for (size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int r = 0; r < L; ++r) {
          want += value(r, static_cast<size_t>(rank) * n + i);
        }
        if (out[i] != want) {
          ::smddp::test::fail(__FILE__, __LINE__, str("reduce_scatter n=", n, " elem ", i, ": ", out[i], " vs ", want));
          return;
        }
      }
    }
    // AllReduce MAX, in place
    {
      std::vector<int32_t> t(n);
      for (size_t i = 0; i < n; ++i) {
        t[i] = static_cast<int32_t>((rank * 7919 + static_cast<int>(i) * 31) % 1001);
      }
      OpArgs a;
      a.kind = CollectiveKind::kAllReduce;
      a.reduce = {DataType::kInt32, ReduceOp::kMax};
      a.in = t.data();
      a.out = t.data();
      a.count = n;
      a.seq = seq++;
      a.deadline = dl;
      node.allReduce(a);
      for (size_t i = 0; i < n; ++i) {
        int32_t want = 0;
        for (int r = 0; r < L; ++r) {
          want = std::max(want, static_cast<int32_t>((r * 7919 + static_cast<int>(i) * 31) % 1001));
        }
        if (t[i] != want) {
          ::smddp::test::fail(__FILE__, __LINE__, str("allreduce n=", n, " elem ", i));
          return;
        }
      }
    }
    // Broadcast from the last rank
    {
      std::vector<float> t(n);
      for (size_t i = 0; i < n; ++i) {
        t[i] = value(rank, i);
      }
      OpArgs a;
      a.kind = CollectiveKind::kBroadcast;
      a.reduce.dtype = DataType::kFloat32;
      a.in = t.data();
      a.out = t.data();
      a.count = n;
      a.root = L - 1;
      a.seq = seq++;
      a.deadline = dl;
      node.broadcast(a);
      for (size_t i = 0; i < n; ++i) {
        if (t[i] != value(L - 1, i)) {
          ::smddp::test::fail(__FILE__, __LINE__, str("broadcast n=", n, " elem ", i));
          return;
        }
      }
    }
    OpArgs b;
    b.kind = CollectiveKind::kBarrier;
    b.seq = seq++;
    b.deadline = dl;
    node.barrier(b);
  }
}

void collectivesFor(const char* single_copy) {
  for (int L : {1, 2, 3, 4}) {
    std::string dir = ::smddp::test::tempDir();
    ::smddp::test::runRanks(L, [&](int rank) {
      ::smddp::test::DirStore store(dir);
      Config cfg = configFor(single_copy);
      NodeArena::Options o = smallSlots();
      o.timeout = std::chrono::seconds(20);
      NodeArena arena(store, "arena", rank, iota(L), o);
      NodeCollectives node(arena, cfg);
      uint64_t seq = 0;
      runAllOps(rank, L, node, seq);
    });
  }
}

} // namespace

SMDDP_TEST(staged_paths) {
  collectivesFor("off");
}

SMDDP_TEST(single_copy_paths) {
  collectivesFor("on");
}

SMDDP_TEST(disagreeing_ranks_fail_on_every_rank) {
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(2, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    NodeArena arena(store, "arena", rank, iota(2), smallSlots());
    NodeCollectives node(arena, configFor("auto"));
    std::vector<float> in(8, 1.f), out(16);
    OpArgs a;
    a.reduce.dtype = DataType::kFloat32;
    a.in = in.data();
    a.out = rank == 0 ? in.data() : out.data();
    a.count = 8;
    a.deadline = Deadline::after(std::chrono::seconds(10));
    a.kind = rank == 0 ? CollectiveKind::kAllReduce : CollectiveKind::kAllGather;
    EXPECT_THROWS(rank == 0 ? node.allReduce(a) : node.allGather(a), kMismatch, "rank 1: #0 allgather(float32, 8 elements)");
  });
}

SMDDP_TEST(dead_peer_is_reported_within_a_second) {
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(
      3,
      [&](int rank) {
        ::smddp::test::DirStore store(dir);
        NodeArena arena(store, "arena", rank, iota(3), smallSlots());
        NodeCollectives node(arena, configFor("auto"));
        if (rank == 2) {
          ::_exit(0);  // dies without a word
        }
        std::vector<float> t(64, 1.f);
        OpArgs a;
        a.kind = CollectiveKind::kAllReduce;
        a.reduce.dtype = DataType::kFloat32;
        a.in = t.data();
        a.out = t.data();
        a.count = t.size();
        a.deadline = Deadline::after(std::chrono::seconds(30));
        auto t0 = std::chrono::steady_clock::now();
        bool threw = false;
        try {
          node.allReduce(a);
        } catch (const Error& e) {
          threw = true;
          EXPECT_TRUE(e.kind() == ErrorKind::kPeerLost || e.kind() == ErrorKind::kAborted);
          EXPECT_TRUE(std::string(e.what()).find("rank 2") != std::string::npos);
        }
        EXPECT_TRUE(threw);
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_TRUE(ms < 1000);
      },
      std::chrono::seconds(30),
      [](int rank) { return rank == 2; });
}

// A peer that took its last message and exited at once is done, not lost,
// even when the sender looks at its liveness before at its acknowledgement;
// a peer that exits while a message from it is still awaited is lost.
SMDDP_TEST(shm_channel_peer_gone_after_its_last_ack) {
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(
      2,
      [&](int rank) {
        ::smddp::test::DirStore store(dir);
        NodeArena arena(store, "arena", rank, iota(2), smallSlots());
        transport::ShmChannel ch(arena, 1 - rank, 1 - rank);
        transport::MessageTag tag;
        tag.seq = 7;
        tag.count = 16;
        std::vector<uint8_t> buf(16, static_cast<uint8_t>(rank));
        const Deadline dl = Deadline::after(std::chrono::seconds(10));
        if (rank == 1) {
          ch.postRecv(buf.data(), buf.size(), tag);
          transport::DriveOptions d;
          d.what = [] { return std::string("rank 0"); };
          transport::drive({&ch}, [] { return false; }, [&] { return ch.recvsDone() == 1; }, dl, d);
          ::_exit(0);
        }
        ch.postSend(buf.data(), buf.size(), tag);
        ch.progress();
        while (!arena.peerExited(1)) {
          EXPECT_TRUE(!dl.expired());
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        ch.checkPeer();  // the acknowledgement came before the exit
        EXPECT_TRUE(ch.sendsDone() == 1);
        std::vector<uint8_t> more(16);
        ch.postRecv(more.data(), more.size(), tag);
        EXPECT_THROWS(ch.checkPeer(), kPeerLost, "rank 1");
      },
      std::chrono::seconds(30),
      [](int rank) { return rank == 1; });
}

namespace {

// Rank 0 in a barrier whose deadline is 300 ms away, `check` looking at how
// it ended; rank 1 runs `late` on its arena instead of the barrier.
void barrierWithLatePeer(const std::function<void(NodeCollectives&)>& check,
                         const std::function<void(NodeArena&)>& late) {
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(2, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    NodeArena arena(store, "arena", rank, iota(2), smallSlots());
    NodeCollectives node(arena, configFor("auto"));
    if (rank == 0) {
      check(node);
    } else {
      late(arena);
    }
  });
}

OpArgs barrierArgs() {
  OpArgs a;
  a.kind = CollectiveKind::kBarrier;
  a.deadline = Deadline::after(std::chrono::milliseconds(300));
  return a;
}

} // namespace

SMDDP_TEST(timeout_names_the_late_rank) {
  barrierWithLatePeer(
      [](NodeCollectives& node) { EXPECT_THROWS(node.barrier(barrierArgs()), kTimeout, "rank 1"); },
      // Past rank 0's deadline and its grace for rank 1's own failure.
      [](NodeArena&) { std::this_thread::sleep_for(std::chrono::milliseconds(3000)); });
}

SMDDP_TEST(a_peer_failing_just_after_our_deadline_gives_its_cause) {
  // Two ranks of one call time out a moment apart; the one whose deadline
  // comes second often has the cause (here: its link to another node).
  barrierWithLatePeer(
      [](NodeCollectives& node) {
        auto t0 = std::chrono::steady_clock::now();
        EXPECT_THROWS(node.barrier(barrierArgs()), kAborted, "rank 1 failed: timed out waiting for rank 3 (other node)");
        EXPECT_TRUE(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1200));
      },
      [](NodeArena& arena) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        arena.abort("timed out waiting for rank 3 (other node)");
      });
}

SMDDP_TEST(an_abort_message_reaches_every_peer_without_a_wait) {
  // What a rank that fails between host rounds leaves for its peers (the
  // CUDA watchdog reads it while the peers' streams wait on the GPU).
  std::string dir = ::smddp::test::tempDir();
  const std::string checked = dir + "/checked";
  ::smddp::test::runRanks(2, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    NodeArena arena(store, "arena", rank, iota(2), smallSlots());
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    if (rank == 0) {
      // Rank 1 aborts only once this rank has seen the arena not aborted.
      EXPECT_EQ(arena.abortMessage(), std::string());
      FILE* f = std::fopen(checked.c_str(), "w");
      EXPECT_TRUE(f != nullptr);
      if (f != nullptr) {
        std::fclose(f);
      }
    } else {
      while (access(checked.c_str(), F_OK) != 0 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      arena.abort("allgather #3 could not map the tensor of local rank 0");
    }
    while (arena.abortMessage().empty() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(arena.abortMessage(), std::string("rank 1 failed: allgather #3 could not map the tensor of local rank 0"));
  });
}

SMDDP_TEST(nothing_left_in_dev_shm) {
  int before = countShmEntries();
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(2, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    NodeArena arena(store, "arena", rank, iota(2), smallSlots());
    // While the arena is in use, its name is already gone.
    EXPECT_EQ(countShmEntries(), 0);
  });
  EXPECT_EQ(countShmEntries(), before);
}

SMDDP_TEST(slot_too_small_for_the_node_fails_on_every_rank) {
  // Each rank fails on its own, before it creates or waits for the segment:
  // a hang here would be the defect.
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(3, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    NodeArena::Options o;
    o.slot_bytes = 16;
    o.timeout = std::chrono::milliseconds(2000);
    EXPECT_THROWS(NodeArena(store, "arena", rank, iota(3), o), kConfig, "SMDDP_SHM_SLOT_BYTES to at least 4096");
  });
}

SMDDP_TEST(a_rank_that_cannot_map_the_segment_fails_its_node_at_once) {
  // Local rank 2 cannot map the node's segment: ranks 0 and 1, waiting for
  // every rank to map it, fail within seconds naming it and why, not at
  // the timeout with a count; and nothing is left in /dev/shm.
  const int before = countShmEntries();
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(3, [&](int rank) {
    ::smddp::test::DirStore files(dir);
    // A name that does not exist, as if its /dev/shm were another (a
    // container of its own) or shm_open were refused.
    ::smddp::test::LyingStore wrong(files, "arena", taggedValue(toBytes("/smddp-test-no-such-segment")));
    Store& store = rank == 2 ? static_cast<Store&>(wrong) : files;
    NodeArena::Options o = smallSlots();
    o.timeout = std::chrono::seconds(30);
    const auto start = std::chrono::steady_clock::now();
    std::string what;
    try {
      NodeArena arena(store, "arena", rank, iota(3), o);
    } catch (const Error& e) {
      what = e.what();
    }
    EXPECT_TRUE(std::chrono::steady_clock::now() - start < std::chrono::seconds(6));
    EXPECT_TRUE(what.find("smddp-test-no-such-segment") != std::string::npos);
    if (rank != 2) {
      EXPECT_TRUE(what.find("local rank 2 (rank 2) could not map the node's shared memory") != std::string::npos);
    }
  }, std::chrono::seconds(60));
  EXPECT_EQ(countShmEntries(), before);
}

SMDDP_TEST(the_nearest_common_ancestor_of_sibling_ranks_is_their_launcher) {
  // Under Yama's ptrace_scope 1 each rank declares this ancestor as its
  // tracer, so that its siblings may read its memory.
  const int self = static_cast<int>(::getpid());
  EXPECT_EQ(transport::parentPid(self), static_cast<int>(::getppid()));
  EXPECT_EQ(transport::nearestCommonAncestor({self}), self);
  EXPECT_EQ(transport::nearestCommonAncestor({}), 0);
  const int scope = transport::yamaPtraceScope();
  EXPECT_TRUE(scope >= -1 && scope <= 3);
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  // a: a rank that forked a worker g; b: its sibling.
  const pid_t a = ::fork();
  if (a == 0) {
    const pid_t g = ::fork();
    if (g == 0) {
      ::sleep(30);
      ::_exit(0);
    }
    const int gpid = static_cast<int>(g);
    (void)!::write(fds[1], &gpid, sizeof(gpid));
    ::sleep(30);
    ::kill(g, SIGKILL);
    ::_exit(0);
  }
  const pid_t b = ::fork();
  if (b == 0) {
    ::sleep(30);
    ::_exit(0);
  }
  int g = 0;
  EXPECT_EQ(::read(fds[0], &g, sizeof(g)), static_cast<ssize_t>(sizeof(g)));
  EXPECT_EQ(transport::parentPid(g), static_cast<int>(a));
  EXPECT_EQ(transport::nearestCommonAncestor({static_cast<int>(a), static_cast<int>(b)}), self);
  EXPECT_EQ(transport::nearestCommonAncestor({g, static_cast<int>(b)}), self);
  EXPECT_EQ(transport::nearestCommonAncestor({static_cast<int>(b), g}), self);
  EXPECT_EQ(transport::nearestCommonAncestor({g, static_cast<int>(a)}), static_cast<int>(a));
  EXPECT_EQ(transport::nearestCommonAncestor({self, g, static_cast<int>(b)}), self);
  ::kill(g, SIGKILL);
  ::kill(a, SIGKILL);
  ::kill(b, SIGKILL);
  ::waitpid(a, nullptr, 0);
  ::waitpid(b, nullptr, 0);
  // A process that is gone has no parent to follow.
  EXPECT_EQ(transport::parentPid(static_cast<int>(b)), 0);
  ::close(fds[0]);
  ::close(fds[1]);
}
