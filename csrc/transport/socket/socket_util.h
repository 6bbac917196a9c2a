// TCP plumbing: owned descriptors, listening and connecting with deadlines,
// and the choice of the NIC (local interface and address) the inter-node
// sockets use.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/clock.h"

namespace smddp::transport {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const {
    return fd_;
  }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset();

 private:
  int fd_ = -1;
};

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;
  // "1.2.3.4:5678" or "[::1]:5678".
  std::string str() const;
  static SockAddr parse(const std::string& host_port);
  int port() const;
  void setPort(int port);
};

// A network interface of this host as the inter-node sockets use it: every
// listener and every outgoing connection of a rank is bound to its NIC's
// address, so that with per-source routing (one routing table per NIC, as on
// hosts with several NICs in one subnet) its traffic leaves through that NIC.
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

// A listening socket on `addr` with an ephemeral port (written back).
Fd listenOn(SockAddr* addr);
// Connects, retrying refused connections until the deadline; from `from`'s
// address (its port is ignored) when given, so that the connection leaves
// through the NIC that holds it.
Fd connectTo(const SockAddr& addr, const Deadline& deadline, const SockAddr* from = nullptr);
// Accepts one connection, waiting at most until the deadline (-1 if none).
Fd acceptOne(int listen_fd, const Deadline& deadline);

void setNonBlocking(int fd, bool on);
void setNoDelay(int fd);

// TCP keepalive on a connection: after kKeepIdleS seconds without traffic,
// kKeepCount probes kKeepIntervalS apart; a host that vanished without
// closing its sockets (power loss, a cut link) then fails the connection
// (ETIMEDOUT) in about 90 s instead of at the group's timeout. A busy or
// stopped peer process does not: its kernel answers the probes.
constexpr int kKeepIdleS = 30;
constexpr int kKeepIntervalS = 10;
constexpr int kKeepCount = 6;
void setKeepAlive(int fd);

// What every connection gets, on both ends: no Nagle delay, keepalive.
void tuneConnection(int fd);

// net.core.rmem_max, the largest SO_RCVBUF an unprivileged process gets
// (0 if it cannot be read).
size_t receiveBufferMax();
// SO_RCVBUF = bytes (which also ends the kernel's autotuning of it).
void setReceiveBuffer(int fd, size_t bytes);

// Blocking transfers (handshakes): whole buffers or throw (kComm/kTimeout).
void sendAll(int fd, const void* buf, size_t n, const Deadline& deadline);
void recvAll(int fd, void* buf, size_t n, const Deadline& deadline);

} // namespace smddp::transport
