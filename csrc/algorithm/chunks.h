// How the schedules cut what they move: a buffer into chunks of a fixed
// size, a tensor into one contiguous slice per rank, a position on a ring.
// Every rank computes the same cuts from the same sizes, which is what lets
// the two ends of a message agree on its length without telling each other.
#pragma once

#include <algorithm>
#include <cstddef>

namespace smddp::algorithm {

inline size_t ceilDiv(size_t a, size_t b) {
  return (a + b - 1) / b;
}

// a mod n in 0..n-1, also for negative a (ring positions).
inline int mod(int a, int n) {
  return ((a % n) + n) % n;
}

// The chunks of `total` units cut `chunk` at a time: at least one, so that
// an empty buffer still exchanges one (empty) message and both ends count
// alike.
inline size_t chunkCount(size_t total, size_t chunk) {
  return std::max<size_t>(1, ceilDiv(total, chunk));
}

// The length of chunk c of `total` units cut `chunk` at a time: `chunk`,
// less for the last, 0 past the end (the chunk of a shorter block where a
// longer one sets the count).
inline size_t chunkLen(size_t total, size_t chunk, size_t c) {
  const size_t off = c * chunk;
  return off >= total ? 0 : std::min(chunk, total - off);
}

// Splits `count` elements into `parts` contiguous slices (the first
// count % parts one longer), the same way on every rank.
struct Slices {
  size_t count;
  size_t parts;
  size_t begin(size_t i) const {
    return i * (count / parts) + (i < count % parts ? i : count % parts);
  }
  size_t size(size_t i) const {
    return count / parts + (i < count % parts ? 1 : 0);
  }
};

} // namespace smddp::algorithm
