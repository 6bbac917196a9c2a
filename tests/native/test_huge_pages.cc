// HugePages: which buffers get huge pages, when they are collapsed, and that
// contents survive. The checks that need the kernel's help (THP enabled,
// MADV_COLLAPSE and PAGEMAP_SCAN, Linux 6.7+) say so and are skipped where
// it lacks them.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <sys/mman.h>
#include <sys/prctl.h>

#include "common/huge_pages.h"
#include "harness.h"

using namespace smddp;

namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kMin = 4 * kMiB;

// An anonymous mapping of `bytes` starting on a 2 MiB boundary.
struct Mapping {
  explicit Mapping(size_t bytes) : bytes(bytes) {
    raw = ::mmap(nullptr, bytes + 2 * kMiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_TRUE(raw != MAP_FAILED);
    auto a = (reinterpret_cast<uintptr_t>(raw) + 2 * kMiB - 1) & ~(2 * kMiB - 1);
    data = reinterpret_cast<uint8_t*>(a);
  }
  ~Mapping() {
    ::munmap(raw, bytes + 2 * kMiB);
  }
  // Replaces the memory with a fresh mapping at the same address, as an
  // allocator that unmaps a buffer and maps the next one there does.
  void replace() {
    void* p = ::mmap(data, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    EXPECT_TRUE(p == data);
  }
  void fill(uint8_t seed) {
    for (size_t i = 0; i < bytes; ++i) {
      data[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 12));
    }
  }
  bool holds(uint8_t seed) const {
    for (size_t i = 0; i < bytes; ++i) {
      if (data[i] != static_cast<uint8_t>(seed + i * 7 + (i >> 12))) {
        return false;
      }
    }
    return true;
  }
  void* raw;
  size_t bytes;
  uint8_t* data;
};

std::string thpSetting() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  std::getline(f, s);
  return s;
}

// Whether this kernel can run the checks that need huge pages to appear.
bool kernelHelps(HugePages& hp, const char* test) {
  const std::string thp = thpSetting();
  if (thp.find("[never]") != std::string::npos || thp.empty() || !hp.canCollapse()) {
    std::printf("  (%s: skipped, THP '%s', collapse %s)\n", test, thp.c_str(),
                hp.canCollapse() ? "available" : "unavailable");
    return false;
  }
  return true;
}

bool thpAlways() {
  return thpSetting().find("[always]") != std::string::npos;
}

} // namespace

SMDDP_TEST(small_unaligned_and_disabled_ranges_are_left_alone) {
  HugePages hp;
  Mapping m(16 * kMiB);
  // Under the minimum, and an interior under it: 4M starting 1M past a
  // boundary holds 2M of whole huge pages, 6M holds 4M.
  EXPECT_EQ(hp.prepare(m.data, kMiB, HugePageMode::kAuto, kMin), HugePages::kNone);
  EXPECT_EQ(hp.prepare(m.data + kMiB, 4 * kMiB, HugePageMode::kAuto, kMin), HugePages::kNone);
  EXPECT_EQ(hp.prepare(m.data + kMiB, 6 * kMiB, HugePageMode::kAuto, kMin), HugePages::kAdvised);
  EXPECT_EQ(hp.prepare(m.data, 16 * kMiB, HugePageMode::kOff, kMin), HugePages::kNone);
  EXPECT_EQ(hp.prepare(nullptr, 16 * kMiB, HugePageMode::kAuto, kMin), HugePages::kNone);
}

SMDDP_TEST(advice_gives_untouched_pages_huge_pages) {
  HugePages hp;
  if (!kernelHelps(hp, "advice_gives_untouched_pages_huge_pages")) {
    return;
  }
  Mapping m(16 * kMiB);
  EXPECT_EQ(hp.prepare(m.data, m.bytes, HugePageMode::kAdvise, kMin), HugePages::kAdvised);
  m.fill(3);
  EXPECT_TRUE(hp.isHuge(m.data, m.bytes));
  EXPECT_TRUE(m.holds(3));
}

