// The socket transport: SipHash against its published vector, the frame
// parser on malformed input, a mesh whose listener is probed by strangers
// during set-up, messages both ways, and the errors a peer causes (wrong
// size, abort, exit); every connection is kept alive. Each rank's NIC: the
// spread of local ranks over SMDDP_SOCKET_IFNAME's entries, its errors, and
// connections bound to the NIC's address (two NICs on loopback).
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include "common/config.h"
#include "harness.h"
#include "transport/socket/frame.h"
#include "transport/socket/siphash.h"
#include "transport/socket/socket_mesh.h"
#include "transport/socket/socket_util.h"

using namespace smddp;
using namespace smddp::transport;

SMDDP_TEST(siphash_reference_vectors) {
  // Key 00..0f; messages 00..(n-1) (Aumasson and Bernstein, appendix A).
  SipKey key;
  uint8_t k[16];
  for (int i = 0; i < 16; ++i) {
    k[i] = static_cast<uint8_t>(i);
  }
  std::memcpy(&key.k0, k, 8);
  std::memcpy(&key.k1, k + 8, 8);
  uint8_t msg[15];
  for (int i = 0; i < 15; ++i) {
    msg[i] = static_cast<uint8_t>(i);
  }
  EXPECT_EQ(siphash24(key, msg, 0), 0x726fdb47dd0e0e31ull);
  EXPECT_EQ(siphash24(key, msg, 15), 0xa129ca6149be45e5ull);
}

SMDDP_TEST(frame_parser_rejects_malformed_headers) {
  SipKey key{1, 2};
  FrameHeader h;
  h.type = FrameType::kData;
  h.tag = test::gatherTag(7, 99);
  h.from = 3;
  h.length = 1 << 20;
  uint8_t buf[kFrameHeaderBytes];
  encodeFrameHeader(h, key, buf);
  FrameHeader out;
  EXPECT_EQ(decodeFrameHeader(buf, key, &out), std::string());
  EXPECT_EQ(out.tag.seq, uint64_t{7});
  EXPECT_TRUE(out.tag.sameCall(h.tag));
  EXPECT_EQ(out.length, uint64_t{1} << 20);

  // Every single-byte corruption is caught (magic, version, fields, check).
  for (size_t i = 0; i < kFrameHeaderBytes; ++i) {
    uint8_t bad[kFrameHeaderBytes];
    std::memcpy(bad, buf, sizeof(bad));
    bad[i] ^= 0x40;
    EXPECT_TRUE(!decodeFrameHeader(bad, key, &out).empty());
  }
  // A header made with another key: not from this group.
  EXPECT_TRUE(decodeFrameHeader(buf, SipKey{1, 3}, &out).find("check") != std::string::npos);
  // An abort frame that claims a huge message is refused before any read.
  h.type = FrameType::kAbort;
  h.length = kMaxAbortBytes + 1;
  encodeFrameHeader(h, key, buf);
  EXPECT_TRUE(decodeFrameHeader(buf, key, &out).find("abort message") != std::string::npos);
  // Random junk never parses.
  std::mt19937 rng(5);
  for (int i = 0; i < 10000; ++i) {
    for (auto& b : buf) {
      b = static_cast<uint8_t>(rng());
    }
    EXPECT_TRUE(!decodeFrameHeader(buf, key, &out).empty());
  }
}

