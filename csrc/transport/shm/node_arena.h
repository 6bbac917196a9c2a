// The shared-memory arena of the ranks of one node in one process group.
//
// Layout of the segment (one per group and node, created by local rank 0):
//
//   ArenaHeader                       abort flag + message, attach count
//   RankControl[local_size]           per rank, each on its own cache lines:
//                                       phase    sync rounds posted
//                                       progress pipelined chunks posted
//                                       bell     rung on every post
//                                       inbox    rung by posts meant for it
//                                       desc[2]  the call it is in (by parity)
//   PairLine[local_size][local_size]  point-to-point channel counters
//   slots[local_size][2][slot_bytes]  per rank, two staging buffers
//
// Ownership: each rank writes only its own RankControl and its own slots;
// everybody reads everything. A rank never writes a slot again before every
// peer has posted the round after the one that read it (double buffering by
// parity), so the sync rounds double as "done reading" acknowledgements.
//
// Threading: one thread of a rank drives the arena at a time (the
// executor's). abort() and check() may be called from any thread.
//
// Timeouts and failures: every wait is bounded by a Deadline; while it sleeps
// it checks that the peers are alive (pidfd) and that no rank aborted, so a
// dead peer or a failed rank is reported within one kSliceMs slice.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/store.h"
#include "transport/shm/futex.h"
#include "transport/shm/segment.h"

namespace smddp::transport {

// Room for what a rank publishes about the call it is in: peers compare it
// with their own (mismatch detection) and read the addresses in it
// (single-copy). The arena only stores it; its content is the algorithm
// layer's call descriptor (algorithm/protocol.h).
struct alignas(8) DescSlot {
  unsigned char bytes[64] = {};
};
static_assert(sizeof(DescSlot) == 64, "a descriptor is one cache line");

struct alignas(64) RankControl {
  std::atomic<uint32_t> phase{0};
  std::atomic<uint32_t> progress{0};
  int32_t pid = 0;
  uint32_t attached = 0;
  uint64_t start_time = 0;
  uint64_t cookie = 0;
  uint64_t cookie_addr = 0;
  uint32_t single_copy_ok = 0;
  uint64_t echo_addr = 0;
  char pad0[12];
  // Rung by the owner on every post (peers waiting for one rank sleep here).
  Doorbell bell;
  // Rung by whoever posts something for this rank (point-to-point channels:
  // a rank waiting on several peers sleeps on its own inbox).
  Doorbell inbox;
  char pad1[48];
  DescSlot desc[2];
};

// Counters of the point-to-point channel from one local rank to another,
// written only by the first: pieces sent to the other, pieces acknowledged
// from the other.
struct alignas(64) PairLine {
  std::atomic<uint32_t> sent{0};
  std::atomic<uint32_t> acked{0};
};

struct ArenaHeader {
  uint64_t magic = 0;
  uint32_t version = 0;
  uint32_t local_size = 0;
  uint64_t slot_bytes = 0;
  uint64_t total_bytes = 0;
  std::atomic<uint32_t> attached{0};
  std::atomic<uint32_t> aborted{0};
  char abort_msg[1024];
};

// The nearest process that every one of `pids` is, or descends from (a
// process counts as its own ancestor); 0 if there is none.
int nearestCommonAncestor(const std::vector<int>& pids);

// Yama's kernel.yama.ptrace_scope, or -1 where the kernel has no Yama.
int yamaPtraceScope();

class NodeArena {
 public:
  struct Options {
    size_t slot_bytes = 1 << 20;
    WaitPolicy wait;
    std::chrono::milliseconds timeout{30000};
    // The setting that sizes the slots, named where they do not fit.
    const char* slot_setting = nullptr;
  };

  // Collective over the node's ranks. `key` must be unique to the group and
  // node in `store`; `group_ranks[l]` is the group rank of local rank l (for
  // messages).
  NodeArena(
      Store& store,
      const std::string& key,
      int local_rank,
      const std::vector<int>& group_ranks,
      const Options& options);
  ~NodeArena();
  NodeArena(const NodeArena&) = delete;
  NodeArena& operator=(const NodeArena&) = delete;

