#include "transport/socket/socket_util.h"

#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <iomanip>
#include <thread>

#include "common/error.h"

namespace smddp::transport {

Fd::~Fd() {
  reset();
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.release();
  }
  return *this;
}

void Fd::reset() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

Fd listenOn(SockAddr* addr, int low, int high) {
  const int span = low > 0 ? high - low + 1 : 1;
  // Any start that differs between the processes of a host will do.
  const int first = static_cast<int>((static_cast<uint64_t>(::getpid()) * 2654435761u + nowNs()) %
                                     static_cast<uint64_t>(span));
  for (int i = 0; i < span; ++i) {
    Fd s(::socket(addr->storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    SMDDP_SYSCHECK(s.get(), "socket()");
    int one = 1;
    ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    addr->setPort(low > 0 ? low + (first + i) % span : 0);
    // Sockets that do not listen yet may share a port: another process
    // between its bind() and listen() on this one makes the listen() that
    // comes second fail. Either way the port is taken; the next may not be.
    const char* step = "bind";
    int err = 0;
    if (::bind(s.get(), reinterpret_cast<const sockaddr*>(&addr->storage), addr->len) != 0) {
      err = errno;
    } else if (::listen(s.get(), SOMAXCONN) != 0) {
      err = errno;
      step = "listen";
    }
    if (err != 0) {
      if (err == EADDRINUSE && i + 1 < span) {
        continue;
      }
      if (err == EADDRINUSE && low > 0) {
        SMDDP_THROW(kComm, "no free port in SMDDP_SOCKET_PORTS=", low, "-", high, " on ", addr->host(), " (all ", span,
                    " are in use): widen the range (a host's every rank takes one while a group is being created)");
      }
      SMDDP_THROW(kComm, step, "(", addr->str(), ") failed: ", errnoString(err));
    }
    addr->len = sizeof(addr->storage);
    SMDDP_SYSCHECK(
        ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&addr->storage), &addr->len),
        "getsockname()");
    return s;
  }
  SMDDP_THROW(kInternal, "listenOn: an empty port range");
}

namespace {

// What a later attempt may cure: the peer's kernel refusing or a route
// missing for a moment, an interrupted call.
bool retryable(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == EINTR || err == ECONNRESET || err == EHOSTUNREACH ||
      err == ENETUNREACH;
}

// Waits for a non-blocking connect to finish: 0 once connected, its errno
// if it failed, ETIMEDOUT if nothing answered before `give_up`.
int awaitConnected(int fd, const Deadline& give_up, const std::function<void()>& between) {
  while (true) {
    struct pollfd p = {fd, POLLOUT, 0};
    const int ms = static_cast<int>(give_up.remainingNs(int64_t{100} * 1000000) / 1000000);
    if (::poll(&p, 1, std::max(ms, 1)) > 0) {
      int err = 0;
      socklen_t len = sizeof(err);
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
        return errno;
      }
      return err;
    }
    if (give_up.expired()) {
      return ETIMEDOUT;
    }
    if (between) {
      between();
    }
  }
}

} // namespace

