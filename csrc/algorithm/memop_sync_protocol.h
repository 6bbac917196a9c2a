// The protocol by which a node's ranks meet through stream memory operations
// (SMDDP_CUDA_SYNC=memops): the stream itself writes a word and waits until a
// word holds a value (cuStreamWriteValue32, cuStreamWaitValue32), so no kernel
// occupies the GPU while it waits and a waiting context leaves the GPU to the
// others. Written once for the CUDA side (algorithm/cuda/memop_sync.h) and for
// a host model of it (tests/native/test_memop_sync.cc): CUDA-free.
//
// A wait compares with a constant, so the values cannot be sequence numbers:
// a graph captured once replays the same constants. Every flag is instead
// returned to its resting value within an exchange, and an exchange may be
// replayed any number of times, eagerly or from a graph, in any mix. Each
// rank has two inboxes of one word per peer, in its own memory:
//   ready[from]  set to 1 by `from` when its stage holds this exchange's data;
//                reset to 0 by the owner once it has seen it
//   busy[from]   set to 1 by the owner before it announces its stage; reset to
//                0 by `from` once it has read that stage
// Resting values: every word 0. An exchange, on this rank's stream:
//   before   wait busy[l] == 0 for every peer l       (they read my stage)
//   (fill my stage)
//   between  wait busy[l] == 0; busy[l] = 1; peer l's ready[me] = 1;
//            wait ready[l] == 1; ready[l] = 0         (for every peer l)
//   (consume the peers' stages)
//   after    peer l's busy[me] = 0                    (for every peer l)
// A word has one writer at a time: the owner resets a word only after
// waiting for the value its peer wrote, and the peer writes it again only
// after a wait that the owner's later writes (made visible in stream order:
// each write is preceded by a memory fence) release. `between` waits for
// `busy` itself, so that a step that fills nothing (a zero-copy step, which
// runs between, consume, after, before) still finds its peers done with the
// previous exchange before it marks them busy again, and `before` only waits,
// so running it twice is harmless.
//
// A wait has no deadline of its own: the host's watchdog bounds a call, and
// on abort the `release` writes (every wait of this rank passes) are made
// again and again until the communicator is destroyed, since the steps that
// follow reset what they wrote.
#pragma once

#include <cstdint>
#include <vector>

#include "algorithm/device_setup.h"

namespace smddp::algorithm::cuda {

struct MemOp {
  enum class Kind : uint8_t { kWrite, kWaitEq };
  Kind kind = Kind::kWrite;
  uint32_t* word = nullptr;
  uint32_t value = 0;
};

// Where one rank's memory-operation flags are: every local rank's inboxes
// as this rank sees them (word [from] of each).
struct MemOpFlags {
  int local_size = 0;
  int me = 0;
  uint32_t* ready[kMaxDeviceSources] = {};
  uint32_t* busy[kMaxDeviceSources] = {};
};

struct MemOpSteps {
  std::vector<MemOp> before;
  std::vector<MemOp> between;
  std::vector<MemOp> after;
  // Writes that let every wait of this rank pass (abort).
  std::vector<MemOp> release;
};

inline MemOpSteps memOpSteps(const MemOpFlags& f) {
  MemOpSteps x;
  const auto write = [](uint32_t* w, uint32_t v) { return MemOp{MemOp::Kind::kWrite, w, v}; };
  const auto waitEq = [](uint32_t* w, uint32_t v) { return MemOp{MemOp::Kind::kWaitEq, w, v}; };
  const int me = f.me;
  std::vector<int> peers;
  for (int l = 0; l < f.local_size; ++l) {
    if (l != me) {
      peers.push_back(l);
    }
  }
  for (int l : peers) {
    x.before.push_back(waitEq(f.busy[me] + l, 0));
  }
  x.between = x.before;
  for (int l : peers) {
    x.between.push_back(write(f.busy[me] + l, 1));
  }
  for (int l : peers) {
    x.between.push_back(write(f.ready[l] + me, 1));
  }
  for (int l : peers) {
    x.between.push_back(waitEq(f.ready[me] + l, 1));
  }
  for (int l : peers) {
    x.between.push_back(write(f.ready[me] + l, 0));
  }
  for (int l : peers) {
    x.after.push_back(write(f.busy[l] + me, 0));
  }
  for (int l : peers) {
    x.release.push_back(write(f.ready[me] + l, 1));
    x.release.push_back(write(f.busy[me] + l, 0));
  }
  return x;
}

} // namespace smddp::algorithm::cuda