SMDDP_TEST(a_reused_buffer_is_collapsed_once_and_keeps_its_contents) {
  HugePages hp;
  if (!kernelHelps(hp, "a_reused_buffer_is_collapsed_once_and_keeps_its_contents") || thpAlways()) {
    return;
  }
  Mapping m(16 * kMiB);
  m.fill(11);
  EXPECT_TRUE(!hp.isHuge(m.data, m.bytes));
  // First sighting: advice only (the pages are there already, 4 KiB).
  EXPECT_EQ(hp.prepare(m.data, m.bytes, HugePageMode::kAuto, kMin), HugePages::kAdvised);
  EXPECT_TRUE(!hp.isHuge(m.data, m.bytes));
  // Seen again: collapsed, contents kept.
  EXPECT_EQ(hp.prepare(m.data, m.bytes, HugePageMode::kAuto, kMin), HugePages::kCollapsed);
  EXPECT_TRUE(hp.isHuge(m.data, m.bytes));
  EXPECT_TRUE(m.holds(11));
  // Huge already: nothing more to do.
  EXPECT_EQ(hp.prepare(m.data, m.bytes, HugePageMode::kAuto, kMin), HugePages::kNone);
  // advise mode never collapses.
  Mapping n(8 * kMiB);
  n.fill(5);
  EXPECT_EQ(hp.prepare(n.data, n.bytes, HugePageMode::kAdvise, kMin), HugePages::kAdvised);
  EXPECT_EQ(hp.prepare(n.data, n.bytes, HugePageMode::kAdvise, kMin), HugePages::kAdvised);
  EXPECT_TRUE(!hp.isHuge(n.data, n.bytes));
}

SMDDP_TEST(a_buffer_replaced_between_calls_is_not_collapsed_again) {
  HugePages hp;
  if (!kernelHelps(hp, "a_buffer_replaced_between_calls_is_not_collapsed_again") || thpAlways()) {
    return;
  }
  Mapping m(8 * kMiB);
  m.fill(1);
  EXPECT_EQ(hp.prepare(m.data, m.bytes, HugePageMode::kAuto, kMin), HugePages::kAdvised);
  EXPECT_EQ(hp.prepare(m.data, m.bytes, HugePageMode::kAuto, kMin), HugePages::kCollapsed);
  // A new buffer at the same address, written before the call: collapsing
  // it each time would cost a copy per call.
  for (int round = 0; round < 3; ++round) {
    m.replace();
    m.fill(static_cast<uint8_t>(round));
    EXPECT_EQ(hp.prepare(m.data, m.bytes, HugePageMode::kAuto, kMin), HugePages::kAdvised);
    EXPECT_TRUE(!hp.isHuge(m.data, m.bytes));
    EXPECT_TRUE(m.holds(static_cast<uint8_t>(round)));
  }
  // A fresh buffer not yet written still gets huge pages from the advice.
  m.replace();
  EXPECT_EQ(hp.prepare(m.data, m.bytes, HugePageMode::kAuto, kMin), HugePages::kAdvised);
  m.fill(9);
  EXPECT_TRUE(hp.isHuge(m.data, m.bytes));
}

SMDDP_TEST(ranges_are_remembered_up_to_a_bound) {
  HugePages hp;
  if (!kernelHelps(hp, "ranges_are_remembered_up_to_a_bound") || thpAlways()) {
    return;
  }
  // Untouched mappings, advised only, stand for the other buffers of a step.
  Mapping many(127 * 4 * kMiB);
  auto others = [&](int from, int n) {
    for (int i = from; i < from + n; ++i) {
      EXPECT_EQ(hp.prepare(many.data + static_cast<size_t>(i) * 4 * kMiB, 4 * kMiB, HugePageMode::kAuto, kMin),
                HugePages::kAdvised);
    }
  };
  // Seen again after 63 others: remembered, so collapsed.
  Mapping a(4 * kMiB);
  a.fill(2);
  EXPECT_EQ(hp.prepare(a.data, a.bytes, HugePageMode::kAuto, kMin), HugePages::kAdvised);
  others(0, 63);
  EXPECT_EQ(hp.prepare(a.data, a.bytes, HugePageMode::kAuto, kMin), HugePages::kCollapsed);
  EXPECT_TRUE(a.holds(2));
  // After 64 others: forgotten, a first sighting again.
  Mapping b(4 * kMiB);
  b.fill(3);
  EXPECT_EQ(hp.prepare(b.data, b.bytes, HugePageMode::kAuto, kMin), HugePages::kAdvised);
  others(63, 64);
  EXPECT_EQ(hp.prepare(b.data, b.bytes, HugePageMode::kAuto, kMin), HugePages::kAdvised);
  EXPECT_EQ(hp.prepare(b.data, b.bytes, HugePageMode::kAuto, kMin), HugePages::kCollapsed);
  EXPECT_TRUE(b.holds(3));
}

