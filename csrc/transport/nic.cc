#include "transport/nic.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/error.h"

namespace smddp::transport {

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

std::string SockAddr::host() const {
  std::string s = str();
  s = s.substr(0, s.rfind(':'));
  if (s.size() >= 2 && s.front() == '[') {
    s = s.substr(1, s.size() - 2);
  }
  return s;
}

namespace {

// A descriptor closed at the end of its scope (the probes below).
struct ScopedFd {
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const {
    return fd_;
  }

 private:
  int fd_;
};

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
  ScopedFd s(::socket(peer.storage.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
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

// One address of one interface of this host.
struct HostAddress {
  std::string name;
  SockAddr addr;
  SockAddr mask;
  unsigned flags = 0;
};

std::vector<HostAddress> hostAddresses() {
  std::vector<HostAddress> out;
  struct ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) {
    return out;
  }
  for (auto* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) {
      continue;
    }
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) {
      continue;
    }
    HostAddress h;
    h.name = i->ifa_name;
    h.flags = i->ifa_flags;
    h.addr.len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(&h.addr.storage, i->ifa_addr, h.addr.len);
    h.addr.setPort(0);
    if (i->ifa_netmask != nullptr && i->ifa_netmask->sa_family == family) {
      h.mask.len = h.addr.len;
      std::memcpy(&h.mask.storage, i->ifa_netmask, h.mask.len);
    }
    out.push_back(h);
  }
  ::freeifaddrs(list);
  return out;
}

bool sameHost(const SockAddr& a, const SockAddr& b) {
  if (a.storage.ss_family != b.storage.ss_family) {
    return false;
  }
  if (a.storage.ss_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr.s_addr ==
        reinterpret_cast<const sockaddr_in*>(&b.storage)->sin_addr.s_addr;
  }
  return std::memcmp(
             &reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr,
             &reinterpret_cast<const sockaddr_in6*>(&b.storage)->sin6_addr, sizeof(in6_addr)) == 0;
}

std::vector<std::string> splitList(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t b = item.find_first_not_of(" \t");
    const size_t e = item.find_last_not_of(" \t");
    out.push_back(b == std::string::npos ? std::string() : item.substr(b, e - b + 1));
    if (comma == std::string::npos) {
      break;
    }
    start = comma + 1;
  }
  return out;
}

// Whether `a` lies in `h`'s subnet (IPv4).
bool inSubnet(const SockAddr& a, const HostAddress& h) {
  if (a.storage.ss_family != AF_INET || h.addr.storage.ss_family != AF_INET || h.mask.len == 0) {
    return false;
  }
  const uint32_t m = reinterpret_cast<const sockaddr_in*>(&h.mask.storage)->sin_addr.s_addr;
  return (reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr.s_addr & m) ==
      (reinterpret_cast<const sockaddr_in*>(&h.addr.storage)->sin_addr.s_addr & m);
}

