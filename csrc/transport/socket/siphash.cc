#include "transport/socket/siphash.h"

#include <cstring>

namespace smddp::transport {

namespace {

inline uint64_t rotl(uint64_t x, int b) {
  return (x << b) | (x >> (64 - b));
}

inline void sipRound(uint64_t& v0, uint64_t& v1, uint64_t& v2, uint64_t& v3) {
  v0 += v1;
  v1 = rotl(v1, 13);
  v1 ^= v0;
  v0 = rotl(v0, 32);
  v2 += v3;
  v3 = rotl(v3, 16);
  v3 ^= v2;
  v0 += v3;
  v3 = rotl(v3, 21);
  v3 ^= v0;
  v2 += v1;
  v1 = rotl(v1, 17);
  v1 ^= v2;
  v2 = rotl(v2, 32);
}

inline uint64_t load64le(const uint8_t* p) {
  uint64_t x = 0;
  for (int i = 7; i >= 0; --i) {
    x = (x << 8) | p[i];
  }
  return x;
}

} // namespace

uint64_t siphash24(const SipKey& key, const void* data, size_t len) {
  uint64_t v0 = key.k0 ^ 0x736f6d6570736575ull;
  uint64_t v1 = key.k1 ^ 0x646f72616e646f6dull;
  uint64_t v2 = key.k0 ^ 0x6c7967656e657261ull;
  uint64_t v3 = key.k1 ^ 0x7465646279746573ull;
  const auto* p = static_cast<const uint8_t*>(data);
  const size_t whole = len & ~size_t{7};
  for (size_t i = 0; i < whole; i += 8) {
    uint64_t m = load64le(p + i);
    v3 ^= m;
    sipRound(v0, v1, v2, v3);
    sipRound(v0, v1, v2, v3);
    v0 ^= m;
  }
  uint64_t b = static_cast<uint64_t>(len) << 56;
  for (size_t i = 0; i < (len & 7); ++i) {
    b |= static_cast<uint64_t>(p[whole + i]) << (8 * i);
  }
  v3 ^= b;
  sipRound(v0, v1, v2, v3);
  sipRound(v0, v1, v2, v3);
  v0 ^= b;
  v2 ^= 0xff;
  for (int i = 0; i < 4; ++i) {
    sipRound(v0, v1, v2, v3);
  }
  return v0 ^ v1 ^ v2 ^ v3;
}

} // namespace smddp::transport