SMDDP_TEST(connections_are_kept_alive) {
  // Both ends of a connection: a host that vanishes without closing its
  // sockets fails them by keepalive, not at the group's timeout.
  SockAddr addr = SockAddr::parse("127.0.0.1:0");
  Fd listener = listenOn(&addr);
  Fd client = connectTo(addr, Deadline::after(std::chrono::seconds(5)));
  Fd server = acceptOne(listener.get(), Deadline::after(std::chrono::seconds(5)));
  EXPECT_TRUE(server.get() >= 0);
  for (int fd : {client.get(), server.get()}) {
    auto opt = [fd](int level, int name) {
      int v = -1;
      socklen_t len = sizeof(v);
      EXPECT_EQ(::getsockopt(fd, level, name, &v, &len), 0);
      return v;
    };
    EXPECT_EQ(opt(SOL_SOCKET, SO_KEEPALIVE), 1);
    EXPECT_EQ(opt(IPPROTO_TCP, TCP_KEEPIDLE), kKeepIdleS);
    EXPECT_EQ(opt(IPPROTO_TCP, TCP_KEEPINTVL), kKeepIntervalS);
    EXPECT_EQ(opt(IPPROTO_TCP, TCP_KEEPCNT), kKeepCount);
    EXPECT_EQ(opt(IPPROTO_TCP, TCP_NODELAY), 1);
  }
}

namespace {

// Where `rank` of the mesh "mesh" listens, once it does.
SockAddr listeningAddress(Store& store, int rank) {
  std::vector<uint8_t> published;
  std::string why;
  EXPECT_TRUE(untag(store.get(str("mesh/addr/", rank)), &published, &why));
  return SockAddr::parse(toString(published));
}

// Connects to `addr` and sends junk, as a stranger on the network would.
void stranger(const SockAddr& addr, int variant) {
  try {
    Fd c = connectTo(addr, Deadline::after(std::chrono::seconds(5)));
    if (variant == 0) {
      const char junk[] = "GET / HTTP/1.0\r\n\r\n";
      ::send(c.get(), junk, sizeof(junk), MSG_NOSIGNAL);
    } else if (variant == 1) {
      std::vector<uint8_t> junk(4096, 0xff);
      ::send(c.get(), junk.data(), junk.size(), MSG_NOSIGNAL);
    }
    // variant 2: connects and says nothing (until the handshake times out).
    std::this_thread::sleep_for(std::chrono::milliseconds(variant == 2 ? 300 : 50));
  } catch (const Error&) {
  }
}

} // namespace

SMDDP_TEST(strangers_are_dropped_and_peers_talk) {
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(2, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    SocketMesh::Options o;
    o.peer_hint = "127.0.0.1";
    o.streams = 2;
    o.timeout = std::chrono::seconds(20);
    if (rank == 1) {
      // Rank 1 listens; strangers knock before rank 0 connects.
      std::thread t([&] {
        const SockAddr addr = listeningAddress(store, 1);
        for (int v = 0; v < 3; ++v) {
          stranger(addr, v);
        }
        store.set("strangers-done", {1});
      });
      SocketMesh mesh(store, "mesh", 1, {0}, o);
      t.join();
      SocketChannel& ch = mesh.channel(0);
      std::vector<uint32_t> in(1000), out(3000, 7);
      for (size_t i = 0; i < in.size(); ++i) {
        in[i] = static_cast<uint32_t>(i * 3);
      }
      MessageTag tag = test::gatherTag(1, 42);
      ch.postRecv(out.data(), out.size() * 4, tag);
      ch.postSend(in.data(), in.size() * 4, tag);
      drive({&ch}, nullptr, [&] { return ch.sendsDone() == 1 && ch.recvsDone() == 1; },
            Deadline::after(std::chrono::seconds(10)), DriveOptions{});
      for (size_t i = 0; i < out.size(); ++i) {
        EXPECT_EQ(out[i], static_cast<uint32_t>(i + 1));
      }
    } else {
      store.get("strangers-done");
      SocketMesh mesh(store, "mesh", 0, {1}, o);
      SocketChannel& ch = mesh.channel(1);
      std::vector<uint32_t> in(3000), out(1000, 0);
      for (size_t i = 0; i < in.size(); ++i) {
        in[i] = static_cast<uint32_t>(i + 1);
      }
      MessageTag tag = test::gatherTag(1, 42);
      ch.postSend(in.data(), in.size() * 4, tag);
      ch.postRecv(out.data(), out.size() * 4, tag);
      drive({&ch}, nullptr, [&] { return ch.sendsDone() == 1 && ch.recvsDone() == 1; },
            Deadline::after(std::chrono::seconds(10)), DriveOptions{});
      EXPECT_EQ(out[999], 2997u);
    }
  });
}

