// The NICs of this host and the choice of one per rank. Every transport
// that crosses nodes binds a rank's traffic to its NIC, so that with
// per-source routing (one routing table per NIC, as on hosts with several
// NICs in one subnet) its traffic leaves through that NIC: on p4d, GPUs 0-1
// on the first EFA, 2-3 on the second, and so on. No state, no threads.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <string>

namespace smddp::transport {

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;
  // "1.2.3.4:5678" or "[::1]:5678".
  std::string str() const;
  // "1.2.3.4" or "::1" (no port).
  std::string host() const;
  static SockAddr parse(const std::string& host_port);
  int port() const;
  void setPort(int port);
};

// A network interface of this host and the address a rank uses on it.
struct Nic {
  std::string name;  // "eth0"
  SockAddr address;  // port 0
  bool empty() const {
    return address.len == 0;
  }
  // "198.18.1.2" (no port).
  std::string host() const;
  // "nic1 (198.18.1.2)".
  std::string str() const;
};

// Entry local_rank * nics / local_size of `nics` listed NICs: on a host of L
// ranks and K NICs, ranks 0..L/K-1 use the first, and so on (p4d: GPUs 0-1
// on the first EFA, 2-3 on the second). Clamped to the list.
size_t nicIndex(int local_rank, int local_size, size_t nics);

// This rank's NIC. `list` is SMDDP_SOCKET_IFNAME: interface names or
// addresses, comma-separated; the entry nicIndex() picks is used. Every entry
// is checked, so that every rank of a host reports the same mistake: one that
// is neither an interface with an address nor an address of this host throws
// kConfig naming the variable and the host's interfaces. An empty list picks
// the interface that routes to `peer_hint` (the store's host), else the first
// non-loopback IPv4 interface that is up, else loopback.
Nic chooseNic(const std::string& list, int local_rank, int local_size, const std::string& peer_hint);

// This host's interfaces and their addresses, for messages:
// "lo 127.0.0.1, eth0 10.0.0.2 (down)".
std::string describeInterfaces();

// Whether interface `name` is up and has its carrier; `why` says which not.
bool interfaceRunning(const std::string& name, std::string* why);

} // namespace smddp::transport