  int localRank() const {
    return local_rank_;
  }
  int localSize() const {
    return local_size_;
  }
  int groupRankOf(int l) const {
    return group_ranks_[static_cast<size_t>(l)];
  }
  size_t slotBytes() const {
    return slot_bytes_;
  }
  const WaitPolicy& waitPolicy() const {
    return options_.wait;
  }
  // Whether every rank of the node can read every other's memory
  // (process_vm_readv), probed at set-up.
  bool singleCopyAvailable() const {
    return single_copy_ok_;
  }

  RankControl& control(int l) const {
    return controls_[l];
  }
  // The descriptor of call `seq` (by parity): this rank's, local rank l's.
  DescSlot& myDesc(uint64_t seq) const {
    return controls_[local_rank_].desc[seq & 1];
  }
  const DescSlot& peerDesc(int l, uint64_t seq) const {
    return controls_[l].desc[seq & 1];
  }
  uint8_t* slot(int l, uint32_t parity) const {
    return slots_ + (static_cast<size_t>(l) * 2 + (parity & 1)) * slot_bytes_;
  }
  PairLine& pair(int from, int to) const {
    return pairs_[static_cast<size_t>(from) * static_cast<size_t>(local_size_) + static_cast<size_t>(to)];
  }

  // Sync rounds: post() publishes the next phase; peers wait for it.
  uint32_t phase() const {
    return my_phase_;
  }
  void post();
  void waitPhase(int l, uint32_t target, const Deadline& deadline);
  void waitAllPhase(uint32_t target, const Deadline& deadline);

  // Pipelined progress: a monotonic counter per rank.
  uint32_t progress() const {
    return my_progress_;
  }
  void postProgress(uint32_t value);
  void waitProgress(int l, uint32_t target, const Deadline& deadline);

  // Copies `bytes` from address `src` of local rank l into `dst`.
  void readFrom(int l, void* dst, uint64_t src, size_t bytes);
  // Copies `bytes` from `src` to address `dst` of local rank l.
  void writeTo(int l, uint64_t dst, const void* src, size_t bytes);

  // Marks the arena failed: every local rank's next wait throws `msg`.
  void abort(const std::string& msg);
  // Throws if the arena was aborted.
  void checkAborted();
  // The message of the abort, "" while the arena is not aborted (from any
  // thread; never throws).
  std::string abortMessage() const;
  // Whether local rank l has exited (whatever it wrote before is visible).
  bool peerExited(int l) const;
  // Throws kPeerLost (and aborts the arena) if local rank l has exited.
  // Only a peer this rank still needs something from may be checked: a peer
  // that finished its last call and exited is not a failure.
  void checkAlive(int l);

 private:
  // process_vm_readv/writev of `bytes` between `local` and local rank l's
  // address `remote`, resumed after partial transfers.
  void crossMemory(int l, uint8_t* local, uint64_t remote, size_t bytes, bool write);
  void initControl();
  // The arena's abort flag, once a rank writing its message is done (or
  // after a bounded wait for it).
  uint32_t abortState() const;
  void closePidfds();
  void waitAttached(const Deadline& deadline, const WaitCheck& check);
  void probeSingleCopy(const Deadline& deadline);
  void allowNodePeersToRead();
  std::string describePeer(int l) const;
  // Waits until local rank l's `counter` reaches `target` (or the arena is
  // aborted, or l exits).
  void waitCounter(
      int l,
      std::atomic<uint32_t> RankControl::*counter,
      uint32_t target,
      const Deadline& deadline);

  Options options_;
  int local_rank_;
  int local_size_;
  std::vector<int> group_ranks_;
  size_t slot_bytes_;
  std::unique_ptr<SharedSegment> segment_;
  ArenaHeader* header_ = nullptr;
  RankControl* controls_ = nullptr;
  PairLine* pairs_ = nullptr;
  uint8_t* slots_ = nullptr;
  std::vector<int> pidfds_;
  std::vector<int> pids_;
  uint32_t my_phase_ = 0;
  uint32_t my_progress_ = 0;
  bool single_copy_ok_ = false;
  uint64_t probe_cookie_ = 0;
  uint64_t probe_echo_ = 0;
};

} // namespace smddp::transport