SMDDP_TEST(bounded_receive_buffers_carry_large_messages) {
  // A receive buffer far smaller than the messages: every message crosses in
  // many partial reads and writes, on both streams, both ways at once.
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(2, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    SocketMesh::Options o;
    o.peer_hint = "127.0.0.1";
    o.streams = 2;
    o.rcvbuf_bytes = 16 << 10;
    SocketMesh mesh(store, "mesh", rank, {1 - rank}, o);
    SocketChannel& ch = mesh.channel(1 - rank);
    const size_t words = (size_t{3} << 20) + 5;
    std::vector<uint32_t> in(words), out(2 * words, 0);
    for (size_t i = 0; i < words; ++i) {
      in[i] = static_cast<uint32_t>(i * 2654435761u) ^ static_cast<uint32_t>(rank);
    }
    MessageTag tag = test::gatherTag(3, words * 4);
    for (int m = 0; m < 2; ++m) {
      ch.postRecv(out.data() + static_cast<size_t>(m) * words, words * 4, tag);
      ch.postSend(in.data(), words * 4, tag);
    }
    drive({&ch}, nullptr, [&] { return ch.sendsDone() == 2 && ch.recvsDone() == 2; },
          Deadline::after(std::chrono::seconds(20)), DriveOptions{});
    for (size_t i = 0; i < 2 * words; ++i) {
      const uint32_t want = static_cast<uint32_t>((i % words) * 2654435761u) ^ static_cast<uint32_t>(1 - rank);
      if (out[i] != want) {
        EXPECT_EQ(out[i], want);
        break;
      }
    }
    // The bound held through the transfer (autotuning would have grown it).
    EXPECT_EQ(ch.receiveBufferBytes(), size_t{32} << 10);
  });
}

SMDDP_TEST(peer_errors_are_reported) {
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(2, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    SocketMesh::Options o;
    o.peer_hint = "127.0.0.1";
    SocketMesh mesh(store, "mesh", rank, {1 - rank}, o);
    SocketChannel& ch = mesh.channel(1 - rank);
    auto run = [&](size_t bytes, uint32_t call) {
      std::vector<uint8_t> in(bytes), out(bytes);
      ch.postSend(in.data(), in.size(), test::gatherTag(5, bytes + call));
      ch.postRecv(out.data(), out.size(), test::gatherTag(5, bytes + call));
      drive({&ch}, nullptr, [&] { return ch.sendsDone() == 1 && ch.recvsDone() == 1; },
            Deadline::after(std::chrono::seconds(5)), DriveOptions{});
    };
    // The ranks disagree on the size: each receiver names both sizes.
    EXPECT_THROWS(run(rank == 0 ? 100 : 200, 9), kMismatch,
                  rank == 0 ? "rank 1 sent 200 bytes of #5 allgather(uint8, 209 elements), rank 0 expected 100 bytes"
                            : "rank 0 sent 100 bytes of #5 allgather(uint8, 109 elements), rank 1 expected 200 bytes");
  });
  dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(
      2,
      [&](int rank) {
        ::smddp::test::DirStore store(dir);
        SocketMesh::Options o;
        o.peer_hint = "127.0.0.1";
        SocketMesh mesh(store, "mesh", rank, {1 - rank}, o);
        SocketChannel& ch = mesh.channel(1 - rank);
        if (rank == 1) {
          ch.sendAbort("it ran out of memory");
          store.set("aborted", {1});
          return;
        }
        store.get("aborted");
        std::vector<uint8_t> out(16);
        ch.postRecv(out.data(), out.size(), test::gatherTag(1, 16));
        EXPECT_THROWS(
            drive({&ch}, nullptr, [&] { return ch.recvsDone() == 1; }, Deadline::after(std::chrono::seconds(5)),
                  DriveOptions{}),
            kAborted, "rank 1 (other node) failed: it ran out of memory");
      });
  dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(
      2,
      [&](int rank) {
        ::smddp::test::DirStore store(dir);
        SocketMesh::Options o;
        o.peer_hint = "127.0.0.1";
        SocketMesh mesh(store, "mesh", rank, {1 - rank}, o);
        if (rank == 1) {
          ::_exit(0);  // gone without a word
        }
        SocketChannel& ch = mesh.channel(1);
        std::vector<uint8_t> out(16);
        ch.postRecv(out.data(), out.size(), test::gatherTag(1, 16));
        auto t0 = std::chrono::steady_clock::now();
        EXPECT_THROWS(
            drive({&ch}, nullptr, [&] { return ch.recvsDone() == 1; }, Deadline::after(std::chrono::seconds(20)),
                  DriveOptions{}),
            kPeerLost, "rank 1");
        EXPECT_TRUE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
      },
      std::chrono::seconds(30),
      [](int rank) { return rank == 1; });
}

