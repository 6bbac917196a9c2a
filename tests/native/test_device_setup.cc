// The set-up of device communicators (algorithm/device_setup.h) on the host:
// ranks that claim different devices, as under torchrun where local rank l
// drives cuda:l, meet under one scope and agree on the mode; a rank whose
// IPC export or import fails makes every rank stage through host memory
// without anyone waiting for it; nodes of more than kMaxDeviceSources ranks
// reduce elsewhere.
#include <fstream>

#include "algorithm/device_setup.h"
#include "common/config.h"
#include "harness.h"
#include "topology/topology.h"

using namespace smddp;
using algorithm::DeviceMode;
using algorithm::DevicePlan;
using algorithm::DeviceSetup;

namespace {

// DeviceLinks on the host: the "export" is a token naming the rank; an
// import checks that it came from that peer. Every call is counted, so that
// the tests see what the set-up did with the links.
class HostLinks : public transport::DeviceLinks {
 public:
  HostLinks(std::string identity, int local_rank, bool fail_export = false, bool fail_import = false)
      : identity_(std::move(identity)),
        local_rank_(local_rank),
        fail_export_(fail_export),
        fail_import_(fail_import) {}

  std::string identity() override {
    return identity_;
  }
  std::vector<uint8_t> exportLocal() override {
    ++exports;
    if (fail_export_) {
      SMDDP_THROW(kComm, "cudaIpcGetMemHandle failed: cudaErrorNotSupported (operation not supported)");
    }
    return toBytes(str("export of local rank ", local_rank_));
  }
  void importPeer(int l, const std::vector<uint8_t>& exported) override {
    if (fail_import_) {
      SMDDP_THROW(kComm, "cudaIpcOpenMemHandle failed: cudaErrorMapBufferObjectFailed");
    }
    if (toString(exported) != str("export of local rank ", l)) {
      SMDDP_THROW(kInternal, "local rank ", l, "'s export is '", toString(exported), "'");
    }
    ++imports;
  }
  void closeImports() override {
    ++closes;
  }
  void releaseExports() override {
    ++releases;
  }

  int exports = 0;
  int imports = 0;
  int closes = 0;
  int releases = 0;

 private:
  std::string identity_;
  int local_rank_;
  bool fail_export_;
  bool fail_import_;
};

// Ranks 0..n-1 in `nodes` nodes of n/nodes consecutive ranks.
topology::Topology shape(int rank, int n, int nodes) {
  std::vector<std::string> keys;
  for (int r = 0; r < n; ++r) {
    keys.push_back(str("host", r / (n / nodes)));
  }
  return topology::Topology(rank, keys);
}

Config defaults() {
  Config c = Config::fromEnv([](const char*) -> const char* { return nullptr; });
  return c;
}

// What rank `rank` planned, written where the test process can read it.
void report(const std::string& dir, int rank, const std::string& what) {
  std::ofstream(str(dir, "/report.", rank)) << what;
}

std::string reported(const std::string& dir, int rank) {
  std::ifstream in(str(dir, "/report.", rank));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

} // namespace

SMDDP_TEST(ranks_driving_different_devices_meet_under_one_scope) {
  // 2 nodes x 2 ranks, each rank on its own GPU (local rank l on cuda:l).
  const std::string dir = test::tempDir();
  test::runRanks(
      4,
      [&](int rank) {
        test::DirStore store(dir, std::chrono::seconds(10));
        topology::Topology topo = shape(rank, 4, 2);
        DeviceSetup setup(topo, defaults());
        HostLinks links(str("host", rank / 2, "/0000:0", rank % 2, ":00.0"), topo.myLocalRank());
        DevicePlan first = setup.plan(store, links);
        // A second device of the same rank (its k-th communicator) meets
        // under the next scope.
        HostLinks again(str("host", rank / 2, "/0000:1", rank % 2, ":00.0"), topo.myLocalRank());
        DevicePlan second = setup.plan(store, again);
        EXPECT_EQ(std::string(algorithm::deviceModeName(first.mode)), std::string("rails"));
        EXPECT_EQ(links.exports, 1);
        EXPECT_EQ(links.imports, 1);
        EXPECT_EQ(links.releases, 0);
        EXPECT_TRUE(first.reduce_on_device);
        report(dir, rank, str(first.scope, " ", second.scope, " ", first.key("rail/1")));
      },
      std::chrono::seconds(30));
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(reported(dir, r), std::string("smddp/device/0 smddp/device/1 smddp/device/0/rail/1"));
  }
}