bool bindable(const SockAddr& a) {
  ScopedFd s(::socket(a.storage.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  return s.get() >= 0 && ::bind(s.get(), reinterpret_cast<const sockaddr*>(&a.storage), a.len) == 0;
}

// The NIC `entry` (an interface name or an address) names, or why none. An
// address no interface lists but this host owns (127.0.0.2 on loopback's
// 127.0.0.0/8) belongs to the interface whose subnet holds it.
bool resolveNic(const std::string& entry, const std::vector<HostAddress>& host, Nic* out, std::string* why) {
  SockAddr ip;
  if (parseIp(entry, &ip)) {
    for (const HostAddress& h : host) {
      if (sameHost(h.addr, ip)) {
        out->name = h.name;
        out->address = h.addr;
        return true;
      }
    }
    if (bindable(ip)) {
      for (const HostAddress& h : host) {
        if (inSubnet(ip, h)) {
          out->name = h.name;
          out->address = ip;
          return true;
        }
      }
    }
    *why = "no interface of this host has that address";
    return false;
  }
  bool exists = false;
  for (const HostAddress& h : host) {
    if (h.name != entry) {
      continue;
    }
    exists = true;
    if (h.addr.storage.ss_family == AF_INET) {
      out->name = h.name;
      out->address = h.addr;
      return true;
    }
  }
  *why = exists ? "that interface has no IPv4 address" : "this host has no interface of that name";
  return false;
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

std::string Nic::host() const {
  return empty() ? std::string() : address.host();
}

std::string Nic::str() const {
  return smddp::str(name.empty() ? std::string("?") : name, " (", host(), ")");
}

size_t nicIndex(int local_rank, int local_size, size_t nics) {
  if (nics == 0 || local_size <= 0) {
    return 0;
  }
  const size_t l = static_cast<size_t>(std::clamp(local_rank, 0, local_size - 1));
  return std::min(nics - 1, l * nics / static_cast<size_t>(local_size));
}

std::string describeInterfaces() {
  std::string out;
  size_t n = 0;
  for (const HostAddress& h : hostAddresses()) {
    if (++n > 24) {
      out += ", ...";
      break;
    }
    out += smddp::str(out.empty() ? "" : ", ", h.name, " ", h.addr.host(), (h.flags & IFF_UP) ? "" : " (down)");
  }
  return out.empty() ? std::string("none with an address") : out;
}

bool interfaceRunning(const std::string& name, std::string* why) {
  ScopedFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  struct ifreq ifr{};
  if (s.get() < 0 || name.empty() || name.size() >= sizeof(ifr.ifr_name)) {
    return true;  // nothing to say
  }
  std::memcpy(ifr.ifr_name, name.data(), name.size());
  if (::ioctl(s.get(), SIOCGIFFLAGS, &ifr) != 0) {
    *why = smddp::str("interface ", name, " is gone from this host");
    return false;
  }
  if (!(ifr.ifr_flags & IFF_UP)) {
    *why = smddp::str("interface ", name, " is down on this host");
    return false;
  }
  if (!(ifr.ifr_flags & IFF_RUNNING)) {
    *why = smddp::str("interface ", name, " has no carrier (its link is down)");
    return false;
  }
  return true;
}

Nic chooseNic(const std::string& list, int local_rank, int local_size, const std::string& peer_hint) {
  const std::vector<HostAddress> host = hostAddresses();
  Nic nic;
  if (!list.empty()) {
    const std::vector<std::string> entries = splitList(list);
    std::vector<Nic> nics;
    for (const std::string& e : entries) {
      Nic n;
      std::string why;
      if (e.empty() || !resolveNic(e, host, &n, &why)) {
        SMDDP_THROW(
            kConfig, "SMDDP_SOCKET_IFNAME='", list, "': ",
            e.empty() ? std::string("an entry is empty") : smddp::str("'", e, "' names no NIC: ", why),
            ". This host has: ", describeInterfaces(),
            ". List interface names or addresses of this host (`ip addr`), separated by commas");
      }
      nics.push_back(n);
    }
    nic = nics[nicIndex(local_rank, local_size, nics.size())];
    std::string why;
    if (!interfaceRunning(nic.name, &why)) {
      SMDDP_THROW(
          kConfig, "SMDDP_SOCKET_IFNAME='", list, "': local rank ", local_rank, " of ", local_size, " uses ",
          nic.str(), ", but ", why);
    }
    return nic;
  }
  SockAddr peer;
  SockAddr local;
  bool found = !peer_hint.empty() && resolve(peer_hint, &peer) && routeTo(peer, &local);
  if (found) {
    nic.address = local;
    for (const HostAddress& h : host) {
      if (sameHost(h.addr, local)) {
        nic.name = h.name;
        break;
      }
    }
    return nic;
  }
  for (const HostAddress& h : host) {
    if (h.addr.storage.ss_family == AF_INET && (h.flags & IFF_UP) && !(h.flags & IFF_LOOPBACK)) {
      nic.name = h.name;
      nic.address = h.addr;
      return nic;
    }
  }
  parseIp("127.0.0.1", &nic.address);
  nic.name = "lo";
  for (const HostAddress& h : host) {
    if (sameHost(h.addr, nic.address)) {
      nic.name = h.name;
    }
  }
  return nic;
}

} // namespace smddp::transport
