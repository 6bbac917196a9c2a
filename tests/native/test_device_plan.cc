// The CUDA schedules' arithmetic that needs no GPU (algorithm/device_plan.h):
// the head/vector/tail split of a reduction, 16-byte aligned AllReduce
// slices, and evenly spaced blocks.
#include <numeric>

#include "algorithm/device_plan.h"
#include "harness.h"

using namespace smddp;
using algorithm::AlignedSlices;
using algorithm::AlignedSplit;
using algorithm::alignedSplit;
using algorithm::evenlySpaced;

SMDDP_TEST(split_covers_every_element_once) {
  for (size_t es : {size_t{2}, size_t{4}}) {
    for (uintptr_t mis = 0; mis < 16; mis += es) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{7}, size_t{8}, size_t{9}, size_t{4099}}) {
        uintptr_t addrs[3] = {4096 + mis, 8192 + mis, 65536 + mis};
        const AlignedSplit s = alignedSplit(addrs, 3, count, es);
        EXPECT_EQ(s.head + s.vectors * s.elemsPerVector + s.tail, count);
        EXPECT_EQ(s.elemsPerVector, 16 / es);
        // After the head every buffer is aligned (or nothing is left).
        if (s.vectors > 0) {
          EXPECT_EQ((addrs[0] + s.head * es) % 16, uintptr_t{0});
        }
        EXPECT_TRUE(s.tail < s.elemsPerVector);
      }
    }
  }
}

SMDDP_TEST(unalike_misalignment_is_all_head) {
  uintptr_t addrs[2] = {4096, 8192 + 4};
  const AlignedSplit s = alignedSplit(addrs, 2, 1000, 4);
  EXPECT_EQ(s.head, size_t{1000});
  EXPECT_EQ(s.vectors, size_t{0});
  // An element size that cannot reach alignment: all head too.
  uintptr_t odd[1] = {4097};
  EXPECT_EQ(alignedSplit(odd, 1, 50, 2).head, size_t{50});
}

SMDDP_TEST(aligned_slices_partition_and_align) {
  for (size_t parts : {size_t{1}, size_t{2}, size_t{3}, size_t{8}}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{17}, size_t{1000003}}) {
      for (size_t align : {size_t{1}, size_t{4}, size_t{8}}) {
        const AlignedSlices sl{count, parts, align};
        size_t total = 0;
        size_t biggest = 0;
        size_t smallest = count;
        for (size_t i = 0; i < parts; ++i) {
          EXPECT_EQ(sl.begin(i), total);
          if (sl.begin(i) < count) {
            EXPECT_EQ(sl.begin(i) % align, size_t{0});
          }
          total += sl.size(i);
          biggest = std::max(biggest, sl.size(i));
          smallest = std::min(smallest, sl.size(i));
        }
        EXPECT_EQ(total, count);
        // As even as whole aligned units allow: one unit apart, and the last
        // slice ends at the count.
        EXPECT_TRUE(biggest - smallest < 2 * align || count < parts * align);
      }
    }
  }
}

SMDDP_TEST(evenly_spaced_blocks) {
  size_t stride = 0;
  EXPECT_TRUE(evenlySpaced({0, 4096, 8192, 12288}, &stride));
  EXPECT_EQ(stride, size_t{4096});
  EXPECT_TRUE(!evenlySpaced({0, 4096, 12288}, &stride));
  EXPECT_TRUE(!evenlySpaced({4096}, &stride));
  EXPECT_TRUE(!evenlySpaced({8192, 4096}, &stride));
}
