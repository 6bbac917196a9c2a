// HostBuffer: grows, never shrinks, and places buffers of 2 MiB or more on
// 2 MiB boundaries (where transparent huge pages can back them).
#include <cstring>

#include "common/host_buffer.h"
#include "harness.h"

using namespace smddp;

SMDDP_TEST(grows_and_keeps_its_size) {
  HostBuffer b;
  EXPECT_TRUE(b.data() == nullptr);
  EXPECT_EQ(b.size(), size_t{0});
  uint8_t* p = b.reserve(100);
  EXPECT_TRUE(p != nullptr);
  EXPECT_TRUE(b.size() >= 100);
  std::memset(p, 0x5a, b.size());
  // A smaller request keeps the buffer (and its contents).
  EXPECT_TRUE(b.reserve(10) == p);
  EXPECT_EQ(p[99], 0x5a);
  uint8_t* q = b.reserve(3 << 20);
  EXPECT_TRUE(b.size() >= size_t{3} << 20);
  std::memset(q, 0xa5, b.size());
  EXPECT_EQ(q[(size_t{3} << 20) - 1], 0xa5);
}

SMDDP_TEST(large_buffers_start_on_huge_page_boundaries) {
  for (size_t mib : {2, 5, 64}) {
    HostBuffer b;
    uint8_t* p = b.reserve(mib << 20);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (size_t{2} << 20), uintptr_t{0});
    EXPECT_EQ(b.size() % (size_t{2} << 20), size_t{0});
    std::memset(p, 1, b.size());
  }
}
