// The CUDA schedules' arithmetic that needs no GPU (algorithm/device_plan.h):
// the head/vector/tail split of a reduction (of several segments too), 16-byte aligned AllReduce
// slices, evenly spaced blocks, the order of a sliced AllReduce's steps on
// two streams, and what a scratch buffer frees when CUDA graphs hold it.
#include <memory>
#include <numeric>
#include <set>

#include "algorithm/device_plan.h"
#include "algorithm/scratch_buffer.h"
#include "harness.h"

using namespace smddp;
using algorithm::AlignedSlices;
using algorithm::AlignedSplit;
using algorithm::alignedSplit;
using algorithm::evenlySpaced;
using algorithm::segmentsSplit;
using algorithm::SliceStep;
using algorithm::slicedAllReducePlan;

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

SMDDP_TEST(segments_vectorize_only_where_every_address_aligns) {
  // Every combination of small misalignments: where the split vectorizes,
  // every segment's every address is aligned after the head.
  const uintptr_t base[2] = {1 << 20, 1 << 21};
  size_t vectorized = 0;
  for (size_t es : {size_t{2}, size_t{4}}) {
    for (uintptr_t dmis = 0; dmis < 16; dmis += es) {
      for (uintptr_t smis = 0; smis < 16; smis += es) {
        for (size_t off0 : {size_t{0}, size_t{8}, size_t{4096}, size_t{4100}}) {
          for (size_t off1 : {size_t{0}, size_t{8}, size_t{8192}, size_t{8196}}) {
            for (size_t stride : {size_t{1024}, size_t{1032}, size_t{4098}}) {
              const uintptr_t srcs[2] = {base[0] + smis, base[1] + smis};
              const size_t offsets[2] = {off0, off1};
              const uintptr_t dst = (3 << 20) + dmis;
              const size_t count = 1000;
              const AlignedSplit s = segmentsSplit(dst, srcs, 2, offsets, 2, stride, count, es);
              EXPECT_EQ(s.head + s.vectors * s.elemsPerVector + s.tail, count);
              if (s.vectors == 0) {
                continue;
              }
              ++vectorized;
              for (size_t seg = 0; seg < 2; ++seg) {
                EXPECT_EQ((dst + seg * stride + s.head * es) % 16, uintptr_t{0});
                for (uintptr_t src : srcs) {
                  EXPECT_EQ((src + offsets[seg] + s.head * es) % 16, uintptr_t{0});
                }
              }
            }
          }
        }
      }
    }
  }
  // Not a split that never vectorizes.
  EXPECT_TRUE(vectorized > 0);
  // Segment 0 off by 8 bytes where segment 1 and the stride are aligned (the
  // rails' ReduceScatter with an odd number of local ranks): scalar.
  const uintptr_t srcs[2] = {1 << 20, 1 << 21};
  const size_t offsets[2] = {8, 32};
  EXPECT_EQ(segmentsSplit(1 << 22, srcs, 2, offsets, 2, 4096, 1000, 4).vectors, size_t{0});
  const size_t aligned[2] = {16, 32};
  EXPECT_TRUE(segmentsSplit(1 << 22, srcs, 2, aligned, 2, 4096, 1000, 4).vectors > 0);
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

namespace {

using algorithm::PlannedStep;
using algorithm::RailSteps;

bool covers(const PlannedStep& st, size_t c) {
  return st.first <= c && c < st.first + st.count;
}

// Which step of a plan happens before which, when the steps are enqueued in
// plan order: the reductions and gathers in order on the collective's
// stream; the rail steps on the rail's stream when `two_streams`, each after
// the reductions of its chunks and before their gathers (events), else in
// order on the collective's stream too. after[i][j]: step j starts only
// after step i has ended.
std::vector<std::vector<bool>> happensBefore(const std::vector<PlannedStep>& plan, bool two_streams) {
  const size_t n = plan.size();
  std::vector<std::vector<bool>> after(n, std::vector<bool>(n, false));
  for (size_t j = 0; j < n; ++j) {
    for (size_t i = 0; i < j; ++i) {
      const bool rail_i = plan[i].step == SliceStep::kRail;
      const bool rail_j = plan[j].step == SliceStep::kRail;
      const bool same_stream = !two_streams || rail_i == rail_j;
      const bool event = (plan[i].step == SliceStep::kReduce && rail_j && covers(plan[j], plan[i].first)) ||
          (rail_i && plan[j].step == SliceStep::kGather && covers(plan[i], plan[j].first));
      after[i][j] = same_stream || event;
    }
  }
  for (size_t k = 0; k < n; ++k) {  // transitive closure
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) {
        after[i][j] = after[i][j] || (after[i][k] && after[k][j]);
      }
    }
  }
  return after;
}

} // namespace