// ------------------------------------------------------------ the NIC of each rank

SMDDP_TEST(local_ranks_spread_over_the_listed_nics) {
  // p4d: 8 ranks, 4 NICs: ranks 0-1 on the first, 2-3 on the second, ...
  for (int l = 0; l < 8; ++l) {
    EXPECT_EQ(nicIndex(l, 8, 4), static_cast<size_t>(l / 2));
  }
  EXPECT_EQ(nicIndex(0, 2, 2), size_t{0});
  EXPECT_EQ(nicIndex(1, 2, 2), size_t{1});
  EXPECT_EQ(nicIndex(1, 2, 4), size_t{2});  // fewer ranks than NICs
  EXPECT_EQ(nicIndex(2, 3, 2), size_t{1});
  EXPECT_EQ(nicIndex(1, 3, 2), size_t{0});
  EXPECT_EQ(nicIndex(5, 6, 1), size_t{0});
  EXPECT_EQ(nicIndex(9, 4, 2), size_t{1});  // a place past the host: the last
}

SMDDP_TEST(nic_choice_names_the_variable_and_the_hosts_interfaces) {
  Nic a = chooseNic("127.0.0.2,127.0.0.3", 0, 2, "");
  Nic b = chooseNic("127.0.0.2,127.0.0.3", 1, 2, "");
  EXPECT_EQ(a.host(), std::string("127.0.0.2"));
  EXPECT_EQ(b.host(), std::string("127.0.0.3"));
  EXPECT_EQ(b.name, std::string("lo"));  // the interface whose subnet holds it
  EXPECT_EQ(b.str(), std::string("lo (127.0.0.3)"));
  Nic byname = chooseNic("lo", 1, 2, "");
  EXPECT_EQ(byname.str(), std::string("lo (127.0.0.1)"));
  // Empty: the route to the store's host.
  EXPECT_EQ(chooseNic("", 0, 1, "127.0.0.1").name, std::string("lo"));
  // Every entry is checked, also those of other local ranks.
  EXPECT_THROWS(chooseNic("lo,nosuchnic0", 0, 2, ""), kConfig, "SMDDP_SOCKET_IFNAME='lo,nosuchnic0': 'nosuchnic0'");
  EXPECT_THROWS(chooseNic("nosuchnic0", 0, 1, ""), kConfig, "This host has: ");
  EXPECT_THROWS(chooseNic("nosuchnic0", 0, 1, ""), kConfig, "lo 127.0.0.1");
  // An address this host does not own (TEST-NET-1) is no NIC of it.
  EXPECT_THROWS(chooseNic("192.0.2.7", 0, 1, ""), kConfig, "no interface of this host has that address");
  EXPECT_THROWS(chooseNic("lo,", 0, 1, ""), kConfig, "an entry is empty");
  std::string why;
  EXPECT_TRUE(interfaceRunning("lo", &why));
  EXPECT_TRUE(!interfaceRunning("nosuchnic0", &why));
  EXPECT_TRUE(why.find("nosuchnic0") != std::string::npos);
}

