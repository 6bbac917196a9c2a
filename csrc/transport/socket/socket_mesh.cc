#include "transport/socket/socket_mesh.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "topology/topology.h"

namespace smddp::transport {

// ------------------------------------------------------------ SocketChannel

SocketChannel::SocketChannel(
    int my_rank,
    int peer,
    std::vector<Fd> streams,
    SipKey key,
    Nic nic,
    std::chrono::milliseconds stall)
    : my_rank_(my_rank), peer_(peer), key_(key), nic_(std::move(nic)), stall_(stall), streams_(streams.size()) {
  for (size_t i = 0; i < streams.size(); ++i) {
    streams_[i].fd = std::move(streams[i]);
    setNonBlocking(streams_[i].fd.get(), true);
  }
  if (!streams_.empty()) {
    SockAddr a;
    a.len = sizeof(a.storage);
    if (::getpeername(streams_[0].fd.get(), reinterpret_cast<sockaddr*>(&a.storage), &a.len) == 0) {
      peer_address_ = a.str();
    }
  }
}

std::string SocketChannel::describe() const {
  return str(
      "rank ", peer_, " (other node", peer_address_.empty() ? "" : ", ", peer_address_, ")",
      nic_.empty() ? std::string() : str(" from ", nic_.str()));
}

SocketChannel::~SocketChannel() = default;

uint64_t SocketChannel::postSend(const void* buf, size_t bytes, const MessageTag& tag) {
  const uint64_t id = sends_posted_++;
  Stream& s = streams_[id % streams_.size()];
  SendOp op;
  op.id = id;
  FrameHeader h;
  h.type = FrameType::kData;
  h.tag = tag;
  h.from = static_cast<uint32_t>(my_rank_);
  h.length = bytes;
  encodeFrameHeader(h, key_, op.header);
  op.buf = static_cast<const uint8_t*>(buf);
  op.bytes = bytes;
  op.off = 0;
  s.sends.push_back(op);
  send_flags_.push_back(false);
  return id;
}

uint64_t SocketChannel::postRecv(void* buf, size_t bytes, const MessageTag& tag) {
  const uint64_t id = recvs_posted_++;
  Stream& s = streams_[id % streams_.size()];
  s.recvs.push_back(RecvOp{id, static_cast<uint8_t*>(buf), bytes, tag});
  recv_flags_.push_back(false);
  return id;
}

void SocketChannel::finish(std::deque<bool>* flags, uint64_t* base, uint64_t* done, uint64_t id) {
  (*flags)[id - *base] = true;
  while (!flags->empty() && flags->front()) {
    flags->pop_front();
    ++*base;
    ++*done;
  }
}

void SocketChannel::lost(const std::string& what, int err) {
  {
    // This rank cut the connection itself: its cause, not the peer's.
    std::lock_guard<std::mutex> lock(shut_mu_);
    if (!shut_why_.empty()) {
      SMDDP_THROW(kAborted, shut_why_);
    }
  }
  // A cut link shows as a timeout or an unreachable peer; a peer that
  // exited, as a closed or reset connection.
  const bool path = err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH || err == ENETDOWN;
  std::string why;
  const std::string nic_state = interfaceRunning(nic_.name, &why) ? std::string() : "; " + why;
  SMDDP_THROW(
      kPeerLost,
      "connection to ",
      describe(),
      " lost while ",
      what,
      err != 0 ? ": " + errnoString(err) : std::string(": closed by the peer"),
      nic_state,
      path ? str("; is the link between the two NICs cut, or rank ", peer_, "'s host gone?")
           : str("; did rank ", peer_, " exit or fail?"));
}

void SocketChannel::checkPeer() {
  if (sends_done_ == sends_posted_ && recvs_done_ == recvs_posted_) {
    for (Stream& s : streams_) {
      s.stall_since_ns = 0;
    }
    return;
  }
  // The driver calls this between sleeps; every few slices is enough.
  constexpr uint64_t kEveryNs = 20 * 1000 * 1000;
  const uint64_t now = nowNs();
  if (now - last_check_ns_ < kEveryNs) {
    return;
  }
  last_check_ns_ = now;
  std::string why;
  if (!interfaceRunning(nic_.name, &why)) {
    SMDDP_THROW(
        kPeerLost, "connection to ", describe(), " lost: ", why,
        "; bring the interface up (`ip link`) or check its cable and switch port");
  }
  const uint64_t stall_ns = static_cast<uint64_t>(stall_.count()) * 1000000;
  for (Stream& s : streams_) {
    struct tcp_info ti{};
    socklen_t len = sizeof(ti);
    if (::getsockopt(s.fd.get(), IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) {
      continue;
    }
    if (ti.tcpi_unacked == 0 || ti.tcpi_retransmits == 0) {
      s.stall_since_ns = 0;
      continue;
    }
    if (s.stall_since_ns == 0) {
      s.stall_since_ns = now;
    } else if (now - s.stall_since_ns >= stall_ns) {
      SMDDP_THROW(
          kPeerLost, "connection to ", describe(), " lost: what this rank sent there went unacknowledged for ",
          (now - s.stall_since_ns) / 1000000000, " s (", static_cast<int>(ti.tcpi_retransmits),
          " retransmissions); is the link between the two NICs cut, or rank ", peer_, "'s host gone?");
    }
  }
}

bool SocketChannel::progressSends(Stream& s) {
  bool moved = false;
  while (!s.sends.empty()) {
    SendOp& op = s.sends.front();
    struct iovec iov[2];
    int n = 0;
    if (op.off < kFrameHeaderBytes) {
      iov[n++] = {op.header + op.off, kFrameHeaderBytes - op.off};
      if (op.bytes > 0) {
        iov[n++] = {const_cast<uint8_t*>(op.buf), op.bytes};
      }
    } else {
      size_t p = op.off - kFrameHeaderBytes;
      iov[n++] = {const_cast<uint8_t*>(op.buf + p), op.bytes - p};
    }
    struct msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t w = ::sendmsg(s.fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        break;
      }
      lost("sending", errno);
    }
    moved = true;
    op.off += static_cast<size_t>(w);
    if (op.off == kFrameHeaderBytes + op.bytes) {
      uint64_t id = op.id;
      s.sends.pop_front();
      finish(&send_flags_, &send_base_, &sends_done_, id);
    }
  }
  return moved;
}

bool SocketChannel::progressRecvs(Stream& s) {
  bool moved = false;
  while (true) {
    if (s.eof) {
      if (!s.recvs.empty()) {
        lost("receiving", 0);
      }
      return moved;
    }
    if (!s.have_header) {
      ssize_t r = ::recv(s.fd.get(), s.header + s.header_got, kFrameHeaderBytes - s.header_got, MSG_DONTWAIT);
      if (r == 0) {
        if (s.header_got > 0 || !s.recvs.empty()) {
          lost("receiving", 0);
        }
        s.eof = true;
        return true;
      }
      if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
          return moved;
        }
        lost("receiving", errno);
      }
      moved = true;
      s.header_got += static_cast<size_t>(r);
      if (s.header_got < kFrameHeaderBytes) {
        continue;
      }
      std::string bad = decodeFrameHeader(s.header, key_, &s.current);
      if (!bad.empty()) {
        SMDDP_THROW(kComm, "rank ", peer_, " sent an invalid message: ", bad);
      }
      if (s.current.type == FrameType::kAbort) {
        std::string why(s.current.length, '\0');
        try {
          setNonBlocking(s.fd.get(), false);
          recvAll(s.fd.get(), why.data(), why.size(), Deadline::after(std::chrono::seconds(1)));
        } catch (const Error&) {
          why = "(its message was lost)";
        }
        SMDDP_THROW(kAborted, "rank ", peer_, " (other node) failed: ", why);
      }
      s.have_header = true;
      s.payload_got = 0;
    }
    if (s.recvs.empty()) {
      // A message arrived before its receive was posted: keep its header.
      return moved;
    }
    RecvOp& op = s.recvs.front();
    if (!s.current.tag.sameCall(op.tag) || s.current.length != op.bytes) {
      throwDisagreement(peer_, s.current.tag, s.current.length, my_rank_, op.tag, op.bytes);
    }
    while (s.payload_got < op.bytes) {
      ssize_t r = ::recv(s.fd.get(), op.buf + s.payload_got, op.bytes - s.payload_got, MSG_DONTWAIT);
      if (r == 0) {
        lost("receiving", 0);
      }
      if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
          return moved;
        }
        lost("receiving", errno);
      }
      moved = true;
      s.payload_got += static_cast<size_t>(r);
    }
    uint64_t id = op.id;
    s.recvs.pop_front();
    s.have_header = false;
    s.header_got = 0;
    finish(&recv_flags_, &recv_base_, &recvs_done_, id);
  }
}

