// TCP plumbing: owned descriptors, listening and connecting with deadlines,
// keepalive and buffer sizes. The NIC a rank's sockets use is chosen in
// transport/nic.h.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "common/clock.h"
#include "transport/nic.h"

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

// A listening socket on `addr` with a port (written back) that is
// ephemeral, or the first free one of [low, high] from a random start (ranks
// of one host taking ports at once try different ones first); room for
// every connection of a mesh to wait before its acceptor gets to it.
Fd listenOn(SockAddr* addr, int low = 0, int high = 0);
// Connects from `from`'s address (its port is ignored) when given, so that
// the connection leaves through the NIC that holds it. An attempt that is
// refused, finds no route or gets no answer is retried until `patience` has
// passed since the first one (0: until the deadline), then throws kComm
// saying which; the deadline expiring first throws kTimeout. `between`, when
// given, runs at least every 100 ms until then and may throw to give up.
Fd connectTo(
    const SockAddr& addr,
    const Deadline& deadline,
    const SockAddr* from = nullptr,
    std::chrono::milliseconds patience = std::chrono::milliseconds(0),
    const std::function<void()>& between = nullptr);
// Accepts one connection, waiting at most until the deadline (-1 if none,
// or the connection failed before it was accepted); throws kComm if this
// process has no descriptor or memory left for it.
Fd acceptOne(int listen_fd, const Deadline& deadline);
// The same without waiting, for a listener poll() found readable.
Fd acceptReady(int listen_fd);

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
// `between`, when given, runs at least every 100 ms while nothing arrives
// and may throw to give up.
void recvAll(int fd, void* buf, size_t n, const Deadline& deadline, const std::function<void()>& between = nullptr);

} // namespace smddp::transport
