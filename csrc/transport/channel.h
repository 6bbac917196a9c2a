// A Channel is an ordered, reliable, full-duplex pipe of messages to one
// peer, the interface the ring schedules are written against. Two
// implementations: SocketChannel (TCP, between nodes) and ShmChannel (the
// node's shared memory).
//
// Use: post sends and receives (each a message of known size; both sides
// post the same sizes in the same order), then drive() until the requests
// you need are complete. Requests of one direction complete in posting
// order; a request's buffer must stay valid until it completes. A message
// whose size or call differs from what the receiver posted is an error
// (kMismatch) naming both.
//
// Threading: a channel is driven by one thread at a time.
#pragma once

#include <poll.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/types.h"
#include "transport/shm/futex.h"

namespace smddp::transport {

// The collective a message belongs to: checked on receipt, and named in the
// error when the ranks disagree. Fields that do not matter for a call are 0
// (redop unless it reduces, root unless it broadcasts).
struct MessageTag {
  uint64_t seq = 0;  // the collective's sequence number
  CollectiveKind kind = CollectiveKind::kBarrier;
  DataType dtype = DataType::kUInt8;
  ReduceOp redop = ReduceOp::kSum;
  int32_t root = 0;
  uint64_t count = 0;

  bool sameCall(const MessageTag& o) const {
    return seq == o.seq && kind == o.kind && dtype == o.dtype && redop == o.redop && root == o.root &&
        count == o.count;
  }
  std::string describe() const {
    return describeCall(kind, dtype, redop, count, root);
  }
};

// The error for a message of `got` (`got_bytes` long) from rank `peer`
// where this rank (`me`) expected `want` (`want_bytes`).
[[noreturn]] void throwDisagreement(
    int peer,
    const MessageTag& got,
    uint64_t got_bytes,
    int me,
    const MessageTag& want,
    uint64_t want_bytes);

class Channel {
 public:
  virtual ~Channel() = default;

  // Group rank of the peer.
  virtual int peer() const = 0;
  // Request ids are the count of requests posted before, per direction.
  virtual uint64_t postSend(const void* buf, size_t bytes, const MessageTag& tag) = 0;
  virtual uint64_t postRecv(void* buf, size_t bytes, const MessageTag& tag) = 0;
  // How many sends / receives have completed (a prefix of the posted ones).
  virtual uint64_t sendsDone() const = 0;
  virtual uint64_t recvsDone() const = 0;
  // Moves what can move without blocking; true if anything did. Throws on
  // failure (peer lost, mismatch, abort).
  virtual bool progress() = 0;
  // Appends the descriptors (and events) that become ready when progress()
  // may succeed; a channel with none is woken through bell().
  virtual void appendPollFds(std::vector<struct pollfd>* fds) const {}
  // The doorbell rung when progress() may succeed (shared-memory channels).
  virtual Doorbell* bell() {
    return nullptr;
  }
  // Tells the peer this rank failed (best effort, never throws).
  virtual void sendAbort(const std::string& why) = 0;
  // Called between sleeps: throws if the peer is gone while this channel
  // still has something to do with it.
  virtual void checkPeer() {}
};

// Drives `channels` until done() holds or the deadline passes (kTimeout,
// naming what()). Each round calls step() (the schedule's own work: post
// requests whose inputs became ready, reduce what arrived; true if it did
// anything) and progress() on every channel. Between rounds without progress
// it waits: spinning briefly, then sleeping in poll() on the channels'
// descriptors and `wake_fd` (an eventfd another thread of this process
// writes), or on the doorbell all channels share. `check` runs between
// sleeps (aborts, liveness).
struct DriveOptions {
  WaitPolicy policy;
  int wake_fd = -1;
  std::function<void()> check;
  std::function<std::string()> what;
};

void drive(
    const std::vector<Channel*>& channels,
    const std::function<bool()>& step,
    const std::function<bool()>& done,
    const Deadline& deadline,
    const DriveOptions& options);

} // namespace smddp::transport
