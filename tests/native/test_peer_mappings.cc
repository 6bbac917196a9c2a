// The cache of the peers' mapped buffers (SMDDP_CUDA_ZERO_COPY,
// transport/peer_mappings.h) with host stand-ins for CUDA IPC: every "open"
// hands out a fresh block that remembers which allocation it shows, so a
// lookup that returned another allocation's mapping, or a mapping used after
// it was closed, is seen.
#include <map>
#include <memory>
#include <string>

#include "common/error.h"
#include "harness.h"
#include "transport/peer_mappings.h"

using namespace smddp;
using transport::BufferRecord;
using transport::PeerMappings;

namespace {

struct FakeIpc {
  std::map<void*, uint64_t> open;  // mapping -> allocation id
  std::vector<std::unique_ptr<uint8_t[]>> blocks;
  int opens = 0;
  int closes = 0;
  std::vector<std::string> order;  // "close <id>"

  PeerMappings::Ops ops() {
    return {[this](const BufferRecord& rec) -> void* {
              blocks.push_back(std::make_unique<uint8_t[]>(rec.size));
              void* p = blocks.back().get();
              open[p] = rec.id;
              ++opens;
              return p;
            },
            [this](void* p) {
              EXPECT_TRUE(open.count(p) == 1);
              order.push_back("close " + std::to_string(open[p]));
              open.erase(p);
              ++closes;
            }};
  }
  // The allocation a pointer handed out by map() lies in (0: none open).
  uint64_t idOf(const uint8_t* p) const {
    for (const auto& [base, id] : open) {
      const auto* b = static_cast<const uint8_t*>(base);
      if (p >= b && p < b + 1024) {
        return id;
      }
    }
    return 0;
  }
};

BufferRecord record(uint64_t id, uint64_t base, uint64_t size, uint64_t offset) {
  BufferRecord r;
  r.id = id;
  r.base = base;
  r.size = size;
  r.offset = offset;
  return r;
}

} // namespace

SMDDP_TEST(a_buffer_of_a_cached_allocation_is_mapped_once_and_offset) {
  FakeIpc ipc;
  PeerMappings m(2, ipc.ops());
  uint8_t* a = m.map(1, record(7, 0x10000, 1024, 0));
  uint8_t* b = m.map(1, record(7, 0x10000, 1024, 512));
  EXPECT_EQ(ipc.opens, 1);
  EXPECT_TRUE(b == a + 512);
  EXPECT_EQ(ipc.idOf(b), 7u);
  // The same id from another peer is another process's allocation.
  uint8_t* c = m.map(0, record(7, 0x10000, 1024, 0));
  EXPECT_EQ(ipc.opens, 2);
  EXPECT_TRUE(c != a);
  EXPECT_EQ(m.cached(0), 1u);
  EXPECT_EQ(m.cached(1), 1u);
}

SMDDP_TEST(a_new_allocation_at_a_freed_ones_addresses_closes_the_stale_mapping) {
  FakeIpc ipc;
  PeerMappings m(2, ipc.ops());
  m.map(1, record(1, 0x10000, 1024, 0));
  m.map(1, record(2, 0x20000, 1024, 0));
  // The peer freed allocation 1 and its allocator reused part of its range.
  uint8_t* p = m.map(1, record(3, 0x10200, 1024, 16));
  EXPECT_EQ(ipc.idOf(p), 3u);
  EXPECT_EQ(ipc.closes, 1);
  EXPECT_TRUE(ipc.order == std::vector<std::string>{"close 1"});
  EXPECT_EQ(m.cached(1), 2u);
  // Adjacent, not overlapping: both stay.
  m.map(1, record(4, 0x20400, 1024, 0));
  EXPECT_EQ(ipc.closes, 1);
  EXPECT_EQ(m.cached(1), 3u);
}

SMDDP_TEST(a_revoked_allocation_is_closed_and_mapped_anew_when_published_again) {
  FakeIpc ipc;
  PeerMappings m(2, ipc.ops());
  m.map(1, record(1, 0x10000, 1024, 0));
  m.map(1, record(2, 0x20000, 1024, 0));
  m.map(0, record(1, 0x10000, 1024, 0));  // another process's allocation 1
  EXPECT_TRUE(m.close(1, 1));
  EXPECT_TRUE(!m.close(1, 1));  // held no more
  EXPECT_TRUE(!m.close(1, 7));  // never held
  EXPECT_TRUE(ipc.order == std::vector<std::string>{"close 1"});
  EXPECT_EQ(m.cached(0), 1u);
  EXPECT_EQ(m.cached(1), 1u);
  uint8_t* p = m.map(1, record(3, 0x10000, 1024, 8));
  EXPECT_EQ(ipc.idOf(p), 3u);
  EXPECT_EQ(ipc.opens, 4);
}

SMDDP_TEST(closing_all_closes_every_mapping_once) {
  FakeIpc ipc;
  {
    PeerMappings m(3, ipc.ops());
    for (int l = 0; l < 3; ++l) {
      m.map(l, record(9, 0x10000, 1024, 0));
    }
    m.closeAll();
    EXPECT_EQ(ipc.closes, 3);
    EXPECT_EQ(m.cached(1), 0u);
  }  // the destructor finds nothing left
  EXPECT_EQ(ipc.closes, 3);
  EXPECT_TRUE(ipc.open.empty());
}

SMDDP_TEST(a_failed_open_leaves_the_cache_as_it_was) {
  FakeIpc ipc;
  PeerMappings::Ops ops = ipc.ops();
  auto open = ops.open;
  ops.open = [open](const BufferRecord& rec) -> void* {
    if (rec.id == 5) {
      SMDDP_THROW(kComm, "cannot open allocation 5");
    }
    return open(rec);
  };
  PeerMappings m(1, ops);
  m.map(0, record(1, 0x10000, 1024, 0));
  EXPECT_THROWS(m.map(0, record(5, 0x50000, 1024, 0)), kComm, "allocation 5");
  EXPECT_EQ(m.cached(0), 1u);
  uint8_t* p = m.map(0, record(1, 0x10000, 1024, 8));
  EXPECT_EQ(ipc.idOf(p), 1u);
}
