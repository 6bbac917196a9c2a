#include "transport/shm/shm_channel.h"

#include <cstring>

#include "common/copy.h"
#include "common/error.h"

namespace smddp::transport {

ShmChannel::ShmChannel(NodeArena& arena, int peer_local, int peer_rank)
    : arena_(arena), me_(arena.localRank()), peer_local_(peer_local), peer_rank_(peer_rank) {
  // Counters persist in the arena across channels of the same pair.
  pieces_sent_ = arena_.pair(me_, peer_local_).sent.load(std::memory_order_acquire);
  pieces_received_ = arena_.pair(me_, peer_local_).acked.load(std::memory_order_acquire);
}

uint64_t ShmChannel::postSend(const void* buf, size_t bytes, const MessageTag& tag) {
  Op op;
  op.src = static_cast<const uint8_t*>(buf);
  op.bytes = bytes;
  op.tag = tag;
  sends_.push_back(op);
  return sends_posted_++;
}

uint64_t ShmChannel::postRecv(void* buf, size_t bytes, const MessageTag& tag) {
  Op op;
  op.dst = static_cast<uint8_t*>(buf);
  op.bytes = bytes;
  op.tag = tag;
  recvs_.push_back(op);
  return recvs_posted_++;
}

bool ShmChannel::progress() {
  bool moved = false;
  PairLine& out = arena_.pair(me_, peer_local_);
  PairLine& in = arena_.pair(peer_local_, me_);
  const int32_t kSlots = 2;

  // Sends: write pieces while a slot is free (its previous piece acked).
  for (Op& op : sends_) {
    while (!op.all_written) {
      uint32_t acked = in.acked.load(std::memory_order_acquire);
      if (static_cast<int32_t>(pieces_sent_ - acked) >= kSlots) {
        break;
      }
      const size_t n = std::min(pieceCapacity(), op.bytes - op.off);
      uint8_t* slot = arena_.slot(me_, pieces_sent_);
      PieceHeader h{};
      h.tag = op.tag;
      h.bytes = op.bytes;
      h.offset = op.off;
      h.length = n;
      std::memcpy(slot, &h, sizeof(h));
      copyBytes(slot + kPieceHeaderBytes, op.src + op.off, n);
      op.off += n;
      op.all_written = op.off == op.bytes;
      op.last_piece = ++pieces_sent_;
      out.sent.store(pieces_sent_, std::memory_order_release);
      arena_.control(peer_local_).inbox.ring();
      moved = true;
    }
    if (!op.all_written) {
      break;
    }
  }
  // A send is done once its last piece has been acknowledged.
  const uint32_t acked = in.acked.load(std::memory_order_acquire);
  while (!sends_.empty() && sends_.front().all_written &&
         static_cast<int32_t>(acked - sends_.front().last_piece) >= 0) {
    sends_.pop_front();
    ++sends_done_;
    moved = true;
  }

  // Receives: copy out the pieces the peer has written.
  while (!recvs_.empty()) {
    const uint32_t sent = in.sent.load(std::memory_order_acquire);
    if (sent == pieces_received_) {
      break;
    }
    Op& op = recvs_.front();
    const uint8_t* slot = arena_.slot(peer_local_, pieces_received_);
    PieceHeader h;
    std::memcpy(&h, slot, sizeof(h));
    if (!h.tag.sameCall(op.tag) || h.bytes != op.bytes || h.offset != op.off || h.length > pieceCapacity() ||
        h.offset + h.length > op.bytes) {
      throwDisagreement(peer_rank_, h.tag, h.bytes, arena_.groupRankOf(me_), op.tag, op.bytes);
    }
    copyBytes(op.dst + op.off, slot + kPieceHeaderBytes, h.length);
    op.off += h.length;
    ++pieces_received_;
    out.acked.store(pieces_received_, std::memory_order_release);
    arena_.control(peer_local_).inbox.ring();
    moved = true;
    if (op.off == op.bytes) {
      recvs_.pop_front();
      ++recvs_done_;
    }
  }
  return moved;
}

void ShmChannel::checkPeer() {
  arena_.checkAborted();
  if ((sends_.empty() && recvs_.empty()) || !arena_.peerExited(peer_local_)) {
    return;
  }
  // The peer may have acknowledged or sent the last pieces just before it
  // exited: take them, and fail only if something is still missing.
  progress();
  if (!sends_.empty() || !recvs_.empty()) {
    arena_.checkAlive(peer_local_);
  }
}

void ShmChannel::sendAbort(const std::string& why) {
  arena_.abort(why);
}

} // namespace smddp::transport