SMDDP_TEST(one_node_is_node_mode_whatever_the_devices) {
  const std::string dir = test::tempDir();
  test::runRanks(
      3,
      [&](int rank) {
        test::DirStore store(dir, std::chrono::seconds(10));
        topology::Topology topo = shape(rank, 3, 1);
        DeviceSetup setup(topo, defaults());
        // Ranks 0 and 1 share a GPU, rank 2 has one of its own.
        HostLinks links(str("host0/gpu", rank / 2), rank);
        DevicePlan p = setup.plan(store, links);
        EXPECT_TRUE(p.mode == DeviceMode::kNode);
        EXPECT_EQ(links.imports, 2);
      },
      std::chrono::seconds(30));
}

SMDDP_TEST(shared_gpus_across_nodes_stage_through_the_host) {
  const std::string dir = test::tempDir();
  test::runRanks(
      4,
      [&](int rank) {
        test::DirStore store(dir, std::chrono::seconds(10));
        topology::Topology topo = shape(rank, 4, 2);
        DeviceSetup setup(topo, defaults());
        HostLinks links("host0/0000:01:00.0", topo.myLocalRank());  // one GPU for all
        DevicePlan p = setup.plan(store, links);
        EXPECT_TRUE(p.mode == DeviceMode::kHostStaging);
        EXPECT_TRUE(p.why.find("share GPUs (ranks 0 and 1 both drive host0/0000:01:00.0") != std::string::npos);
        EXPECT_EQ(links.exports, 0);
      },
      std::chrono::seconds(30));
}

SMDDP_TEST(a_failed_export_stages_every_rank_and_nobody_waits) {
  const std::string dir = test::tempDir();
  const auto t0 = std::chrono::steady_clock::now();
  test::runRanks(
      4,
      [&](int rank) {
        // A long store timeout: a rank waiting for the failed one would
        // outlast the test's bound.
        test::DirStore store(dir, std::chrono::seconds(120));
        topology::Topology topo = shape(rank, 4, 1);
        DeviceSetup setup(topo, defaults());
        HostLinks links(str("host0/gpu", rank), rank, /*fail_export=*/rank == 2);
        DevicePlan p = setup.plan(store, links);
        EXPECT_TRUE(p.mode == DeviceMode::kHostStaging);
        EXPECT_TRUE(p.why.find("rank 2 could not export") != std::string::npos);
        EXPECT_TRUE(p.why.find("cudaErrorNotSupported") != std::string::npos);
        // Whatever was mapped is closed, and the exports freed after that.
        EXPECT_EQ(links.closes, 1);
        EXPECT_EQ(links.releases, 1);
      },
      std::chrono::seconds(30));
  EXPECT_TRUE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
}

SMDDP_TEST(a_failed_import_on_one_node_stages_every_node) {
  const std::string dir = test::tempDir();
  test::runRanks(
      4,
      [&](int rank) {
        test::DirStore store(dir, std::chrono::seconds(120));
        topology::Topology topo = shape(rank, 4, 2);
        DeviceSetup setup(topo, defaults());
        HostLinks links(str("host", rank / 2, "/gpu", rank % 2), topo.myLocalRank(), false,
                        /*fail_import=*/rank == 3);
        DevicePlan p = setup.plan(store, links);
        EXPECT_TRUE(p.mode == DeviceMode::kHostStaging);
        EXPECT_TRUE(p.why.find("rank 3 could not map the device memory of rank 2") != std::string::npos);
      },
      std::chrono::seconds(30));
}