SMDDP_TEST(a_replaced_buffer_stays_known_among_many_others) {
  HugePages hp;
  if (!kernelHelps(hp, "a_replaced_buffer_stays_known_among_many_others") || thpAlways()) {
    return;
  }
  Mapping m(4 * kMiB);
  m.fill(1);
  EXPECT_EQ(hp.prepare(m.data, m.bytes, HugePageMode::kAuto, kMin), HugePages::kAdvised);
  EXPECT_EQ(hp.prepare(m.data, m.bytes, HugePageMode::kAuto, kMin), HugePages::kCollapsed);
  m.replace();
  m.fill(2);
  EXPECT_EQ(hp.prepare(m.data, m.bytes, HugePageMode::kAuto, kMin), HugePages::kAdvised);
  // A step that uses the buffer twice among more other buffers than the
  // table holds: were the replaced one forgotten, each step would see it
  // anew and collapse it on its second use, a copy per step.
  Mapping many(100 * 4 * kMiB);
  for (int step = 0; step < 2; ++step) {
    for (int i = 0; i < 100; ++i) {
      hp.prepare(many.data + static_cast<size_t>(i) * 4 * kMiB, 4 * kMiB, HugePageMode::kAuto, kMin);
    }
    m.replace();
    m.fill(static_cast<uint8_t>(3 + step));
    EXPECT_EQ(hp.prepare(m.data, m.bytes, HugePageMode::kAuto, kMin), HugePages::kAdvised);
    EXPECT_EQ(hp.prepare(m.data, m.bytes, HugePageMode::kAuto, kMin), HugePages::kAdvised);
    EXPECT_TRUE(m.holds(static_cast<uint8_t>(3 + step)));
  }
}

SMDDP_TEST(a_process_that_disabled_huge_pages_is_left_alone) {
  // In a child: the prctl lasts for the rest of the process.
  test::runRanks(1, [](int) {
    if (::prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0) {
      return; // nothing to check without the prctl
    }
    EXPECT_EQ(::prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0), 1);
    HugePages hp;
    Mapping m(8 * kMiB);
    m.fill(6);
    EXPECT_EQ(hp.prepare(m.data, m.bytes, HugePageMode::kAuto, kMin), HugePages::kNone);
    EXPECT_EQ(hp.prepare(m.data, m.bytes, HugePageMode::kAuto, kMin), HugePages::kNone);
    EXPECT_TRUE(m.holds(6));
  });
}

SMDDP_TEST(a_forked_child_reads_its_own_page_tables) {
  HugePages hp;
  if (!kernelHelps(hp, "a_forked_child_reads_its_own_page_tables") || thpAlways()) {
    return;
  }
  EXPECT_TRUE(!hp.isHuge(nullptr, 0)); // opens the parent's pagemap
  test::runRanks(1, [&](int) {
    // The parent has nothing at this address: a scan of the parent's page
    // tables would find no 4 KiB page there and call the range huge.
    Mapping m(8 * kMiB);
    m.fill(4);
    EXPECT_EQ(hp.prepare(m.data, m.bytes, HugePageMode::kAuto, kMin), HugePages::kAdvised);
    EXPECT_EQ(hp.prepare(m.data, m.bytes, HugePageMode::kAuto, kMin), HugePages::kCollapsed);
    EXPECT_TRUE(hp.isHuge(m.data, m.bytes));
    EXPECT_TRUE(m.holds(4));
  });
}
