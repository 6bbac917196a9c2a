// Every knob parses its documented forms and rejects the rest with a message
// that names the variable.
#include <map>

#include "algorithm/communicator.h"
#include "common/config.h"
#include "harness.h"
#include "transport/socket/socket_network.h"

using namespace smddp;

namespace {

Config withEnv(const std::map<std::string, std::string>& env) {
  return Config::fromEnv([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

} // namespace

SMDDP_TEST(defaults) {
  Config c = withEnv({});
  EXPECT_TRUE(c.algo == Algo::kAuto);
  EXPECT_EQ(c.chunk_bytes, size_t{1} << 20);
  EXPECT_EQ(c.ranks_per_node, 0);
  EXPECT_EQ(c.fallback, std::string("auto"));
  EXPECT_TRUE(c.shm);
  EXPECT_TRUE(c.single_copy == Tristate::kAuto);
  EXPECT_EQ(c.shm_slot_bytes, size_t{1} << 20);
}

SMDDP_TEST(parses_values) {
  Config c = withEnv({{"SMDDP_ALGO", "Hierarchical"},
                      {"SMDDP_CHUNK_BYTES", "256K"},
                      {"SMDDP_RANKS_PER_NODE", "2"},
                      {"SMDDP_SHM", "off"},
                      {"SMDDP_SINGLE_COPY", "on"},
                      {"SMDDP_SHM_SLOT_BYTES", "65536"},
                      {"SMDDP_SOCKET_PORTS", " 29600 - 29663"}});
  EXPECT_TRUE(c.algo == Algo::kHierarchical);
  EXPECT_EQ(c.socket_port_low, 29600);
  EXPECT_EQ(c.socket_port_high, 29663);
  EXPECT_EQ(withEnv({}).socket_port_low, 0);  // ephemeral
  EXPECT_EQ(withEnv({{"SMDDP_SOCKET_PORTS", "5000-5000"}}).socket_port_high, 5000);
  EXPECT_EQ(c.chunk_bytes, size_t{256} << 10);
  EXPECT_EQ(c.ranks_per_node, 2);
  EXPECT_TRUE(!c.shm);
  EXPECT_TRUE(c.single_copy == Tristate::kOn);
  EXPECT_EQ(c.shm_slot_bytes, size_t{65536});
}

SMDDP_TEST(rejects_bad_values_naming_the_variable) {
  EXPECT_THROWS(withEnv({{"SMDDP_ALGO", "tree"}}), kConfig, "SMDDP_ALGO='tree'");
  EXPECT_THROWS(withEnv({{"SMDDP_CHUNK_BYTES", "12Q"}}), kConfig, "SMDDP_CHUNK_BYTES");
  EXPECT_THROWS(withEnv({{"SMDDP_CHUNK_BYTES", "1K"}}), kConfig, "out of range");
  EXPECT_THROWS(withEnv({{"SMDDP_RANKS_PER_NODE", "-1"}}), kConfig, "SMDDP_RANKS_PER_NODE");
  EXPECT_THROWS(withEnv({{"SMDDP_RANKS_PER_NODE", "two"}}), kConfig, "not an integer");
  EXPECT_THROWS(withEnv({{"SMDDP_SHM", "maybe"}}), kConfig, "SMDDP_SHM");
  EXPECT_THROWS(withEnv({{"SMDDP_SHM_SLOT_BYTES", "4100"}}), kConfig, "multiple of 64");
  EXPECT_THROWS(withEnv({{"SMDDP_SOCKET_PORTS", "29600"}}), kConfig, "SMDDP_SOCKET_PORTS='29600': not LOW-HIGH");
  EXPECT_THROWS(withEnv({{"SMDDP_SOCKET_PORTS", "9-x"}}), kConfig, "'x' is not a port number");
  EXPECT_THROWS(withEnv({{"SMDDP_SOCKET_PORTS", "0-10"}}), kConfig, "0 is not a port number (1..65535)");
  EXPECT_THROWS(withEnv({{"SMDDP_SOCKET_PORTS", "1-70000"}}), kConfig, "70000 is not a port number");
  EXPECT_THROWS(withEnv({{"SMDDP_SOCKET_PORTS", "20-10"}}), kConfig, "LOW is above HIGH");
}

SMDDP_TEST(agreement_string_names_differences) {
  Config a = withEnv({});
  Config b = withEnv({{"SMDDP_ALGO", "ring"}, {"SMDDP_SPIN_US", "5"}});
  std::string diff = Config::describeDifference(a.agreementString(), b.agreementString());
  EXPECT_TRUE(diff.find("SMDDP_ALGO is 'auto' on one and 'ring' on the other") != std::string::npos);
  // Spinning is per rank: it may differ.
  EXPECT_TRUE(diff.find("SMDDP_SPIN_US") == std::string::npos);
  EXPECT_EQ(Config::describeDifference(a.agreementString(), a.agreementString()), std::string());
}

SMDDP_TEST(describe_lists_every_knob_once) {
  auto knobs = describeKnobs();
  EXPECT_TRUE(knobs.size() >= 10);
  for (size_t i = 0; i < knobs.size(); ++i) {
    EXPECT_TRUE(knobs[i].name.rfind("SMDDP_", 0) == 0);
    EXPECT_TRUE(!knobs[i].help.empty());
    for (size_t j = i + 1; j < knobs.size(); ++j) {
      EXPECT_TRUE(knobs[i].name != knobs[j].name);
    }
  }
}

SMDDP_TEST(auto_values_and_their_resolution) {
  Config c = withEnv({});
  EXPECT_EQ(c.spin_us, -1);
  EXPECT_EQ(c.yield_us, -1);
  EXPECT_EQ(c.single_copy_min_bytes, kAutoBytes);
  Config d = withEnv({{"SMDDP_SPIN_US", "Auto"}, {"SMDDP_YIELD_US", "7"},
                      {"SMDDP_SINGLE_COPY_MIN_BYTES", "64K"}});
  EXPECT_EQ(d.spin_us, -1);
  EXPECT_EQ(d.yield_us, 7);
  EXPECT_EQ(d.single_copy_min_bytes, size_t{64} << 10);
  EXPECT_THROWS(withEnv({{"SMDDP_YIELD_US", "soon"}}), kConfig, "neither auto nor an integer");
  EXPECT_THROWS(withEnv({{"SMDDP_SPIN_US", "-5"}}), kConfig, "out of range");
  EXPECT_THROWS(withEnv({{"SMDDP_SINGLE_COPY_MIN_BYTES", "lots"}}), kConfig,
                "SMDDP_SINGLE_COPY_MIN_BYTES");

  // Enough CPUs: spin, then yield briefly. More ranks than CPUs: yield at once.
  c.host_ranks = 2;
  c.host_cpus = 2;
  EXPECT_TRUE(!c.oversubscribed());
  auto p = algorithm::waitPolicyOf(c);
  EXPECT_EQ(p.spin_us, 20);
  EXPECT_EQ(p.yield_us, 20);
  c.host_ranks = 4;
  EXPECT_TRUE(c.oversubscribed());
  p = algorithm::waitPolicyOf(c);
  EXPECT_EQ(p.spin_us, 0);
  EXPECT_EQ(p.yield_us, 2000);
  // Explicit values win.
  d.host_ranks = 4;
  d.host_cpus = 2;
  p = algorithm::waitPolicyOf(d);
  EXPECT_EQ(p.spin_us, 0);
  EXPECT_EQ(p.yield_us, 7);
}

SMDDP_TEST(socket_receive_buffer_resolution) {
  transport::NetOptions net;
  Config c = withEnv({});
  EXPECT_EQ(c.socket_rcvbuf_bytes, kAutoBytes);
  // Ranks with cores of their own keep the kernel's autotuning.
  c.host_ranks = 2;
  c.host_cpus = 2;
  EXPECT_EQ(transport::socketOptions(c, net).rcvbuf_bytes, size_t{0});
  // Ranks taking turns on cores get the bound, where rmem_max allows it.
  c.host_ranks = 4;
  const size_t bound = transport::receiveBufferMax() >= (size_t{1} << 20) ? size_t{1} << 20 : 0;
  EXPECT_EQ(transport::socketOptions(c, net).rcvbuf_bytes, bound);
  // Explicit values win either way; 0 is autotuning.
  Config d = withEnv({{"SMDDP_SOCKET_RCVBUF_BYTES", "256K"}, {"SMDDP_SOCKET_STREAMS", "3"}});
  auto so = transport::socketOptions(d, net);
  EXPECT_EQ(so.rcvbuf_bytes, size_t{256} << 10);
  EXPECT_EQ(so.streams, 3);
  d = withEnv({{"SMDDP_SOCKET_RCVBUF_BYTES", "0"}});
  d.host_ranks = 4;
  d.host_cpus = 2;
  EXPECT_EQ(transport::socketOptions(d, net).rcvbuf_bytes, size_t{0});
  EXPECT_THROWS(withEnv({{"SMDDP_SOCKET_RCVBUF_BYTES", "2G"}}), kConfig, "SMDDP_SOCKET_RCVBUF_BYTES");
  EXPECT_THROWS(withEnv({{"SMDDP_SOCKET_RCVBUF_BYTES", "big"}}), kConfig, "SMDDP_SOCKET_RCVBUF_BYTES");
}