SMDDP_TEST(the_knob_takes_a_list_of_interfaces_or_addresses) {
  auto with = [](const char* value) {
    return Config::fromEnv([value](const char* name) -> const char* {
      return std::string(name) == "SMDDP_SOCKET_IFNAME" ? value : nullptr;
    });
  };
  EXPECT_EQ(with(" eth0 , 10.0.0.3,fe80::1 ").socket_ifname, std::string("eth0,10.0.0.3,fe80::1"));
  EXPECT_EQ(with("").socket_ifname, std::string());
  EXPECT_THROWS(with("eth0,,eth1"), kConfig, "SMDDP_SOCKET_IFNAME='eth0,,eth1': an entry is empty");
  EXPECT_THROWS(with("eth 0"), kConfig, "'eth 0' is neither an interface name nor an address");
  EXPECT_THROWS(with("averyveryverylongname"), kConfig, "SMDDP_SOCKET_IFNAME");
}

SMDDP_TEST(connections_leave_from_the_ranks_nic) {
  // Two NICs on loopback: without the binding, a connection to 127.0.0.3
  // would come from 127.0.0.1 (the loopback route's source address).
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(
      2,
      [&](int rank) {
        ::smddp::test::DirStore store(dir);
        SocketMesh::Options o;
        o.nic = chooseNic("127.0.0.2,127.0.0.3", rank, 2, "");
        o.streams = 2;
        o.timeout = std::chrono::seconds(20);
        SocketMesh mesh(store, "mesh", rank, {1 - rank}, o);
        EXPECT_EQ(mesh.nic().host(), std::string(rank == 0 ? "127.0.0.2" : "127.0.0.3"));
        EXPECT_EQ(mesh.listenAddress().rfind(rank == 0 ? "127.0.0.2:" : "127.0.0.3:", 0), size_t{0});
        const std::string peer = mesh.describePeer(1 - rank);
        if (rank == 1) {
          // Rank 1 may die: rank 0 checks what it saw.
          store.set("seen", toBytes(peer));
          ::_exit(0);  // gone without a word
        }
        // Rank 0 connected: rank 1 saw its connections come from 127.0.0.2.
        const std::string seen = toString(store.get("seen"));
        EXPECT_EQ(seen.rfind("rank 0 (other node, 127.0.0.2:", 0), size_t{0});
        EXPECT_TRUE(seen.find(" from lo (127.0.0.3)") != std::string::npos);
        EXPECT_EQ(peer.rfind("rank 1 (other node, 127.0.0.3:", 0), size_t{0});
        EXPECT_TRUE(peer.find(" from lo (127.0.0.2)") != std::string::npos);
        // A failure names the peer, its address and this rank's NIC.
        SocketChannel& ch = mesh.channel(1);
        std::vector<uint8_t> out(16);
        ch.postRecv(out.data(), out.size(), test::gatherTag(1, 16));
        EXPECT_THROWS(
            drive({&ch}, nullptr, [&] { return ch.recvsDone() == 1; }, Deadline::after(std::chrono::seconds(20)),
                  DriveOptions{}),
            kPeerLost, "connection to rank 1 (other node, 127.0.0.3:");
        EXPECT_EQ(mesh.describePeer(7), std::string("rank 7"));
      },
      std::chrono::seconds(30),
      [](int rank) { return rank == 1; });
}

SMDDP_TEST(stall_time_follows_the_groups_timeout) {
  using std::chrono::milliseconds;
  EXPECT_EQ(SocketMesh::stallTimeout(milliseconds(20000)).count(), int64_t{10000});
  EXPECT_EQ(SocketMesh::stallTimeout(milliseconds(500)).count(), int64_t{1000});
  EXPECT_EQ(SocketMesh::stallTimeout(milliseconds(1800000)).count(), int64_t{1000} * (kKeepIdleS + kKeepIntervalS * kKeepCount));
}

