// Waiting on shared memory without burning the CPU that the peer needs.
//
// A waiter spins for `spin_us` (the peer is usually running on another core
// and answers in well under a microsecond), then yields for `yield_us` (on an
// oversubscribed host the peer may be waiting for this very core), then
// sleeps on a futex in slices of at most kSliceMs, calling `check` between
// slices (peer liveness, group abort) and giving up at the deadline.
//
// The protocol on a Doorbell (a futex word plus a count of sleepers, both in
// shared memory): a poster first publishes its state change, then ring()s;
// ring() bumps the word and wakes only when someone sleeps. A waiter
// registers as a sleeper, re-checks its predicate, and sleeps only if the word
// still has the value it read before that check. Both sides use sequentially
// consistent operations, so either the poster sees the sleeper or the sleeper
// sees the state change: no wake-up is lost.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "common/clock.h"
#include "common/error.h"

namespace smddp::transport {

struct Doorbell {
  std::atomic<uint32_t> word{0};
  std::atomic<uint32_t> sleepers{0};

  void ring();
};

constexpr int kSliceMs = 50;

struct WaitPolicy {
  int spin_us = 20;
  // Yielding hands the core to a runnable peer at once; when the host has
  // more ranks than cores, the awaited peer is often waiting for this core.
  int yield_us = 20;
};

// Called between sleeps; throws to abandon the wait (peer died, abort).
using WaitCheck = std::function<void()>;
// Describes what is awaited, for the timeout message.
using WaitWhat = std::function<std::string()>;

void futexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns);
void futexWakeAll(std::atomic<uint32_t>* word);

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

void yieldThread();

[[noreturn]] void throwTimeout(const WaitWhat& what);

// Blocks until pred() is true. `bell` must be rung after every change that
// can make pred() true.
template <typename Pred>
void waitUntil(
    Doorbell& bell,
    Pred&& pred,
    const WaitPolicy& policy,
    const Deadline& deadline,
    const WaitCheck& check,
    const WaitWhat& what) {
  if (pred()) {
    return;
  }
  // Spin: check the clock every 64 iterations only.
  if (policy.spin_us > 0) {
    const uint64_t until = nowNs() + static_cast<uint64_t>(policy.spin_us) * 1000;
    for (uint32_t i = 1;; ++i) {
      cpuRelax();
      if (pred()) {
        return;
      }
      if ((i & 63) == 0 && nowNs() >= until) {
        break;
      }
    }
  }
  if (policy.yield_us > 0) {
    const uint64_t until = nowNs() + static_cast<uint64_t>(policy.yield_us) * 1000;
    do {
      yieldThread();
      if (pred()) {
        return;
      }
    } while (nowNs() < until);
  }
  while (true) {
    uint32_t seen = bell.word.load(std::memory_order_seq_cst);
    bell.sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (pred()) {
      bell.sleepers.fetch_sub(1, std::memory_order_seq_cst);
      return;
    }
    futexWait(&bell.word, seen, deadline.remainingNs(int64_t{kSliceMs} * 1000000));
    bell.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (pred()) {
      return;
    }
    if (check) {
      check();
    }
    if (deadline.expired()) {
      throwTimeout(what);
    }
  }
}

} // namespace smddp::transport
