// Revoking what the node's peers map of a rank's memory before the rank
// frees it (SMDDP_CUDA_ZERO_COPY: CUDA IPC leaves a free of memory another
// process still maps undefined, so the owner asks every peer to close its
// mapping first and waits until each has).
//
// Each rank owns one RevokeBox in the node arena (the caller says where),
// written only by it:
//   posted       revocations this rank has posted, as owner
//   ids[s % N]   the allocation revocation s names (the last kIds of them)
//   served[o]    owner o's revocations this rank has served (closed its
//                mapping, or held none); kHoldsNothing once this rank has
//                closed all it mapped (teardown)
// An owner posts one revocation at a time: it writes its id, raises
// `posted`, rings the peers' inboxes, and waits until every peer's
// served[owner] reaches it (or the peer has exited). Each rank's service
// thread sleeps on its own inbox, closes through the callback what every
// revocation up to `posted` names, raises its served[owner] and rings the
// owner's inbox. A peer that fell more than kIds behind (its owner gave up
// waiting for it that often) has lost the oldest ids, which it says.
//
// Threading: revoke() from any thread (serialized inside); the callback runs
// on the service thread, and must not wait for anything an owner's revoke()
// can hold (the allocator's lock, the GIL).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "transport/shm/node_arena.h"

namespace smddp::transport {

struct RevokeBox {
  static constexpr int kMaxRanks = 64;
  static constexpr int kIds = 16;
  static constexpr uint64_t kHoldsNothing = ~0ull;
  std::atomic<uint64_t> posted{0};
  std::atomic<uint64_t> ids[kIds];
  std::atomic<uint64_t> served[kMaxRanks];
};
static_assert(std::is_trivially_destructible_v<RevokeBox>, "a RevokeBox lives in zeroed shared memory");

class Revocations {
 public:
  // `box(l)`: local rank l's box (zeroed memory shared by the node);
  // `close(owner, id)`: closes this rank's mapping of owner's allocation
  // `id`, if it holds one. Starts the service thread.
  Revocations(NodeArena& arena, std::function<RevokeBox*(int l)> box, std::function<void(int owner, uint64_t id)> close);
  // Stops the service thread and tells the owners that this rank holds
  // nothing any more: call it after closing every mapping.
  ~Revocations();
  Revocations(const Revocations&) = delete;
  Revocations& operator=(const Revocations&) = delete;

  // Asks every peer to close its mapping of this rank's allocation `id` and
  // waits until each has, or has exited (true), or until `deadline` (false,
  // with the local ranks that did not in `late`).
  bool revoke(uint64_t id, const Deadline& deadline, std::string* late);

 private:
  void serve();
  bool served(int l, uint64_t seq) const;

  NodeArena& arena_;
  std::function<RevokeBox*(int)> box_;
  std::function<void(int, uint64_t)> close_;
  std::vector<uint64_t> handled_;  // service thread only
  std::mutex revoke_mu_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

} // namespace smddp::transport
