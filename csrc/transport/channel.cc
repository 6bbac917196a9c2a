#include "transport/channel.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

#include "common/error.h"

namespace smddp::transport {

void throwDisagreement(
    int peer,
    const MessageTag& got,
    uint64_t got_bytes,
    int me,
    const MessageTag& want,
    uint64_t want_bytes) {
  SMDDP_THROW(
      kMismatch,
      "ranks disagree on collective #",
      want.seq,
      ": rank ",
      peer,
      " sent ",
      got_bytes,
      " bytes of #",
      got.seq,
      " ",
      got.describe(),
      ", rank ",
      me,
      " expected ",
      want_bytes,
      " bytes of #",
      want.seq,
      " ",
      want.describe(),
      ". Every rank of a group must make the same collective calls in the same order, with the same "
      "sizes, dtypes and reduce ops");
}

void drive(
    const std::vector<Channel*>& channels,
    const std::function<bool()>& step,
    const std::function<bool()>& done,
    const Deadline& deadline,
    const DriveOptions& options) {
  // The doorbell every channel shares, if they all have one and no channel
  // or wake descriptor needs poll().
  Doorbell* shared_bell = nullptr;
  bool bell_only = !channels.empty() && options.wake_fd < 0;
  bool some_bell = false;
  std::vector<struct pollfd> probe;
  for (Channel* c : channels) {
    probe.clear();
    c->appendPollFds(&probe);
    if (!probe.empty()) {
      bell_only = false;
    } else {
      some_bell = true;
      if (c->bell() == nullptr || (shared_bell != nullptr && c->bell() != shared_bell)) {
        bell_only = false;
      } else {
        shared_bell = c->bell();
      }
    }
  }
  if (!bell_only) {
    shared_bell = nullptr;
  }
  uint64_t idle_since = 0;
  std::vector<struct pollfd> fds;
  while (true) {
    const uint32_t seen = shared_bell ? shared_bell->word.load(std::memory_order_seq_cst) : 0;
    bool moved = step ? step() : false;
    for (Channel* c : channels) {
      moved = c->progress() || moved;
    }
    if (done()) {
      return;
    }
    if (moved) {
      idle_since = 0;
      continue;
    }
    const uint64_t now = nowNs();
    if (idle_since == 0) {
      idle_since = now;
    }
    const uint64_t idle = now - idle_since;
    if (idle < static_cast<uint64_t>(options.policy.spin_us) * 1000) {
      cpuRelax();
      continue;
    }
    // Yield only for shared-memory peers: a socket's data wakes poll().
    if (some_bell &&
        idle < static_cast<uint64_t>(options.policy.spin_us + options.policy.yield_us) * 1000) {
      yieldThread();
      continue;
    }
    if (deadline.expired()) {
      throwTimeout(options.what);
    }
    if (options.check) {
      options.check();
    }
    for (Channel* c : channels) {
      c->checkPeer();
    }
    if (shared_bell != nullptr) {
      shared_bell->sleepers.fetch_add(1, std::memory_order_seq_cst);
      futexWait(&shared_bell->word, seen, deadline.remainingNs(int64_t{kSliceMs} * 1000000));
      shared_bell->sleepers.fetch_sub(1, std::memory_order_seq_cst);
      continue;
    }
    fds.clear();
    for (Channel* c : channels) {
      c->appendPollFds(&fds);
    }
    if (options.wake_fd >= 0) {
      fds.push_back({options.wake_fd, POLLIN, 0});
    }
    // Shared-memory peers cannot interrupt poll(): look again soon.
    const int64_t cap_ms = some_bell ? 1 : kSliceMs;
    int timeout_ms = static_cast<int>(deadline.remainingNs(cap_ms * 1000000) / 1000000);
    if (timeout_ms == 0 && !deadline.expired()) {
      timeout_ms = 1;
    }
    int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) {
      SMDDP_SYSCHECK(-1, "poll");
    }
    if (options.wake_fd >= 0 && !fds.empty() && (fds.back().revents & POLLIN)) {
      uint64_t drained = 0;
      [[maybe_unused]] ssize_t r = ::read(options.wake_fd, &drained, sizeof(drained));
    }
  }
}

} // namespace smddp::transport