bool SocketChannel::progress() {
  bool moved = false;
  for (Stream& s : streams_) {
    moved = progressSends(s) || moved;
    moved = progressRecvs(s) || moved;
  }
  return moved;
}

size_t SocketChannel::receiveBufferBytes() const {
  size_t least = SIZE_MAX;
  for (const Stream& s : streams_) {
    int v = 0;
    socklen_t len = sizeof(v);
    if (::getsockopt(s.fd.get(), SOL_SOCKET, SO_RCVBUF, &v, &len) == 0) {
      least = std::min(least, static_cast<size_t>(v));
    }
  }
  return least;
}

void SocketChannel::appendPollFds(std::vector<struct pollfd>* fds) const {
  for (const Stream& s : streams_) {
    short events = s.eof ? 0 : POLLIN;
    if (!s.sends.empty()) {
      events |= POLLOUT;
    }
    if (events != 0) {
      fds->push_back({s.fd.get(), events, 0});
    }
  }
}

void SocketChannel::sendAbort(const std::string& why) {
  std::string msg = why.substr(0, kMaxAbortBytes);
  for (Stream& s : streams_) {
    if (!s.sends.empty() && s.sends.front().off > 0) {
      // Mid-message: a frame now would be garbage to the peer; closing
      // tells it promptly instead.
      ::shutdown(s.fd.get(), SHUT_RDWR);
      continue;
    }
    FrameHeader h;
    h.type = FrameType::kAbort;
    h.from = static_cast<uint32_t>(my_rank_);
    h.length = msg.size();
    uint8_t header[kFrameHeaderBytes];
    encodeFrameHeader(h, key_, header);
    try {
      sendAll(s.fd.get(), header, sizeof(header), Deadline::after(std::chrono::milliseconds(200)));
      sendAll(s.fd.get(), msg.data(), msg.size(), Deadline::after(std::chrono::milliseconds(200)));
    } catch (const Error&) {
      ::shutdown(s.fd.get(), SHUT_RDWR);
    }
  }
}

