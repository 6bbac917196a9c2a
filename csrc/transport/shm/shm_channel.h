// A point-to-point Channel between two ranks of one node, through the
// node's arena: the sender copies each message, in pieces of at most one
// slot, into its own two slots (alternating), the receiver copies them out
// and acknowledges. Used by the flat ring for its hops inside a node.
//
// Each piece starts with a small header (collective, call digest, message
// size, offset) that the receiver checks against what it posted. A send
// completes when its last piece is acknowledged, so the slots are free for
// whatever the rank does next. A rank has at most one outgoing ShmChannel
// at a time (it owns the two slots).
#pragma once

#include <deque>

#include "transport/channel.h"
#include "transport/shm/node_arena.h"

namespace smddp::transport {

class ShmChannel : public Channel {
 public:
  // Channel between this rank and local rank `peer_local` (group rank
  // `peer_rank`) of `arena`.
  ShmChannel(NodeArena& arena, int peer_local, int peer_rank);

  int peer() const override {
    return peer_rank_;
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
  Doorbell* bell() override {
    return &arena_.control(arena_.localRank()).inbox;
  }
  void sendAbort(const std::string& why) override;
  void checkPeer() override;

 private:
  struct PieceHeader {
    MessageTag tag;
    uint64_t bytes;   // the whole message
    uint64_t offset;  // of this piece in it
    uint64_t length;  // of this piece
  };
  static_assert(sizeof(PieceHeader) <= 64, "one cache line");

  struct Op {
    const uint8_t* src = nullptr;
    uint8_t* dst = nullptr;
    size_t bytes = 0;
    size_t off = 0;
    MessageTag tag;
    uint32_t last_piece = 0;  // sends: pieces up to here belong to this op
    bool all_written = false;
  };

  // Payloads start a cache line in.
  static constexpr size_t kPieceHeaderBytes = 64;
  size_t pieceCapacity() const {
    return arena_.slotBytes() - kPieceHeaderBytes;
  }

  NodeArena& arena_;
  const int me_;
  const int peer_local_;
  const int peer_rank_;
  std::deque<Op> sends_;
  std::deque<Op> recvs_;
  uint32_t pieces_sent_ = 0;
  uint32_t pieces_received_ = 0;
  uint64_t sends_posted_ = 0;
  uint64_t recvs_posted_ = 0;
  uint64_t sends_done_ = 0;
  uint64_t recvs_done_ = 0;
};

} // namespace smddp::transport
