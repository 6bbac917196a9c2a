#include "transport/shm/futex.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace smddp::transport {

void futexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout_ns / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout_ns % 1000000000);
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  // EAGAIN (word changed), EINTR and ETIMEDOUT all mean "look again".
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void Doorbell::ring() {
  word.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_seq_cst) != 0) {
    futexWakeAll(&word);
  }
}

void yieldThread() {
  ::sched_yield();
}

void throwTimeout(const WaitWhat& what) {
  SMDDP_THROW(kTimeout, "timed out waiting for ", what ? what() : std::string("a peer"));
}

} // namespace smddp::transport