void SocketChannel::shutdown(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(shut_mu_);
    shut_why_ = why.empty() ? std::string("this rank closed the connections") : why;
  }
  for (Stream& s : streams_) {
    ::shutdown(s.fd.get(), SHUT_RDWR);
  }
}

// ------------------------------------------------------------ handshake

namespace {

constexpr uint32_t kHelloMagic = 0x48444d53;  // "SMDH"
constexpr uint16_t kHelloVersion = 1;

struct Hello {
  uint32_t magic;
  uint16_t version;
  uint16_t streams;
  uint32_t from;
  uint32_t to;
  uint32_t stream;
  uint32_t pad;
  uint64_t nonce[2];
};
static_assert(sizeof(Hello) == 40, "wire size");

struct Challenge {
  uint64_t nonce[2];
  uint64_t mac;
};

void randomBytes(void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    ssize_t got = ::getrandom(b, n, 0);
    if (got < 0) {
      if (errno == EINTR) {
        continue;
      }
      SMDDP_SYSCHECK(-1, "getrandom");
    }
    b += got;
    n -= static_cast<size_t>(got);
  }
}

uint64_t mac(const SipKey& key, char role, const Hello& hello, const uint64_t nonce[2]) {
  uint8_t buf[1 + sizeof(Hello) + 16];
  buf[0] = static_cast<uint8_t>(role);
  std::memcpy(buf + 1, &hello, sizeof(Hello));
  std::memcpy(buf + 1 + sizeof(Hello), nonce, 16);
  return siphash24(key, buf, sizeof(buf));
}