SMDDP_TEST(cuda_ipc_off_links_nothing) {
  const std::string dir = test::tempDir();
  test::runRanks(
      2,
      [&](int rank) {
        test::DirStore store(dir, std::chrono::seconds(10));
        topology::Topology topo = shape(rank, 2, 1);
        Config c = defaults();
        c.cuda_ipc = false;
        DeviceSetup setup(topo, c);
        HostLinks links(str("host0/gpu", rank), rank);
        DevicePlan p = setup.plan(store, links);
        EXPECT_TRUE(p.mode == DeviceMode::kHostStaging);
        EXPECT_EQ(p.why, std::string("SMDDP_CUDA_IPC=off"));
        EXPECT_EQ(links.exports, 0);
      },
      std::chrono::seconds(30));
}

SMDDP_TEST(nodes_beyond_one_kernel_reduce_elsewhere) {
  for (int local : {1, 16, 17, 64}) {
    topology::Topology topo = shape(0, local, 1);
    DeviceSetup setup(topo, defaults());
    EXPECT_EQ(setup.reduceOnDevice(), local <= algorithm::kMaxDeviceSources);
  }
}

SMDDP_TEST(a_capture_is_refused_where_the_host_takes_part) {
  using algorithm::captureRefusal;
  // The host only enqueues: device flags, or no node peer to meet.
  EXPECT_EQ(captureRefusal(DeviceMode::kNode, true, 8), std::string());
  EXPECT_EQ(captureRefusal(DeviceMode::kRails, true, 16), std::string());
  EXPECT_EQ(captureRefusal(DeviceMode::kRails, false, 1), std::string());
  // Host rounds: what to set, or that nothing can be set.
  EXPECT_TRUE(captureRefusal(DeviceMode::kNode, false, 2).find("set SMDDP_CUDA_SYNC=device") != std::string::npos);
  EXPECT_TRUE(algorithm::deviceSyncServes(16) && !algorithm::deviceSyncServes(17));
  const std::string big = captureRefusal(DeviceMode::kRails, false, 17);
  EXPECT_TRUE(big.find("more than 16 ranks") != std::string::npos && big.find("SMDDP_CUDA_SYNC") == std::string::npos);
  // Host staging, whatever the synchronization.
  EXPECT_TRUE(captureRefusal(DeviceMode::kHostStaging, true, 1).find("through the host") != std::string::npos);
}

SMDDP_TEST(a_stuck_device_collective_names_what_it_waits_on) {
  // Node 1 of 2 x 2, local rank 1 (rank 3): its node's other rank and its rail.
  const std::string rails = algorithm::deviceWaitsOn(DeviceMode::kRails, shape(3, 4, 2));
  EXPECT_TRUE(rails.find("rank 2 of its node (CUDA IPC)") != std::string::npos);
  EXPECT_TRUE(rails.find("rank 1 of its rail on other nodes (NCCL)") != std::string::npos);
  EXPECT_TRUE(rails.find("not compared across nodes; TORCH_DISTRIBUTED_DEBUG=DETAIL") != std::string::npos);
  const std::string node = algorithm::deviceWaitsOn(DeviceMode::kNode, shape(0, 4, 1));
  EXPECT_TRUE(node.find("ranks 1, 2, 3 of its node (CUDA IPC)") != std::string::npos);
  EXPECT_TRUE(node.find("across nodes") == std::string::npos);
  // One rank per node: the rail is the group.
  const std::string flat = algorithm::deviceWaitsOn(DeviceMode::kRails, shape(1, 3, 3));
  EXPECT_TRUE(flat.find("ranks 0, 2 of its rail on other nodes (NCCL)") != std::string::npos);
  EXPECT_TRUE(flat.find("of its node") == std::string::npos);
  EXPECT_EQ(algorithm::deviceWaitsOn(DeviceMode::kHostStaging, shape(0, 4, 2)), std::string());
}
