// The network below the algorithms (transport/network.h), used only through
// its interfaces as the schedules use it: the factory resolves the rank's NIC
// and the knobs; a mesh is collective (also for a rank without peers), hands
// out a channel per peer that carries messages both ways and names the peer
// and the NIC; an abort reaches every peer; a shutdown from another thread
// fails a blocked wait at once; two meshes of one network live side by side.
#include <chrono>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "common/config.h"
#include "harness.h"
#include "transport/network.h"
#include "transport/socket/socket_network.h"

using namespace smddp;
using namespace smddp::transport;

namespace {

Config configWith(std::map<std::string, std::string> env) {
  return Config::fromEnv([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

NetOptions loopback() {
  NetOptions net;
  net.store_host = "127.0.0.1";
  net.timeout = std::chrono::seconds(20);
  return net;
}

// Sends `out` to and receives `in` from `peer` over `mesh`, as a schedule does.
void exchange(Mesh& mesh, int peer, const std::vector<uint32_t>& out, std::vector<uint32_t>* in, uint64_t seq) {
  Channel& ch = mesh.channel(peer);
  const uint64_t sends = ch.sendsDone();
  const uint64_t recvs = ch.recvsDone();
  ch.postRecv(in->data(), in->size() * 4, test::gatherTag(seq, in->size()));
  ch.postSend(out.data(), out.size() * 4, test::gatherTag(seq, out.size()));
  drive({&ch}, nullptr, [&] { return ch.sendsDone() == sends + 1 && ch.recvsDone() == recvs + 1; },
        Deadline::after(std::chrono::seconds(10)), DriveOptions{});
}

} // namespace

SMDDP_TEST(the_factory_resolves_the_nic_and_the_knobs) {
  // No NIC given: the list's first entry, or the route to the store's host.
  auto net = createNetwork(configWith({{"SMDDP_SOCKET_IFNAME", "127.0.0.2,127.0.0.3"}}), loopback());
  EXPECT_EQ(std::string(net->transport()), std::string("tcp"));
  EXPECT_EQ(net->nic().str(), std::string("lo (127.0.0.2)"));
  EXPECT_EQ(createNetwork(configWith({}), loopback())->nic().name, std::string("lo"));
  // The NIC the caller chose from the rank's place on its host wins.
  NetOptions given = loopback();
  given.nic = chooseNic("127.0.0.2,127.0.0.3", 1, 2, "");
  net = createNetwork(configWith({{"SMDDP_SOCKET_IFNAME", "127.0.0.2,127.0.0.3"}}), given);
  EXPECT_EQ(net->nic().host(), std::string("127.0.0.3"));
  // The transport's knobs travel with it.
  auto* tcp = dynamic_cast<SocketNetwork*>(
      createNetwork(configWith({{"SMDDP_SOCKET_STREAMS", "3"}, {"SMDDP_SOCKET_RCVBUF_BYTES", "256K"}}), loopback())
          .release());
  EXPECT_TRUE(tcp != nullptr);
  if (tcp != nullptr) {
    EXPECT_EQ(tcp->options().streams, 3);
    EXPECT_EQ(tcp->options().rcvbuf_bytes, size_t{256} << 10);
    EXPECT_EQ(tcp->options().timeout.count(), int64_t{20000});
    delete tcp;
  }
  // A list that names no NIC of this host fails with the variable's name.
  EXPECT_THROWS(createNetwork(configWith({{"SMDDP_SOCKET_IFNAME", "nosuchnic0"}}), loopback()), kConfig,
                "SMDDP_SOCKET_IFNAME='nosuchnic0'");
}

SMDDP_TEST(a_mesh_hands_out_channels_to_its_peers) {
  // Ranks 0 and 1 on their own NICs talk; rank 2 has no peers and still
  // takes part in the set-up; a second mesh of the same network runs beside
  // the first.
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(3, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    NetOptions opts = loopback();
    opts.nic = chooseNic("127.0.0.2,127.0.0.3,127.0.0.4", rank, 3, "");
    std::unique_ptr<Network> net = createNetwork(configWith({{"SMDDP_SOCKET_STREAMS", "2"}}), opts);
    const std::vector<int> peers = rank == 2 ? std::vector<int>{} : std::vector<int>{1 - rank};
    std::unique_ptr<Mesh> a = net->connect(store, "a", rank, peers);
    std::unique_ptr<Mesh> b = net->connect(store, "b", rank, peers);
    EXPECT_EQ(a->nic().host(), net->nic().host());
    if (rank == 2) {
      EXPECT_TRUE(!a->has(0) && !a->has(1));
      EXPECT_EQ(a->describePeer(0), std::string("rank 0"));
      return;
    }
    const int peer = 1 - rank;
    EXPECT_TRUE(a->has(peer) && !a->has(2));
    const std::string who = a->describePeer(peer);
    EXPECT_EQ(who.rfind(str("rank ", peer, " (other node, 127.0.0.", peer + 2, ":"), 0), size_t{0});
    EXPECT_TRUE(who.find(str(" from lo (127.0.0.", rank + 2, ")")) != std::string::npos);
    for (uint64_t seq = 1; seq <= 3; ++seq) {
      std::vector<uint32_t> out(1000 + seq * 777, static_cast<uint32_t>(rank * 100 + seq));
      std::vector<uint32_t> in(1000 + seq * 777, 0);
      exchange(seq == 2 ? *b : *a, peer, out, &in, seq);
      EXPECT_EQ(in.front(), static_cast<uint32_t>(peer * 100 + seq));
      EXPECT_EQ(in.back(), static_cast<uint32_t>(peer * 100 + seq));
    }
  });
}

SMDDP_TEST(an_abort_reaches_every_peer) {
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(3, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    auto net = createNetwork(configWith({}), loopback());
    std::vector<int> peers;
    for (int p = 0; p < 3; ++p) {
      if (p != rank) {
        peers.push_back(p);
      }
    }
    auto mesh = net->connect(store, "abort", rank, peers);
    if (rank == 1) {
      mesh->sendAbortAll("it ran out of memory");
      store.set(str("read", 0), {1});
      store.get("read0-done");
      store.get("read2-done");
      return;
    }
    store.get(str("read", 0));
    Channel& ch = mesh->channel(1);
    std::vector<uint8_t> in(16);
    ch.postRecv(in.data(), in.size(), test::gatherTag(1, 16));
    EXPECT_THROWS(
        drive({&ch}, nullptr, [&] { return ch.recvsDone() == 1; }, Deadline::after(std::chrono::seconds(5)),
              DriveOptions{}),
        kAborted, "rank 1 (other node) failed: it ran out of memory");
    store.set(str("read", rank, "-done"), {1});
  });
}

SMDDP_TEST(a_shutdown_from_another_thread_fails_a_blocked_wait_at_once) {
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(2, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    auto net = createNetwork(configWith({}), loopback());
    auto mesh = net->connect(store, "cut", rank, {1 - rank});
    if (rank == 1) {
      store.get("cut-done");  // silent, but alive, until rank 0 is done
      return;
    }
    Channel& ch = mesh->channel(1);
    std::vector<uint8_t> in(16);
    ch.postRecv(in.data(), in.size(), test::gatherTag(1, 16));
    std::thread cutter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      mesh->shutdownAll("rank 0 aborted the group");
    });
    const auto t0 = std::chrono::steady_clock::now();
    // The cause is this rank's own, not the peer's.
    EXPECT_THROWS(
        drive({&ch}, nullptr, [&] { return ch.recvsDone() == 1; }, Deadline::after(std::chrono::seconds(20)),
              DriveOptions{}),
        kAborted, "rank 0 aborted the group");
    EXPECT_TRUE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
    cutter.join();
    store.set("cut-done", {1});
  });
}