// Connector side. Throws if the acceptor does not prove the key. `between`
// runs while it waits for the acceptor and may throw to give up.
void handshakeConnect(int fd, const SipKey& key, int from, int to, int stream, int streams, const Deadline& dl,
                      const std::function<void()>& between) {
  Hello h{};
  h.magic = kHelloMagic;
  h.version = kHelloVersion;
  h.streams = static_cast<uint16_t>(streams);
  h.from = static_cast<uint32_t>(from);
  h.to = static_cast<uint32_t>(to);
  h.stream = static_cast<uint32_t>(stream);
  randomBytes(h.nonce, sizeof(h.nonce));
  sendAll(fd, &h, sizeof(h), dl);
  Challenge c{};
  recvAll(fd, &c, sizeof(c), dl, between);
  if (c.mac != mac(key, 'A', h, c.nonce)) {
    SMDDP_THROW(kComm, "rank ", to, " failed to prove it belongs to this group");
  }
  uint64_t response = mac(key, 'C', h, c.nonce);
  sendAll(fd, &response, sizeof(response), dl);
  uint8_t ok = 0;
  recvAll(fd, &ok, 1, dl, between);
  if (ok != 1) {
    SMDDP_THROW(kComm, "rank ", to, " rejected the connection");
  }
}

// Acceptor side, one connection's handshake, driven by poll() beside the
// others' (a connection that says nothing must not hold up the peers'):
// step() reads what has arrived, answers, and says when the peer is proven.
// Throws why the connection is not a peer of this group.
class AcceptedHandshake {
 public:
  AcceptedHandshake(Fd fd, Clock::time_point until) : fd_(std::move(fd)), until_(until) {}

  // True once the connection is a proven peer (hello() says which stream).
  bool step(const SipKey& key, int me, int streams, const std::set<int>& expected) {
    uint8_t* into = challenged_ ? reinterpret_cast<uint8_t*>(&response_) : reinterpret_cast<uint8_t*>(&hello_);
    const size_t want = challenged_ ? sizeof(response_) : sizeof(hello_);
    while (got_ < want) {
      ssize_t r = ::recv(fd_.get(), into + got_, want - got_, MSG_DONTWAIT);
      if (r > 0) {
        got_ += static_cast<size_t>(r);
        continue;
      }
      if (r == 0) {
        SMDDP_THROW(kComm, "closed before the handshake ended");
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        return false;
      }
      SMDDP_THROW(kComm, "recv failed: ", errnoString(errno));
    }
    got_ = 0;
    // The few bytes of an answer fit an idle connection's send buffer.
    const Deadline answer = Deadline::after(std::chrono::seconds(1));
    if (!challenged_) {
      const Hello& h = hello_;
      if (h.magic != kHelloMagic || h.version != kHelloVersion) {
        SMDDP_THROW(kComm, "not an smddp peer (bad greeting)");
      }
      if (h.to != static_cast<uint32_t>(me) || h.streams != streams ||
          h.stream >= static_cast<uint32_t>(streams) || expected.count(static_cast<int>(h.from)) == 0) {
        SMDDP_THROW(kComm, "unexpected greeting (from ", h.from, " to ", h.to, " stream ", h.stream, ")");
      }
      randomBytes(challenge_.nonce, sizeof(challenge_.nonce));
      challenge_.mac = mac(key, 'A', h, challenge_.nonce);
      sendAll(fd_.get(), &challenge_, sizeof(challenge_), answer);
      challenged_ = true;
      return false;
    }
    if (response_ != mac(key, 'C', hello_, challenge_.nonce)) {
      SMDDP_THROW(kComm, "the peer does not hold this group's secret");
    }
    uint8_t ok = 1;
    sendAll(fd_.get(), &ok, 1, answer);
    return true;
  }

