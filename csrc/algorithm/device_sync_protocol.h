// The protocol by which a node's ranks meet on the GPU (SMDDP_CUDA_SYNC=device),
// written once for the kernel that runs it (algorithm/cuda/device_sync.cu)
// and for a host model of it (tests/native/test_device_sync.cc): CUDA-free.
//
// Each rank keeps a counter on its device, the same on every rank of the
// node, advanced by one per exchange through the staging buffers. An
// exchange is three steps on the rank's stream around its own work:
//   before   wait every peer's `done` >= counter    (it has read my stage)
//   (fill my stage)
//   between  counter += 1, my `ready` = counter; wait every peer's `ready`
//   (consume the peers' stages)
//   after    my `done` = counter
// The counter lives on the device, so a captured CUDA graph replays
// correctly: nothing the host baked into the graph names a sequence number.
// A wait spins with back-off and ends, instead of hanging, when the host
// sets the abort word or after `timeout_ns`; it then writes a non-zero error
// word the watchdog reads (host memory mapped into the device).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "algorithm/device_setup.h"

#if defined(__CUDACC__)
#define SMDDP_SYNC_HD __host__ __device__ inline
#else
#define SMDDP_SYNC_HD inline
#endif

namespace smddp::algorithm::cuda {

// The host-visible words of one communicator's waits (pinned, mapped).
struct SyncWords {
  uint32_t abort = 0;  // set by the host: every wait ends at once
  uint32_t error = 0;  // set by a wait that ended without its flags: a SyncEnd
};

enum class SyncEnd : uint32_t { kMet = 0, kTimeout = 1, kAborted = 2 };

struct SyncStep {
  uint64_t* counter = nullptr;  // this rank's (device memory)
  bool bump = false;            // counter += 1 first
  uint64_t* post = nullptr;     // then, if set, *post = counter (release, system scope)
  const uint64_t* wait[kMaxDeviceSources] = {};  // then wait until each >= counter
  int nwait = 0;
  SyncWords* words = nullptr;  // device view of the host words
  uint64_t timeout_ns = 0;
};

// Where one rank's exchange flags are: its counter and words, and every
// local rank's `ready` and `done` flag as this rank sees them.
struct ExchangeFlags {
  uint64_t* counter = nullptr;
  SyncWords* words = nullptr;
  uint64_t timeout_ns = 0;
  int local_size = 0;
  int me = 0;
  uint64_t* ready[kMaxDeviceSources] = {};
  uint64_t* done[kMaxDeviceSources] = {};
};

struct ExchangeSteps {
  SyncStep before;
  SyncStep between;
  SyncStep after;
};

inline ExchangeSteps exchangeSteps(const ExchangeFlags& f) {
  ExchangeSteps x;
  for (SyncStep* st : {&x.before, &x.between, &x.after}) {
    st->counter = f.counter;
    st->words = f.words;
    st->timeout_ns = f.timeout_ns;
  }
  for (int l = 0; l < f.local_size; ++l) {
    if (l != f.me) {
      x.before.wait[x.before.nwait++] = f.done[l];
      x.between.wait[x.between.nwait++] = f.ready[l];
    }
  }
  x.between.bump = true;
  x.between.post = f.ready[f.me];
  x.after.post = f.done[f.me];
  return x;
}

// One step, as one thread runs it. `Ops` reads and writes the memory:
// loadAcquire/storeRelease of a flag (system scope), fence() before a post
// (what the stream wrote before, the stage, is visible first), now() in ns,
// pause(ns), loadWord/storeWord of the host words.
template <typename Ops>
SMDDP_SYNC_HD SyncEnd runSyncStep(const SyncStep& step, Ops& ops) {
  uint64_t c = *step.counter;
  if (step.bump) {
    c += 1;
    *step.counter = c;
  }
  if (step.post != nullptr) {
    ops.fence();
    ops.storeRelease(step.post, c);
  }
  const uint64_t start = ops.now();
  unsigned pause = 32;
  for (int i = 0; i < step.nwait; ++i) {
    while (ops.loadAcquire(step.wait[i]) < c) {
      if (ops.loadWord(&step.words->abort) != 0) {
        ops.storeWord(&step.words->error, static_cast<uint32_t>(SyncEnd::kAborted));
        return SyncEnd::kAborted;
      }
      if (ops.now() - start > step.timeout_ns) {
        ops.storeWord(&step.words->error, static_cast<uint32_t>(SyncEnd::kTimeout));
        return SyncEnd::kTimeout;
      }
      ops.pause(pause);
      pause = pause < 8192 ? pause * 2 : pause;
    }
  }
  return SyncEnd::kMet;
}

} // namespace smddp::algorithm::cuda
