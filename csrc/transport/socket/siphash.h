// SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed pseudo-random function
// of short messages, used as the MAC that lets socket peers prove they hold
// the group's secret without sending it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace smddp::transport {

struct SipKey {
  uint64_t k0 = 0;
  uint64_t k1 = 0;
};

uint64_t siphash24(const SipKey& key, const void* data, size_t len);

} // namespace smddp::transport