  int fd() const {
    return fd_.get();
  }
  Fd release() {
    return std::move(fd_);
  }
  const Hello& hello() const {
    return hello_;
  }
  Clock::time_point until() const {
    return until_;
  }

 private:
  Fd fd_;
  Clock::time_point until_;
  Hello hello_{};
  Challenge challenge_{};
  uint64_t response_ = 0;
  size_t got_ = 0;
  bool challenged_ = false;
};

} // namespace

// ------------------------------------------------------------ SocketMesh

std::chrono::milliseconds SocketMesh::stallTimeout(std::chrono::milliseconds timeout) {
  const std::chrono::milliseconds longest{int64_t{1000} * (kKeepIdleS + kKeepIntervalS * kKeepCount)};
  return std::clamp(timeout / 2, std::chrono::milliseconds(1000), longest);
}

std::chrono::milliseconds SocketMesh::connectPatience(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 2, std::chrono::milliseconds(1000), std::chrono::milliseconds(30000));
}

namespace {

// How often a rank waiting for its connections asks the store whether
// another rank's set-up failed: seldom enough that a thousand waiting ranks
// do not load it, often enough to fail long before the group's timeout.
constexpr auto kFailureCheckInterval = std::chrono::seconds(1);

std::string missingRanks(const std::map<int, std::vector<Fd>>& slots) {
  std::vector<int> missing;
  for (const auto& [p, fds] : slots) {
    if (std::any_of(fds.begin(), fds.end(), [](const Fd& f) { return f.get() < 0; })) {
      missing.push_back(p);
    }
  }
  return topology::rankList(missing);
}

} // namespace

