#include "transport/shm/revocations.h"

#include "common/error.h"
#include "common/log.h"
#include "transport/shm/futex.h"

namespace smddp::transport {

namespace {

// The service thread's sleeps: it also wakes this often to see whether it
// should stop (the destructor rings it too).
constexpr int64_t kServeSliceNs = 1000000000;

} // namespace

Revocations::Revocations(
    NodeArena& arena,
    std::function<RevokeBox*(int l)> box,
    std::function<void(int owner, uint64_t id)> close)
    : arena_(arena),
      box_(std::move(box)),
      close_(std::move(close)),
      handled_(static_cast<size_t>(arena.localSize()), 0) {
  SMDDP_ASSERT(arena.localSize() <= RevokeBox::kMaxRanks, "(a node of at most ", RevokeBox::kMaxRanks, " ranks)");
  thread_ = std::thread([this] { serve(); });
}

Revocations::~Revocations() {
  stop_.store(true);
  arena_.control(arena_.localRank()).inbox.ring();
  thread_.join();
  // Whatever an owner revokes from now on, this rank holds none of it.
  RevokeBox* mine = box_(arena_.localRank());
  for (int o = 0; o < arena_.localSize(); ++o) {
    mine->served[o].store(RevokeBox::kHoldsNothing, std::memory_order_release);
    arena_.control(o).inbox.ring();
  }
}

bool Revocations::served(int l, uint64_t seq) const {
  return box_(l)->served[arena_.localRank()].load(std::memory_order_acquire) >= seq || arena_.peerExited(l);
}

bool Revocations::revoke(uint64_t id, const Deadline& deadline, std::string* late) {
  std::lock_guard<std::mutex> lock(revoke_mu_);
  const int me = arena_.localRank();
  RevokeBox* mine = box_(me);
  const uint64_t seq = mine->posted.load(std::memory_order_relaxed) + 1;
  mine->ids[seq % RevokeBox::kIds].store(id, std::memory_order_relaxed);
  mine->posted.store(seq, std::memory_order_release);
  for (int l = 0; l < arena_.localSize(); ++l) {
    if (l != me) {
      arena_.control(l).inbox.ring();
    }
  }
  auto all = [&] {
    for (int l = 0; l < arena_.localSize(); ++l) {
      if (l != me && !served(l, seq)) {
        return false;
      }
    }
    return true;
  };
  try {
    waitUntil(arena_.control(me).inbox, all, arena_.waitPolicy(), deadline, nullptr,
              [] { return std::string("the node's peers to close their mappings"); });
    return true;
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kTimeout) {
      throw;
    }
  }
  if (late != nullptr) {
    late->clear();
    for (int l = 0; l < arena_.localSize(); ++l) {
      if (l != me && !served(l, seq)) {
        *late += str(late->empty() ? "" : ", ", "local rank ", l, " (rank ", arena_.groupRankOf(l), ")");
      }
    }
  }
  return false;
}

void Revocations::serve() {
  const int me = arena_.localRank();
  Doorbell& inbox = arena_.control(me).inbox;
  RevokeBox* mine = box_(me);
  auto pending = [&] {
    for (int o = 0; o < arena_.localSize(); ++o) {
      if (o != me && box_(o)->posted.load(std::memory_order_acquire) > handled_[static_cast<size_t>(o)]) {
        return true;
      }
    }
    return false;
  };
  while (!stop_.load()) {
    // The doorbell protocol (futex.h): register, re-check, then sleep.
    const uint32_t seen = inbox.word.load(std::memory_order_seq_cst);
    inbox.sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (!pending() && !stop_.load()) {
      futexWait(&inbox.word, seen, kServeSliceNs);
    }
    inbox.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    for (int o = 0; o < arena_.localSize(); ++o) {
      const uint64_t posted = o == me ? 0 : box_(o)->posted.load(std::memory_order_acquire);
      if (posted <= handled_[static_cast<size_t>(o)]) {
        continue;
      }
      uint64_t& done = handled_[static_cast<size_t>(o)];
      if (posted - done > static_cast<uint64_t>(RevokeBox::kIds)) {
        SMDDP_LOG(kWarn, "local rank ", o, " revoked ", posted - done - RevokeBox::kIds, " allocations this rank ",
                  "served too late to know them; their mappings stay until it closes all");
        done = posted - RevokeBox::kIds;
      }
      for (uint64_t s = done + 1; s <= posted; ++s) {
        const uint64_t id = box_(o)->ids[s % RevokeBox::kIds].load(std::memory_order_relaxed);
        try {
          close_(o, id);
        } catch (const std::exception& e) {
          SMDDP_LOG(kWarn, "closing local rank ", o, "'s allocation ", id, " failed: ", e.what());
        }
      }
      done = posted;
      mine->served[o].store(posted, std::memory_order_release);
      arena_.control(o).inbox.ring();
    }
  }
}

} // namespace smddp::transport