namespace {

// An address on loopback where nothing listens (a listener's, closed).
SockAddr closedPort() {
  SockAddr addr = SockAddr::parse("127.0.0.1:0");
  Fd gone = listenOn(&addr);
  return addr;
}

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

} // namespace

SMDDP_TEST(a_refused_connection_fails_after_the_patience_not_the_deadline) {
  // A peer listens before it publishes its address: a refusal that lasts is
  // the path's (a firewall, a wrong address), and is named as such.
  const SockAddr addr = closedPort();
  int calls = 0;
  const auto start = Clock::now();
  EXPECT_THROWS(connectTo(addr, Deadline::after(std::chrono::seconds(20)), nullptr, std::chrono::milliseconds(400),
                          [&] { ++calls; }),
                kComm, "Connection refused");
  EXPECT_TRUE(secondsSince(start) >= 0.4 && secondsSince(start) < 5);
  EXPECT_TRUE(calls >= 3);  // between the retries
  // Without patience the deadline bounds it, as a timeout.
  EXPECT_THROWS(connectTo(addr, Deadline::after(std::chrono::milliseconds(300))), kTimeout, "in time");
  // What runs between the tries can give up at once.
  EXPECT_THROWS(connectTo(addr, Deadline::after(std::chrono::seconds(20)), nullptr, std::chrono::seconds(10),
                          [] { SMDDP_THROW(kAborted, "told to stop"); }),
                kAborted, "told to stop");
}