SocketMesh::SocketMesh(
    Store& store,
    const std::string& key,
    int rank,
    const std::vector<int>& peers,
    const Options& options)
    : nic_(options.nic.empty() ? chooseNic("", 0, 1, options.peer_hint) : options.nic) {
  const Deadline deadline = Deadline::after(options.timeout);
  const int streams = std::max(1, options.streams);
  // A rank whose part fails tells the others through the store, and each
  // one waiting for a connection looks there now and then.
  FailureBoard failures(store, key + "/failed", kFailureCheckInterval);
  // Whether this rank learnt of another's failure from its address (which
  // is then the one to raise, not to publish again).
  bool told = false;
  auto publishFailure = [&](const std::string& why) {
    if (!told && !failures.seen()) {
      failures.publish(str("rank ", rank, " could not connect to its peers on other nodes: ", why));
    }
  };
  // After this rank's own connection failed: a peer that failed may be why,
  // and its cause is the one to name (the store failing too changes nothing).
  auto preferPublished = [&] {
    try {
      failures.check(/*now=*/true);
    } catch (const Error&) {
      if (failures.seen()) {
        throw;
      }
    }
  };

  SipKey secret;
  if (rank == 0) {
    // Before anything that can fail: every rank of the mesh waits for it.
    randomBytes(&secret, sizeof(secret));
    std::vector<uint8_t> bytes(sizeof(secret));
    std::memcpy(bytes.data(), &secret, sizeof(secret));
    store.set(key + "/secret", bytes);
  }
  SockAddr addr = nic_.address;
  Fd listener;
  try {
    listener = listenOn(&addr, options.port_low, options.port_high);
  } catch (const Error& e) {
    // The lower peers wait for this rank's address: they get why instead.
    store.set(str(key, "/addr/", rank), taggedFailure(e.what()));
    publishFailure(e.what());
    throw;
  }
  listen_address_ = addr.str();
  store.set(str(key, "/addr/", rank), taggedValue(toBytes(listen_address_)));
  if (!peers.empty()) {
    SMDDP_LOG(kInfo, "rank ", rank, ": ", key, " sockets on ", nic_.str(), ", listening on ", listen_address_);
  }
  if (rank != 0) {
    std::vector<uint8_t> bytes = store.get(key + "/secret");
    SMDDP_ASSERT(bytes.size() == sizeof(secret), "bad secret size");
    std::memcpy(&secret, bytes.data(), sizeof(secret));
  }

  std::set<int> lower;
  std::vector<int> higher;
  for (int p : peers) {
    if (p < rank) {
      lower.insert(p);
    } else if (p > rank) {
      higher.push_back(p);
    }
  }
  std::sort(higher.begin(), higher.end());

  // Accept the lower ranks' connections on a thread while connecting to the
  // higher ones, so no pair waits for the other's order. The acceptor stops
  // when told to (this rank failed, or learned that another did).
  std::map<int, std::vector<Fd>> accepted;
  std::exception_ptr accept_error;
  std::atomic<bool> stop{false};
  std::mutex done_mu;
  std::condition_variable done_cv;
  bool accept_done = false;
  std::thread acceptor([&] {
    try {
      size_t want = lower.size() * static_cast<size_t>(streams);
      size_t got = 0;
      std::map<int, std::vector<Fd>> slots;
      for (int p : lower) {
        slots[p].resize(static_cast<size_t>(streams));
      }
      // A connection gets this long to prove itself; the peers' own
      // handshakes go on beside it meanwhile.
      constexpr auto kProveWithin = std::chrono::seconds(5);
      std::vector<AcceptedHandshake> pending;
      auto drop = [&](size_t i, const std::string& why) {
        SMDDP_LOG(kWarn, "rank ", rank, ": dropped a connection to ", listen_address_,
                  " that is not a peer of this group: ", why);
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      };
      while (got < want && !stop.load()) {
        if (deadline.expired()) {
          SMDDP_THROW(kTimeout, "only ", got, " of ", want, " expected connections from other nodes arrived at ",
                      listen_address_, " (missing: ", missingRanks(slots), "; did they create the group, and can they "
                      "reach this address?)");
        }
        std::vector<struct pollfd> fds;
        fds.push_back({listener.get(), POLLIN, 0});
        auto wake = Clock::now() + std::chrono::milliseconds(100);
        for (const AcceptedHandshake& h : pending) {
          fds.push_back({h.fd(), POLLIN, 0});
          wake = std::min(wake, h.until());
        }
        wake = std::min(wake, deadline.at());
        const auto ms = std::chrono::ceil<std::chrono::milliseconds>(wake - Clock::now()).count();
        if (::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(ms, 0, 100))) < 0 && errno != EINTR) {
          SMDDP_SYSCHECK(-1, "poll() on the connections being accepted");
        }
        // Back to front, so that dropping one leaves the others' indices.
        for (size_t i = pending.size(); i-- > 0;) {
          const short ready = fds[i + 1].revents;
          try {
            if (ready != 0 && pending[i].step(secret, rank, streams, lower)) {
              const Hello& h = pending[i].hello();
              Fd& slot = slots[static_cast<int>(h.from)][h.stream];
              if (slot.get() >= 0) {
                SMDDP_THROW(kComm, "duplicate connection from rank ", h.from, " stream ", h.stream);
              }
              slot = pending[i].release();
              pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
              ++got;
            } else if (Clock::now() >= pending[i].until()) {
              drop(i, "it did not prove itself within 5 s");
            }
          } catch (const Error& e) {
            drop(i, e.what());
          }
        }
        if ((fds[0].revents & POLLIN) != 0) {
          Fd c;
          try {
            c = acceptReady(listener.get());
          } catch (const Error& e) {
            throw Error(e.kind(), str("accepting the connections of other nodes at ", listen_address_, ": ", e.what()));
          }
          if (c.get() >= 0) {
            pending.emplace_back(std::move(c), std::min(Clock::now() + kProveWithin, deadline.at()));
          }
        }
      }
      accepted = std::move(slots);
    } catch (...) {
      accept_error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(done_mu);
    accept_done = true;
    done_cv.notify_all();
  });

  std::map<int, std::vector<Fd>> connected;
  std::exception_ptr connect_error;
  try {
    std::vector<std::string> addr_keys;
    for (int p : higher) {
      addr_keys.push_back(str(key, "/addr/", p));
    }
    const std::vector<std::vector<uint8_t>> addrs = store.getAll(addr_keys);
    const std::chrono::milliseconds patience =
        options.connect_patience.count() > 0 ? options.connect_patience : connectPatience(options.timeout);
    for (size_t i = 0; i < higher.size(); ++i) {
      const int p = higher[i];
      std::vector<uint8_t> published;
      std::string why;
      if (!untag(addrs[i], &published, &why)) {
        told = true;
        SMDDP_THROW(kComm, "rank ", p, " could not listen for its connections: ", why);
      }
      SockAddr peer_addr = SockAddr::parse(toString(published));
      const std::string to = str("connecting to rank ", p, " at ", peer_addr.str(), " from ", nic_.str(), ": ");
      for (int s = 0; s < streams; ++s) {
        Fd c;
        try {
          c = connectTo(peer_addr, deadline, &nic_.address, patience, [&] { failures.check(); });
        } catch (const Error& e) {
          if (failures.seen()) {
            throw;
          }
          preferPublished();
          if (e.kind() != ErrorKind::kComm) {
            throw Error(e.kind(), to + e.what());
          }
          // Rank p listened there before it published the address: what
          // refuses or ignores the connection is between the hosts.
          SMDDP_THROW(kComm, to, e.what(), ". Rank ", p, " listens there, so the path or the address does not "
                      "work between the two hosts: a firewall or security group that does not admit TCP between "
                      "them (smddp listens on ephemeral ports, or on SMDDP_SOCKET_PORTS if it names a range the firewall "
                      "admits), or a NIC through which they do not reach each other "
                      "(SMDDP_SOCKET_IFNAME chooses one)");
        }
        try {
          handshakeConnect(c.get(), secret, rank, p, s, streams, deadline, [&] { failures.check(); });
        } catch (const Error& e) {
          if (failures.seen()) {
            throw;
          }
          preferPublished();
          throw Error(e.kind(), to + e.what());
        }
        connected[p].push_back(std::move(c));
      }
    }
    // The lower peers' connections, watching for a failure elsewhere.
    std::unique_lock<std::mutex> lock(done_mu);
    while (!accept_done) {
      done_cv.wait_for(lock, std::chrono::milliseconds(100));
      lock.unlock();
      failures.check();
      lock.lock();
    }
  } catch (...) {
    connect_error = std::current_exception();
  }
  stop.store(true);
  acceptor.join();
  for (std::exception_ptr error : {connect_error, accept_error}) {
    if (!error) {
      continue;
    }
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      publishFailure(e.what());
      throw;
    }
  }
  // Both ends bound their receive buffers before any data moves (the
  // handshakes are done), so the window a peer sees is the bounded one.
  if (options.rcvbuf_bytes > 0) {
    for (auto* side : {&accepted, &connected}) {
      for (auto& [p, fds] : *side) {
        for (Fd& fd : fds) {
          setReceiveBuffer(fd.get(), options.rcvbuf_bytes);
        }
      }
    }
  }
  const std::chrono::milliseconds stall = stallTimeout(options.timeout);
  for (auto* side : {&accepted, &connected}) {
    for (auto& [p, fds] : *side) {
      channels_[p] = std::make_unique<SocketChannel>(rank, p, std::move(fds), secret, nic_, stall);
    }
  }
}

std::string SocketMesh::describePeer(int peer) const {
  auto it = channels_.find(peer);
  return it == channels_.end() ? str("rank ", peer) : it->second->describe();
}

SocketMesh::~SocketMesh() = default;

SocketChannel& SocketMesh::channel(int peer) {
  auto it = channels_.find(peer);
  SMDDP_ASSERT(it != channels_.end(), "no connection to rank ", peer);
  return *it->second;
}

void SocketMesh::sendAbortAll(const std::string& why) {
  for (auto& [p, c] : channels_) {
    c->sendAbort(why);
  }
}

void SocketMesh::shutdownAll(const std::string& why) {
  for (auto& [p, c] : channels_) {
    c->shutdown(why);
  }
}

} // namespace smddp::transport
