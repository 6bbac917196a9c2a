// TCP connections between the ranks of a group that sit on different nodes.
//
// The Mesh of the TCP transport (transport/network.h; SocketNetwork makes
// it). Set-up (collective over the group; every rank names the peers it
// needs, and the relation must be symmetric): group rank 0 puts a random 128-bit
// secret in the store; every rank listens on a port of its NIC's address
// (Options::nic, see chooseNic(); the port ephemeral, or of Options'
// range) and publishes it; for each pair
// the lower rank connects `streams` times, from its NIC's address. So each
// direction of a pair leaves its host through the sender's NIC, and both
// directions of a rail (ranks of one local rank) travel on the rail's NICs.
// Each connection proves, both
// ways, that its ends know the secret (challenge-response with SipHash
// MACs over fresh nonces) before anything else is read from it; a
// connection that fails to (a stranger, junk, a wrong key) is dropped and
// the listener keeps waiting for the real peers. The listener closes once
// all peers are connected. A rank whose set-up fails (a connection refused
// or unanswered for connectPatience(), a peer's address it cannot use)
// publishes why under `key`/failed; the mesh's other ranks look there while
// they wait for connections, so every one fails at once naming it.
//
// Data: SocketChannel, one per peer, carries messages (frame.h) striped
// over the streams by message: message i of a direction uses stream
// i % streams, so both ends agree without negotiation. Every header is
// authenticated and bounds-checked before its length is believed.
//
// Failures name the peer, its address and this rank's NIC. A channel with
// work outstanding also fails, between the driver's sleeps, when its NIC
// goes down or loses its carrier, and when what it sent stays unacknowledged
// through retransmissions for stallTimeout() (a peer's kernel acknowledges
// even while its process is busy or stopped, so only a cut path or a
// vanished host does that); its node peers then learn why from its abort
// instead of timing out without a cause.
//
// Threading: a channel is driven by one thread at a time; shutdownAll() may
// be called from any thread to make that thread fail promptly.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/store.h"
#include "transport/channel.h"
#include "transport/network.h"
#include "transport/socket/frame.h"
#include "transport/socket/socket_util.h"

namespace smddp::transport {

class SocketChannel : public Channel {
 public:
  // `nic`: the local end's NIC; `stall`: see checkPeer().
  SocketChannel(
      int my_rank,
      int peer,
      std::vector<Fd> streams,
      SipKey key,
      Nic nic,
      std::chrono::milliseconds stall);
  ~SocketChannel() override;

  int peer() const override {
    return peer_;
  }
  uint64_t postSend(const void* buf, size_t bytes, const MessageTag& tag) override;
  uint64_t postRecv(void* buf, size_t bytes, const MessageTag& tag) override;
  uint64_t sendsDone() const override {
    return sends_done_;
  }
  uint64_t recvsDone() const override {
    return recvs_done_;
  }
  bool progress() override;
  // The smallest SO_RCVBUF of its connections, as the kernel reports it
  // (twice what was asked, for its bookkeeping).
  size_t receiveBufferBytes() const;
  void appendPollFds(std::vector<struct pollfd>* fds) const override;
  void sendAbort(const std::string& why) override;
  // Throws kPeerLost when this channel has work outstanding and its NIC is
  // down, or what it sent went unacknowledged for the stall time.
  void checkPeer() override;
  // From any thread: cuts the connection; what fails on it then fails with
  // `why` (kAborted).
  void shutdown(const std::string& why);
  // "rank 2 (other node, 198.18.0.2:40113) from nic0 (198.18.0.1)".
  std::string describe() const;

