// rank -> (node, local rank), node-local groups and rails for the emulated
// shapes, and non-uniform topologies; the store barrier the group set-up
// ends with, and a failed rank's arrival at it.
#include <chrono>
#include <thread>

#include "common/store.h"
#include "harness.h"
#include "topology/topology.h"

using namespace smddp;
using topology::Topology;

namespace {

Topology emulate(int rank, int nodes, int per_node) {
  std::vector<std::string> keys;
  for (int r = 0; r < nodes * per_node; ++r) {
    keys.push_back(topology::nodeKey("host", r, per_node));
  }
  return Topology(rank, keys);
}

} // namespace

SMDDP_TEST(emulated_shapes) {
  for (auto [nodes, per] : std::vector<std::pair<int, int>>{{1, 2}, {2, 1}, {2, 2}, {2, 3}, {3, 2}, {4, 1}, {1, 4}, {2, 4}}) {
    for (int rank = 0; rank < nodes * per; ++rank) {
      Topology t = emulate(rank, nodes, per);
      EXPECT_EQ(t.numNodes(), nodes);
      EXPECT_EQ(t.localSize(), per);
      EXPECT_TRUE(t.uniform());
      EXPECT_EQ(t.myNode(), rank / per);
      EXPECT_EQ(t.myLocalRank(), rank % per);
      auto rail = t.railRanks(t.myLocalRank());
      EXPECT_EQ(static_cast<int>(rail.size()), nodes);
      for (int n = 0; n < nodes; ++n) {
        EXPECT_EQ(rail[n], n * per + rank % per);
      }
    }
  }
}

SMDDP_TEST(interleaved_hosts) {
  // Ranks alternate between two hosts: nodes are {0,2} and {1,3}.
  Topology t(3, {"a", "b", "a", "b"});
  EXPECT_EQ(t.numNodes(), 2);
  EXPECT_EQ(t.myNode(), 1);
  EXPECT_EQ(t.myLocalRank(), 1);
  EXPECT_EQ(t.nodeRanks(0)[1], 2);
  EXPECT_EQ(t.railRanks(0)[1], 1);
}

SMDDP_TEST(non_uniform) {
  Topology t(0, {"a", "a", "a", "b"});
  EXPECT_TRUE(!t.uniform());
  EXPECT_EQ(t.numNodes(), 2);
  EXPECT_TRUE(t.describe().find("non-uniform") != std::string::npos);
}

SMDDP_TEST(node_key_emulation) {
  EXPECT_EQ(topology::nodeKey("h", 5, 0), std::string("h"));
  EXPECT_EQ(topology::nodeKey("h", 5, 2), std::string("h#2"));
  EXPECT_TRUE(!topology::hostIdentity().empty());
}

SMDDP_TEST(store_barrier_rounds_and_failures) {
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(3, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    // Round 1: nobody fails.
    EXPECT_EQ(storeBarrier(store, "b", 3), std::string());
    // Round 2 on the same key: rank 1's failure reaches every rank.
    EXPECT_EQ(storeBarrier(store, "b", 3, rank == 1 ? "rank 1: no gloo" : ""), std::string("rank 1: no gloo"));
    // Round 3: the failure was round 2's, and nobody leaves before the
    // late rank arrives.
    const auto start = std::chrono::steady_clock::now();
    if (rank == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    EXPECT_EQ(storeBarrier(store, "b", 3), std::string());
    EXPECT_TRUE(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(250));
    // Round 4: rank 0 fails first and leaves at once, without waiting for
    // the others; rank 2, failing later (as a consequence), does not
    // replace the first failure.
    if (rank == 0) {
      storeBarrierFailed(store, "b", 3, "rank 0: its NIC");
      store.set("first-failed", {1});
      return;
    }
    store.get("first-failed");
    if (rank == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(storeBarrier(store, "b", 3, rank == 2 ? "rank 2: because of rank 0" : ""), std::string("rank 0: its NIC"));
  });
}

namespace {

// A store over a DirStore that counts how each rank asks for keys.
class CountingStore : public Store {
 public:
  explicit CountingStore(Store& inner) : inner_(inner) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    inner_.set(key, value);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    ++gets;
    return inner_.get(key);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return inner_.add(key, delta);
  }
  bool check(const std::string& key) override {
    return inner_.check(key);
  }
  std::vector<std::vector<uint8_t>> getAll(const std::vector<std::string>& keys) override {
    ++batches;
    return inner_.getAll(keys);
  }
  int gets = 0;
  int batches = 0;

 private:
  Store& inner_;
};

} // namespace

SMDDP_TEST(store_all_gather_asks_for_the_peers_keys_at_once) {
  // A group's set-up gathers through the store several times: one request
  // for all peers' keys keeps that at two round trips per rank on a
  // TCPStore, where a request per peer costs each rank 2N.
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(4, [&](int rank) {
    ::smddp::test::DirStore files(dir);
    CountingStore store(files);
    if (rank == 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100)); // the others wait for it
    }
    auto all = storeAllGather(store, "g", rank, 4, toBytes(str("rank ", rank)));
    EXPECT_EQ(all.size(), size_t{4});
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(toString(all[static_cast<size_t>(r)]), str("rank ", r));
    }
    EXPECT_EQ(store.batches, 1);
    EXPECT_EQ(store.gets, 0);
  });
}

SMDDP_TEST(rank_lists_for_messages) {
  EXPECT_EQ(topology::rankList({}), std::string("no rank"));
  EXPECT_EQ(topology::rankList({3}), std::string("rank 3"));
  EXPECT_EQ(topology::rankList({1, 2, 5}), std::string("ranks 1, 2, 5"));
  // Long lists keep their ends readable: the first ranks, then the last.
  std::vector<int> many;
  for (int r = 8; r < 1024; r += 8) {
    many.push_back(r);
  }
  EXPECT_EQ(topology::rankList(many), std::string("ranks 8, 16, 24, 32, 40, 48, ..., 1016 (127 ranks)"));
}