Fd connectTo(
    const SockAddr& addr,
    const Deadline& deadline,
    const SockAddr* from,
    std::chrono::milliseconds patience,
    const std::function<void()>& between) {
  const auto start = Clock::now();
  Deadline give_up = deadline;
  if (patience.count() > 0 && Deadline::after(patience).at() < deadline.at()) {
    give_up = Deadline::after(patience);
  }
  int delay_ms = 1;
  const std::string source = from != nullptr ? smddp::str(" from ", from->host()) : std::string();
  while (true) {
    Fd s(::socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    SMDDP_SYSCHECK(s.get(), "socket()");
    if (from != nullptr) {
      // The port comes with connect(), from the whole 4-tuple's space.
      int one = 1;
      ::setsockopt(s.get(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
      SockAddr src = *from;
      src.setPort(0);
      SMDDP_SYSCHECK(
          ::bind(s.get(), reinterpret_cast<const sockaddr*>(&src.storage), src.len), "bind(", src.str(),
          ") before connecting to ", addr.str());
    }
    int err = 0;
    if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len) != 0) {
      err = errno == EINPROGRESS ? awaitConnected(s.get(), give_up, between) : errno;
    }
    if (err == 0) {
      setNonBlocking(s.get(), false);
      tuneConnection(s.get());
      return s;
    }
    if (!retryable(err)) {
      SMDDP_THROW(kComm, "connect to ", addr.str(), source, " failed: ", errnoString(err));
    }
    if (give_up.expired()) {
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      const std::string what = err == ETIMEDOUT ? std::string("nothing answered") : errnoString(err);
      if (give_up.at() == deadline.at()) {
        SMDDP_THROW(kTimeout, "could not connect to ", addr.str(), source, " in time: ", what);
      }
      SMDDP_THROW(kComm, "could not connect to ", addr.str(), source, " for ", str(std::fixed, std::setprecision(1), seconds),
                  " s: ", what);
    }
    if (between) {
      between();
    }
    std::this_thread::sleep_for(
        std::chrono::nanoseconds(give_up.remainingNs(int64_t{delay_ms} * 1000000)));
    delay_ms = std::min(delay_ms * 2, 100);
  }
}

Fd acceptOne(int listen_fd, const Deadline& deadline) {
  struct pollfd p = {listen_fd, POLLIN, 0};
  int timeout_ms = static_cast<int>(deadline.remainingNs(int64_t{1000} * 1000000) / 1000000);
  int n = ::poll(&p, 1, std::max(timeout_ms, 1));
  if (n <= 0) {
    return Fd();
  }
  return acceptReady(listen_fd);
}

Fd acceptReady(int listen_fd) {
  Fd c(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
  if (c.get() < 0) {
    const int err = errno;
    // This process's own shortage: the connection stays queued (the
    // listener stays readable), so waiting on would spin until the timeout.
    if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
      SMDDP_THROW(kComm, "accept() failed: ", errnoString(err), ": this process has no ",
                  err == ENOBUFS || err == ENOMEM ? "memory" : "file descriptor",
                  " left for a peer's connection (raise the limit of open files, ulimit -n, or open fewer)");
    }
    // The connection's own trouble (aborted, a protocol error), or a signal.
    return c;
  }
  tuneConnection(c.get());
  return c;
}

void setNonBlocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

void setNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void setKeepAlive(int fd) {
  int one = 1;
  int idle = kKeepIdleS;
  int interval = kKeepIntervalS;
  int count = kKeepCount;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

void tuneConnection(int fd) {
  setNoDelay(fd);
  setKeepAlive(fd);
}

size_t receiveBufferMax() {
  std::ifstream f("/proc/sys/net/core/rmem_max");
  size_t v = 0;
  if (!(f >> v)) {
    return 0;
  }
  return v;
}

void setReceiveBuffer(int fd, size_t bytes) {
  int want = static_cast<int>(std::min<size_t>(bytes, static_cast<size_t>(INT32_MAX / 2)));
  SMDDP_SYSCHECK(::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &want, sizeof(want)), "setsockopt(SO_RCVBUF)");
}

void sendAll(int fd, const void* buf, size_t n, const Deadline& deadline) {
  const auto* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      SMDDP_THROW(kComm, "send failed: ", errnoString(errno));
    }
    struct pollfd pf = {fd, POLLOUT, 0};
    ::poll(&pf, 1, static_cast<int>(deadline.remainingNs(int64_t{100} * 1000000) / 1000000) + 1);
    if (deadline.expired()) {
      SMDDP_THROW(kTimeout, "send did not complete in time");
    }
  }
}

void recvAll(int fd, void* buf, size_t n, const Deadline& deadline, const std::function<void()>& between) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      SMDDP_THROW(kComm, "connection closed by the other side");
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      SMDDP_THROW(kComm, "recv failed: ", errnoString(errno));
    }
    struct pollfd pf = {fd, POLLIN, 0};
    const bool ready =
        ::poll(&pf, 1, static_cast<int>(deadline.remainingNs(int64_t{100} * 1000000) / 1000000) + 1) > 0;
    if (deadline.expired()) {
      SMDDP_THROW(kTimeout, "receive did not complete in time");
    }
    if (!ready && between) {
      between();
    }
  }
}

} // namespace smddp::transport