 private:
  struct SendOp {
    uint64_t id;
    uint8_t header[kFrameHeaderBytes];
    const uint8_t* buf;
    size_t bytes;
    size_t off;  // over header + payload
  };
  struct RecvOp {
    uint64_t id;
    uint8_t* buf;
    size_t bytes;
    MessageTag tag;
  };
  struct Stream {
    Fd fd;
    std::deque<SendOp> sends;
    std::deque<RecvOp> recvs;
    uint8_t header[kFrameHeaderBytes];
    size_t header_got = 0;
    bool have_header = false;
    FrameHeader current;
    size_t payload_got = 0;
    // The peer closed its end. Only an error if this rank still expects a
    // message on this stream (a peer that finished and exited is normal).
    bool eof = false;
    // When checkPeer() first saw sent data wait for its acknowledgement
    // through retransmissions (0: not now).
    uint64_t stall_since_ns = 0;
  };

  bool progressSends(Stream& s);
  bool progressRecvs(Stream& s);
  [[noreturn]] void lost(const std::string& what, int err);
  void finish(std::deque<bool>* flags, uint64_t* base, uint64_t* done, uint64_t id);

  const int my_rank_;
  const int peer_;
  const SipKey key_;
  const Nic nic_;
  const std::chrono::milliseconds stall_;
  std::string peer_address_;
  uint64_t last_check_ns_ = 0;
  std::vector<Stream> streams_;
  uint64_t sends_posted_ = 0;
  uint64_t recvs_posted_ = 0;
  uint64_t sends_done_ = 0;
  uint64_t recvs_done_ = 0;
  // Completion flags of requests from the first not-yet-done one on
  // (requests finish out of order across streams).
  std::deque<bool> send_flags_;
  std::deque<bool> recv_flags_;
  uint64_t send_base_ = 0;
  uint64_t recv_base_ = 0;
  // Why this rank cut the connections (shutdown()); set from any thread.
  std::mutex shut_mu_;
  std::string shut_why_;
};

class SocketMesh : public Mesh {
 public:
  struct Options {
    // This rank's NIC (chooseNic()); empty: chooseNic("", 0, 1, peer_hint).
    Nic nic;
    std::string peer_hint;  // the store's host: where to route from
    int streams = 1;
    // The ports a listener may take (SMDDP_SOCKET_PORTS); 0, 0: ephemeral.
    int port_low = 0;
    int port_high = 0;
    // SO_RCVBUF of every connection; 0 keeps the kernel's autotuning.
    size_t rcvbuf_bytes = 0;
    // Bounds the set-up; the group's timeout, from which the channels'
    // stall time follows (stallTimeout()).
    std::chrono::milliseconds timeout{30000};
    // How long a connection to a peer may be refused or go unanswered;
    // 0: connectPatience(timeout).
    std::chrono::milliseconds connect_patience{0};
  };

  // How long a connection to a peer may be refused or go unanswered before
  // the set-up fails naming that path: half the group's timeout, at least
  // 1 s and at most 30 s. A peer listens before it publishes its address, so
  // what lasts that long is the path or the address, not a late peer; 30 s
  // leaves room for the retransmissions of several lost SYNs.
  static std::chrono::milliseconds connectPatience(std::chrono::milliseconds timeout);

  // How long sent data may stay unacknowledged through retransmissions
  // before a channel gives its peer up: half the group's timeout (so that
  // the cause, not a timeout, is what every rank reports), at least 1 s and
  // at most the keepalive's limit on a silent peer.
  static std::chrono::milliseconds stallTimeout(std::chrono::milliseconds timeout);

  SocketMesh(
      Store& store,
      const std::string& key,
      int rank,
      const std::vector<int>& peers,
      const Options& options);
  ~SocketMesh() override;

  SocketChannel& channel(int peer) override;
  bool has(int peer) const override {
    return channels_.count(peer) != 0;
  }
  void sendAbortAll(const std::string& why) override;
  void shutdownAll(const std::string& why) override;
  const std::string& listenAddress() const {
    return listen_address_;
  }
  const Nic& nic() const override {
    return nic_;
  }
  std::string describePeer(int peer) const override;

 private:
  std::map<int, std::unique_ptr<SocketChannel>> channels_;
  std::string listen_address_;
  Nic nic_;
};

} // namespace smddp::transport
