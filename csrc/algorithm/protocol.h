// What the ranks of a collective tell each other about it, and how they
// count what they hand each other. The flat ring, the node collectives, the
// hierarchical schedules and the CUDA path all speak through this file; the
// transports below only carry it (a socket frame's header, 64 bytes of a
// node arena's control block).
//
// The tag. Every message of a call carries the call's tag: sequence number,
// kind, dtype, element count, reduce op (reductions only, else SUM) and root
// (Broadcast only, else 0). Ranks making the same call compute the same tag;
// a receiver compares each message's tag with the one it expects and a
// difference is a kMismatch naming both calls (transport::throwDisagreement).
//
// The call descriptor. At the start of every call inside a node, each rank
// writes a CallDesc into its arena control block (one of two, by the parity
// of the sequence number, so that a peer still reading the previous call's
// is not disturbed): the tag, the path it takes through the node, the
// addresses of its input and output (peers read or write them directly on
// the single-copy and device paths) and its progress base. After the call's
// first round every rank compares every peer's tag and path with its own
// (verifyCall): on a difference, every rank throws the same kMismatch, which
// lists each rank's call.
//
// Progress units. The pipelined hierarchical stages announce the chunks a
// rank has placed in its output through the arena's monotonic progress
// counter: unit u of a call is announced by raising the counter to
// progressAfter(base, u + 1), where base is the counter's value when the
// rank opened the call (published as CallDesc::progress_base), and a peer
// reads the chunk once it sees that value. Which chunk unit u is follows
// the order in which the rail's ring moves blocks (RingOrder), so the rank
// that posts and the peer that reads name the same chunk by construction:
// see ProgressUnits.
//
// Threading: the functions are pure, or act on this rank's own descriptor;
// a descriptor is written by its owner before the round that publishes it
// and read by peers only after it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "algorithm/chunks.h"
#include "algorithm/op.h"
#include "transport/channel.h"
#include "transport/shm/node_arena.h"

namespace smddp::algorithm::protocol {

// The tag every message of the call `args` carries.
transport::MessageTag tagOf(const OpArgs& args);

// How a node moves a call's data; every rank of the node takes the same.
enum class Path : uint8_t {
  kStaged = 0,      // through the arena's staging slots (two copies)
  kSingleCopy = 1,  // peers read and write each other's buffers (one copy)
  kDevice = 2,      // GPU buffers mapped by the peers; the arena only syncs
};
const char* pathName(Path path);

// What a rank publishes about the call it is in. The layout is pinned by
// the static_asserts below, so that changing it is a deliberate act.
struct CallDesc {
  transport::MessageTag tag;
  uint64_t in_addr = 0;
  uint64_t out_addr = 0;
  // This rank's arena progress counter when it opened the call.
  uint32_t progress_base = 0;
  uint32_t reserved0 = 0;
  Path path = Path::kStaged;
  uint8_t reserved[15] = {};
};
static_assert(sizeof(transport::MessageTag) == 24, "the tag's layout is part of the descriptor's");
static_assert(offsetof(CallDesc, in_addr) == 24 && offsetof(CallDesc, out_addr) == 32 &&
                  offsetof(CallDesc, progress_base) == 40 && offsetof(CallDesc, path) == 48,
              "CallDesc layout");
static_assert(sizeof(CallDesc) == sizeof(transport::DescSlot), "a CallDesc fills its arena slot");
static_assert(alignof(CallDesc) <= alignof(transport::DescSlot), "a CallDesc fits its arena slot's alignment");
static_assert(std::is_trivially_copyable_v<CallDesc>, "a CallDesc lives in shared memory");

// This rank's and local rank l's descriptor of call `seq`.
CallDesc& myCall(transport::NodeArena& arena, uint64_t seq);
const CallDesc& peerCall(const transport::NodeArena& arena, int l, uint64_t seq);

// Writes this rank's descriptor of `args` (tag, path, addresses, progress
// base). Before the call's first round.
void openCall(transport::NodeArena& arena, const OpArgs& args, Path path);
// After the call's first round: throws kMismatch, on every rank alike, if
// any rank's tag or path differs from this one's.
void verifyCall(const transport::NodeArena& arena, const OpArgs& args);

// The counter value that says `units` units after `base` are announced.
inline uint32_t progressAfter(uint32_t base, uint64_t units) {
  return base + static_cast<uint32_t>(units);
}

// A chunk of a ring's block.
struct RingUnit {
  int block;
  size_t chunk;
};

// The order in which a ring moves blocks, as member `index` of `size` sees
// it. The ring schedules (ring.h) move data in this order; whoever feeds a
// ring or reads what it lands counts in it.
struct RingOrder {
  int index = 0;
  int size = 1;

  // AllGather: step s receives the block of member index-s-1, and step s+1
  // forwards it.
  int gatheredAt(int step) const {
    return mod(index - step - 1, size);
  }
  // AllGather: the u-th chunk to land, of blocks cut in `chunks` chunks
  // (step-major, chunk-minor: the order of the ring's messages).
  RingUnit landed(uint64_t u, size_t chunks) const {
    return {gatheredAt(static_cast<int>(u / chunks)), static_cast<size_t>(u % chunks)};
  }
  // ReduceScatter: step s sends the partial of block consumedAt(s) and
  // receives the partial of block consumedAt(s + 1), to which it adds this
  // member's contribution; so the member's contributions are consumed in
  // the order index-1, index-2, ..., index+1 and its own block, index, last.
  int consumedAt(int j) const {
    return mod(index - 1 - j, size);
  }
  // The inverse: block `block` is the consumeOrder(block)-th consumed.
  int consumeOrder(int block) const {
    return mod(index - 1 - block, size);
  }
};

// The progress units of a pipelined hierarchical stage, the same on every
// rank of a node (they share the node's index on their rails): first the
// `chunks` chunks of the rank's own rail block, then the chunks its rail's
// AllGather lands, in the order they land. (Where the own block is the
// rank's input, as in AllGather, it is announced whole when the call opens
// and read from the input.)
struct ProgressUnits {
  RingOrder rail;
  size_t chunks;

  uint64_t count() const {
    return static_cast<uint64_t>(rail.size) * chunks;
  }
  RingUnit at(uint64_t u) const {
    if (u < chunks) {
      return {rail.index, static_cast<size_t>(u)};
    }
    return rail.landed(u - chunks, chunks);
  }
};

} // namespace smddp::algorithm::protocol
