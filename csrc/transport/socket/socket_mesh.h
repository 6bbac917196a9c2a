// TCP connections between the ranks of a group that sit on different nodes.
//
// Set-up (collective over the group; every rank names the peers it needs,
// and the relation must be symmetric): group rank 0 puts a random 128-bit
// secret in the store; every rank listens on an ephemeral port of the
// address chosen by chooseListenAddress() and publishes it; for each pair
// the lower rank connects `streams` times. Each connection proves, both
// ways, that its ends know the secret (challenge-response with SipHash
// MACs over fresh nonces) before anything else is read from it; a
// connection that fails to (a stranger, junk, a wrong key) is dropped and
// the listener keeps waiting for the real peers. The listener closes once
// all peers are connected.
//
// Data: SocketChannel, one per peer, carries messages (frame.h) striped
// over the streams by message: message i of a direction uses stream
// i % streams, so both ends agree without negotiation. Every header is
// authenticated and bounds-checked before its length is believed.
//
// Threading: a channel is driven by one thread at a time; shutdownAll() may
// be called from any thread to make that thread fail promptly.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/store.h"
#include "transport/channel.h"
#include "transport/socket/frame.h"
#include "transport/socket/socket_util.h"

namespace smddp::transport {

class SocketChannel : public Channel {
 public:
  SocketChannel(int my_rank, int peer, std::vector<Fd> streams, SipKey key);
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
  void shutdown();

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
  };

  bool progressSends(Stream& s);
  bool progressRecvs(Stream& s);
  [[noreturn]] void lost(const std::string& what, int err);
  void finish(std::deque<bool>* flags, uint64_t* base, uint64_t* done, uint64_t id);

  const int my_rank_;
  const int peer_;
  const SipKey key_;
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
};

class SocketMesh {
 public:
  struct Options {
    std::string interface;  // SMDDP_SOCKET_IFNAME
    std::string peer_hint;  // the store's host: where to route from
    int streams = 1;
    // SO_RCVBUF of every connection; 0 keeps the kernel's autotuning.
    size_t rcvbuf_bytes = 0;
    std::chrono::milliseconds timeout{30000};
  };

  SocketMesh(
      Store& store,
      const std::string& key,
      int rank,
      const std::vector<int>& peers,
      const Options& options);
  ~SocketMesh();

  SocketChannel& channel(int peer);
  bool has(int peer) const {
    return channels_.count(peer) != 0;
  }
  // From the thread that drives the channels: tell every peer why.
  void sendAbortAll(const std::string& why);
  // From any thread: cut every connection so blocked work fails now.
  void shutdownAll();
  const std::string& listenAddress() const {
    return listen_address_;
  }

 private:
  std::map<int, std::unique_ptr<SocketChannel>> channels_;
  std::string listen_address_;
};

} // namespace smddp::transport