SMDDP_TEST(an_unanswered_connection_fails_after_the_patience) {
  // A listener whose queue is full drops new SYNs: nothing answers, as
  // behind a firewall that drops them. Blocking connect() would wait for
  // the kernel's SYN retries (minutes); the patience bounds it.
  SockAddr addr = SockAddr::parse("127.0.0.1:0");
  Fd full(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_EQ(::bind(full.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len), 0);
  EXPECT_EQ(::listen(full.get(), 0), 0);
  addr.len = sizeof(addr.storage);
  EXPECT_EQ(::getsockname(full.get(), reinterpret_cast<sockaddr*>(&addr.storage), &addr.len), 0);
  Fd first = connectTo(addr, Deadline::after(std::chrono::seconds(5)));  // fills the queue
  int calls = 0;
  const auto start = Clock::now();
  EXPECT_THROWS(connectTo(addr, Deadline::after(std::chrono::seconds(60)), nullptr, std::chrono::milliseconds(700),
                          [&] { ++calls; }),
                kComm, "nothing answered");
  EXPECT_TRUE(secondsSince(start) >= 0.7 && secondsSince(start) < 5);
  EXPECT_TRUE(calls >= 3);  // while the attempt waits
}

SMDDP_TEST(a_rank_that_cannot_connect_fails_every_rank_of_its_mesh_at_once) {
  // Rank 0 cannot reach rank 1; rank 1 waits for rank 0's connections, and
  // rank 2 for rank 0's and rank 1's: every rank fails within seconds of
  // rank 0's patience, naming rank 0 and the path, not at the 30 s timeout.
  std::string dir = ::smddp::test::tempDir();
  const std::string wrong = closedPort().str();
  ::smddp::test::runRanks(3, [&](int rank) {
    ::smddp::test::DirStore files(dir);
    // Rank 0 is handed a closed port for rank 1: a path that refuses, as a
    // firewall or a NIC the hosts do not share would.
    ::smddp::test::LyingStore lying(files, "mesh/addr/1", taggedValue(toBytes(wrong)));
    Store& store = rank == 0 ? static_cast<Store&>(lying) : files;
    SocketMesh::Options o;
    o.peer_hint = "127.0.0.1";
    o.streams = 2;
    o.timeout = std::chrono::seconds(30);
    o.connect_patience = std::chrono::milliseconds(500);
    std::vector<int> peers;
    for (int p = 0; p < 3; ++p) {
      if (p != rank) {
        peers.push_back(p);
      }
    }
    const auto start = Clock::now();
    std::string what;
    try {
      SocketMesh mesh(store, "mesh", rank, peers, o);
    } catch (const Error& e) {
      EXPECT_TRUE(e.kind() == ErrorKind::kComm);
      what = e.what();
    }
    EXPECT_TRUE(secondsSince(start) < 8);
    EXPECT_TRUE(what.find(rank == 0 ? str("connecting to rank 1 at ", wrong) : std::string("rank 0 could not connect")) !=
                std::string::npos);
    // The cause reaches the others whole: the path, why, and what to do.
    EXPECT_TRUE(what.find("Connection refused") != std::string::npos);
    EXPECT_TRUE(what.find("SMDDP_SOCKET_IFNAME") != std::string::npos);
  }, std::chrono::seconds(60));
}

SMDDP_TEST(a_peer_that_never_connects_is_named_at_the_timeout) {
  // Rank 0 never creates its part of the mesh: rank 1, waiting for its
  // connections, names it and the address it waited on.
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::DirStore store(dir);
  SocketMesh::Options o;
  o.peer_hint = "127.0.0.1";
  o.timeout = std::chrono::milliseconds(1500);
  store.set("mesh/secret", std::vector<uint8_t>(sizeof(SipKey), 1));
  EXPECT_THROWS(SocketMesh(store, "mesh", 1, {0}, o), kTimeout,
                "only 0 of 1 expected connections from other nodes arrived at 127.0.0.1:");
  try {
    SocketMesh mesh(store, "mesh", 1, {0}, o);
  } catch (const Error& e) {
    EXPECT_TRUE(std::string(e.what()).find("(missing: rank 0;") != std::string::npos);
  }
}

namespace {

// The lower of two adjacent loopback ports found free (held, then let go); 0
// if none were found.
int adjacentFreePorts() {
  for (int tries = 0; tries < 50; ++tries) {
    SockAddr a = SockAddr::parse("127.0.0.1:0");
    Fd first = listenOn(&a);
    SockAddr b = SockAddr::parse("127.0.0.1:0");
    b.setPort(a.port() + 1);
    Fd second(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (a.port() < 65535 && ::bind(second.get(), reinterpret_cast<const sockaddr*>(&b.storage), b.len) == 0) {
      return a.port();
    }
  }
  return 0;
}

} // namespace

SMDDP_TEST(listeners_take_free_ports_of_a_range) {
  // A firewall admits only some ports: each listener takes a free one of
  // them, and when none is left the error says what to widen.
  const int low = adjacentFreePorts();
  EXPECT_TRUE(low > 0);
  const int high = low + 1;
  std::set<int> ports;
  std::vector<Fd> held;
  for (int i = 0; i < 2; ++i) {
    SockAddr a = SockAddr::parse("127.0.0.1:0");
    held.push_back(listenOn(&a, low, high));
    EXPECT_TRUE(a.port() >= low && a.port() <= high);
    ports.insert(a.port());
  }
  EXPECT_EQ(ports.size(), size_t{2});
  SockAddr a = SockAddr::parse("127.0.0.1:0");
  EXPECT_THROWS(listenOn(&a, low, high), kComm,
                str("no free port in SMDDP_SOCKET_PORTS=", low, "-", high, " on 127.0.0.1 (all 2 are in use): widen"));
}

namespace {

// listen() calls to fail as if another process had begun to listen on the
// port first (sockets that do not listen yet may share one).
std::atomic<int> listens_to_fail{0};

} // namespace

extern "C" int listen(int fd, int backlog) {
  static auto real = reinterpret_cast<int (*)(int, int)>(::dlsym(RTLD_NEXT, "listen"));
  if (listens_to_fail.load() > 0) {
    listens_to_fail.fetch_sub(1);
    errno = EADDRINUSE;
    return -1;
  }
  return real(fd, backlog);
}

SMDDP_TEST(a_port_another_rank_began_to_listen_on_is_skipped) {
  // Ranks of one host take ports of a range at once: one whose listen()
  // comes second on a port takes the next port of the range.
  const int low = adjacentFreePorts();
  EXPECT_TRUE(low > 0);
  listens_to_fail = 1;
  SockAddr got = SockAddr::parse("127.0.0.1:0");
  Fd mine = listenOn(&got, low, low + 1);
  EXPECT_TRUE(got.port() == low || got.port() == low + 1);
  EXPECT_EQ(listens_to_fail.load(), 0);
  mine.reset();
  // With no other port left the range is full.
  listens_to_fail = 1;
  SockAddr none = SockAddr::parse("127.0.0.1:0");
  EXPECT_THROWS(listenOn(&none, low, low), kComm, str("no free port in SMDDP_SOCKET_PORTS=", low, "-", low));
  listens_to_fail = 0;
}

SMDDP_TEST(a_rank_out_of_descriptors_fails_to_accept_with_the_cause) {
  // accept() failing for this process's own reason (no descriptor left) is
  // an error naming it, not a connection that never arrives: the pending
  // connection would keep the listener readable and the wait would spin.
  ::smddp::test::runRanks(1, [](int) {
    SockAddr a = SockAddr::parse("127.0.0.1:0");
    Fd listener = listenOn(&a);
    Fd client = connectTo(a, Deadline::after(std::chrono::seconds(5)));
    struct rlimit lim {};
    EXPECT_EQ(::getrlimit(RLIMIT_NOFILE, &lim), 0);
    lim.rlim_cur = static_cast<rlim_t>(std::max(listener.get(), client.get()) + 1);
    EXPECT_EQ(::setrlimit(RLIMIT_NOFILE, &lim), 0);
    std::vector<Fd> fill;
    for (int fd; (fd = ::dup(0)) >= 0;) {
      fill.emplace_back(fd);
    }
    EXPECT_THROWS(acceptOne(listener.get(), Deadline::after(std::chrono::seconds(5))), kComm, "Too many open files");
    try {
      acceptOne(listener.get(), Deadline::after(std::chrono::seconds(5)));
    } catch (const Error& e) {
      EXPECT_TRUE(std::string(e.what()).find("ulimit -n") != std::string::npos);
    }
  }, std::chrono::seconds(30));
}

SMDDP_TEST(silent_connections_do_not_hold_up_the_peers) {
  // A port scanner or a health check that connects and says nothing is
  // dropped after a while; meanwhile the peers' handshakes go on beside it.
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(2, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    SocketMesh::Options o;
    o.peer_hint = "127.0.0.1";
    o.streams = 2;
    o.timeout = std::chrono::seconds(30);
    std::vector<Fd> silent;
    if (rank == 0) {
      const SockAddr peer = listeningAddress(store, 1);
      for (int i = 0; i < 3; ++i) {
        silent.push_back(connectTo(peer, Deadline::after(std::chrono::seconds(5))));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    const auto start = Clock::now();
    SocketMesh mesh(store, "mesh", rank, {1 - rank}, o);
    EXPECT_TRUE(secondsSince(start) < 3);
  }, std::chrono::seconds(60));
}

SMDDP_TEST(a_rank_handshaking_with_a_failed_peer_learns_why) {
  // Rank 1's kernel takes the connection into its queue, but rank 1 failed
  // and never answers: rank 0 fails with what rank 1 published, soon, not
  // at the group's timeout with a connection error of its own.
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::DirStore store(dir);
  SockAddr a = SockAddr::parse("127.0.0.1:0");
  Fd listener = listenOn(&a);
  store.set("mesh/addr/1", taggedValue(toBytes(a.str())));
  store.set("mesh/failed", toBytes("rank 1 could not connect to its peers on other nodes: the test's reason"));
  SocketMesh::Options o;
  o.peer_hint = "127.0.0.1";
  o.timeout = std::chrono::seconds(30);
  const auto start = Clock::now();
  EXPECT_THROWS(SocketMesh(store, "mesh", 0, {1}, o), kComm, "the test's reason");
  EXPECT_TRUE(secondsSince(start) < 5);
}