SMDDP_TEST(sliced_allreduce_plan_orders_every_slot_use) {
  for (RailSteps rail : {RailSteps::kNone, RailSteps::kWhole, RailSteps::kPerChunk}) {
    const bool two_streams = rail == RailSteps::kPerChunk;
    for (size_t chunks = 1; chunks <= 7; ++chunks) {
      const auto plan = slicedAllReducePlan(chunks, rail);
      // Every chunk reduced once, through the rail once (unless there is no
      // rail) and gathered once.
      for (size_t c = 0; c < chunks; ++c) {
        for (SliceStep what : {SliceStep::kReduce, SliceStep::kRail, SliceStep::kGather}) {
          size_t n = 0;
          for (const auto& st : plan) {
            n += st.step == what && covers(st, c) ? 1 : 0;
          }
          EXPECT_EQ(n, static_cast<size_t>(what == SliceStep::kRail && rail == RailSteps::kNone ? 0 : 1));
        }
      }
      const auto after = happensBefore(plan, two_streams);
      for (size_t i = 0; i < plan.size(); ++i) {
        for (size_t j = 0; j < plan.size(); ++j) {
          const auto& a = plan[i];
          const auto& b = plan[j];
          for (size_t c = a.first; c < a.first + a.count; ++c) {
            // Within a chunk: reduced, then through the rail, then gathered.
            if (covers(b, c) && static_cast<int>(a.step) < static_cast<int>(b.step)) {
              EXPECT_TRUE(after[i][j]);
            }
            // A slot (chunk % 2 on two streams) is written again only after
            // every step of the chunk that used it before has ended.
            for (size_t d = b.first; two_streams && d < b.first + b.count; ++d) {
              if (c < d && c % 2 == d % 2) {
                EXPECT_TRUE(after[i][j]);
              }
            }
          }
        }
      }
      // What the pipeline is for: chunk c's rail step may run while chunk
      // c+1 is reduced over the node (neither waits for the other).
      for (size_t i = 0; two_streams && i < plan.size(); ++i) {
        for (size_t j = 0; j < plan.size(); ++j) {
          if (plan[i].step == SliceStep::kRail && plan[j].step == SliceStep::kReduce &&
              plan[j].first == plan[i].first + 1) {
            EXPECT_TRUE(!after[i][j] && !after[j][i]);
          }
        }
      }
      // Without it, one rail step at most: its latency paid once per call.
      size_t rails = 0;
      for (const auto& st : plan) {
        rails += st.step == SliceStep::kRail ? 1 : 0;
      }
      EXPECT_EQ(rails, rail == RailSteps::kPerChunk ? chunks : rail == RailSteps::kWhole ? size_t{1} : size_t{0});
    }
  }
}

namespace {

// A scratch buffer's allocations, as an allocator would see them.
struct FakeMemory {
  std::set<void*> live;
  std::vector<std::unique_ptr<uint8_t[]>> blocks;
  algorithm::ScratchBuffer buffer{[this](size_t n) {
                                    blocks.push_back(std::make_unique<uint8_t[]>(n));
                                    live.insert(blocks.back().get());
                                    return static_cast<void*>(blocks.back().get());
                                  },
                                  [this](void* p) { EXPECT_EQ(live.erase(p), size_t{1}); }};
};

} // namespace

SMDDP_TEST(scratch_buffer_grows_and_frees_what_it_outgrows) {
  FakeMemory m;
  uint8_t* a = m.buffer.reserve(100, /*capturing=*/false);
  EXPECT_EQ(m.buffer.reserve(4096, false), a);  // rounded up: no growth
  uint8_t* b = m.buffer.reserve(5000, false);
  EXPECT_TRUE(b != a);
  EXPECT_EQ(m.live.size(), size_t{1});  // a went back at once
  EXPECT_EQ(m.live.count(b), size_t{1});
  m.buffer.free();
  EXPECT_EQ(m.live.size(), size_t{0});
}

SMDDP_TEST(scratch_buffer_keeps_what_a_captured_graph_uses) {
  FakeMemory m;
  uint8_t* eager = m.buffer.reserve(1000, false);
  // A capture uses it: a graph now holds its address.
  EXPECT_EQ(m.buffer.reserve(1000, /*capturing=*/true), eager);
  // A later, larger call (eager or captured) must not free it.
  uint8_t* grown = m.buffer.reserve(100000, false);
  EXPECT_TRUE(grown != eager);
  EXPECT_EQ(m.live.count(eager), size_t{1});
  // Growing a buffer no capture has used frees the old one again.
  uint8_t* again = m.buffer.reserve(1000000, false);
  EXPECT_EQ(m.live.count(grown), size_t{0});
  EXPECT_EQ(m.live.count(again), size_t{1});
  // A buffer allocated during a capture is the graph's too.
  uint8_t* in_capture = m.buffer.reserve(1 << 24, true);
  m.buffer.reserve(1 << 25, false);
  EXPECT_EQ(m.live.count(in_capture), size_t{1});
  EXPECT_EQ(m.live.count(eager), size_t{1});
  m.buffer.free();
  EXPECT_EQ(m.live.size(), size_t{0});
}
