#include "transport/socket/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
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

std::string SockAddr::str() const {
  char host[INET6_ADDRSTRLEN] = {0};
  if (storage.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&storage);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    return smddp::str(host, ":", ntohs(a->sin_port));
  }
  auto* a = reinterpret_cast<const sockaddr_in6*>(&storage);
  ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
  return smddp::str("[", host, "]:", ntohs(a->sin6_port));
}

int SockAddr::port() const {
  if (storage.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  }
  return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
}

void SockAddr::setPort(int port) {
  if (storage.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(static_cast<uint16_t>(port));
  } else {
    reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(static_cast<uint16_t>(port));
  }
}

namespace {

bool parseIp(const std::string& host, SockAddr* out) {
  SockAddr a;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&a.storage);
  if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    a.len = sizeof(sockaddr_in);
    *out = a;
    return true;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
  if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    a.len = sizeof(sockaddr_in6);
    *out = a;
    return true;
  }
  return false;
}

bool resolve(const std::string& host, SockAddr* out) {
  if (parseIp(host, out)) {
    return true;
  }
  struct addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
    return false;
  }
  std::memcpy(&out->storage, res->ai_addr, res->ai_addrlen);
  out->len = res->ai_addrlen;
  ::freeaddrinfo(res);
  return true;
}

// The local address the kernel would use to reach `peer` (no packet sent).
bool routeTo(const SockAddr& peer, SockAddr* out) {
  Fd s(::socket(peer.storage.ss_family, SOCK_DGRAM, 0));
  if (s.get() < 0) {
    return false;
  }
  SockAddr p = peer;
  p.setPort(9);
  if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&p.storage), p.len) != 0) {
    return false;
  }
  SockAddr local;
  local.len = sizeof(local.storage);
  if (::getsockname(s.get(), reinterpret_cast<sockaddr*>(&local.storage), &local.len) != 0) {
    return false;
  }
  local.setPort(0);
  *out = local;
  return true;
}

bool interfaceAddress(const std::string& name, bool skip_loopback, SockAddr* out) {
  struct ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) {
    return false;
  }
  bool found = false;
  for (auto* i = list; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) {
      continue;
    }
    if (!name.empty() && name != i->ifa_name) {
      continue;
    }
    if (name.empty() && skip_loopback && (i->ifa_flags & IFF_LOOPBACK)) {
      continue;
    }
    std::memcpy(&out->storage, i->ifa_addr, sizeof(sockaddr_in));
    out->len = sizeof(sockaddr_in);
    found = true;
  }
  ::freeifaddrs(list);
  return found;
}

} // namespace

SockAddr SockAddr::parse(const std::string& host_port) {
  size_t colon = host_port.rfind(':');
  SMDDP_CHECK_ARG(colon != std::string::npos, "bad address '", host_port, "'");
  std::string host = host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  SockAddr a;
  SMDDP_CHECK_ARG(parseIp(host, &a), "bad address '", host_port, "'");
  a.setPort(std::stoi(host_port.substr(colon + 1)));
  return a;
}

SockAddr chooseListenAddress(const std::string& preference, const std::string& peer_hint) {
  SockAddr a;
  if (!preference.empty()) {
    if (parseIp(preference, &a) || interfaceAddress(preference, false, &a)) {
      return a;
    }
    SMDDP_THROW(
        kConfig,
        "SMDDP_SOCKET_IFNAME='",
        preference,
        "' is neither an IPv4 interface of this host nor an address; see `ip addr`");
  }
  SockAddr peer;
  if (!peer_hint.empty() && resolve(peer_hint, &peer) && routeTo(peer, &a)) {
    return a;
  }
  if (interfaceAddress("", true, &a)) {
    return a;
  }
  parseIp("127.0.0.1", &a);
  return a;
}

Fd listenOn(SockAddr* addr) {
  Fd s(::socket(addr->storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  SMDDP_SYSCHECK(s.get(), "socket()");
  int one = 1;
  ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  addr->setPort(0);
  SMDDP_SYSCHECK(
      ::bind(s.get(), reinterpret_cast<const sockaddr*>(&addr->storage), addr->len),
      "bind(", addr->str(), ")");
  SMDDP_SYSCHECK(::listen(s.get(), 128), "listen()");
  addr->len = sizeof(addr->storage);
  SMDDP_SYSCHECK(
      ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&addr->storage), &addr->len),
      "getsockname()");
  return s;
}

Fd connectTo(const SockAddr& addr, const Deadline& deadline) {
  int delay_ms = 1;
  while (true) {
    Fd s(::socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    SMDDP_SYSCHECK(s.get(), "socket()");
    if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len) == 0) {
      tuneConnection(s.get());
      return s;
    }
    int err = errno;
    if (err != ECONNREFUSED && err != ETIMEDOUT && err != EINTR && err != ECONNRESET &&
        err != EHOSTUNREACH) {
      SMDDP_THROW(kComm, "connect to ", addr.str(), " failed: ", errnoString(err));
    }
    if (deadline.expired()) {
      SMDDP_THROW(kTimeout, "could not connect to ", addr.str(), ": ", errnoString(err));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
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
  Fd c(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
  if (c.get() >= 0) {
    tuneConnection(c.get());
  }
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

void recvAll(int fd, void* buf, size_t n, const Deadline& deadline) {
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
    ::poll(&pf, 1, static_cast<int>(deadline.remainingNs(int64_t{100} * 1000000) / 1000000) + 1);
    if (deadline.expired()) {
      SMDDP_THROW(kTimeout, "receive did not complete in time");
    }
  }
}

} // namespace smddp::transport
