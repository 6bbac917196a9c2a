// Deadlines: every blocking wait in smddp is bounded by one.
#pragma once

#include <chrono>
#include <cstdint>

namespace smddp {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  Deadline() : at_(Clock::time_point::max()) {}
  explicit Deadline(Clock::time_point at) : at_(at) {}
  static Deadline after(std::chrono::milliseconds timeout) {
    if (timeout.count() <= 0 ||
        timeout > std::chrono::hours(24 * 365)) {
      return Deadline();
    }
    return Deadline(Clock::now() + timeout);
  }
  bool expired() const {
    return at_ != Clock::time_point::max() && Clock::now() >= at_;
  }
  // Nanoseconds left, clamped to [0, cap].
  int64_t remainingNs(int64_t cap) const {
    if (at_ == Clock::time_point::max()) {
      return cap;
    }
    int64_t left = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       at_ - Clock::now())
                       .count();
    return left < 0 ? 0 : (left > cap ? cap : left);
  }
  Clock::time_point at() const {
    return at_;
  }
  // The same deadline `extra` later (an unbounded one stays unbounded).
  Deadline later(std::chrono::milliseconds extra) const {
    return at_ == Clock::time_point::max() ? *this : Deadline(at_ + extra);
  }

 private:
  Clock::time_point at_;
};

inline uint64_t nowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          Clock::now().time_since_epoch())
          .count());
}

} // namespace smddp
