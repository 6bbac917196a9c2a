#include "common/copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace smddp {

namespace {

#if defined(__x86_64__)
__attribute__((target("avx2"))) void streamCopy(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  // Align the destination to 32 bytes, stream the body, copy the tail.
  size_t head = (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31;
  if (head > bytes) {
    head = bytes;
  }
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  size_t body = bytes & ~size_t{127};
  for (size_t i = 0; i < body; i += 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  _mm_sfence();
  std::memcpy(d + body, s + body, bytes - body);
}

bool cpuHasAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}
const bool kHasAvx2 = cpuHasAvx2();
#endif

// Below this, destinations are usually read again soon (and fit in cache):
// keep them there.
constexpr size_t kStreamThreshold = size_t{4} << 20;

} // namespace

void copyBytes(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) {
    return;
  }
#if defined(__x86_64__)
  if (bytes >= kStreamThreshold && kHasAvx2) {
    streamCopy(dst, src, bytes);
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

} // namespace smddp
