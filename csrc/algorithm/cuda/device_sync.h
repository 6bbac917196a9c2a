// Synchronization of a node's ranks on the GPU itself, without the host in
// the loop (SMDDP_CUDA_SYNC=device): flags in each rank's IPC-mapped staging
// header, written and awaited by tiny kernels on the collective's stream.
//
// Each rank keeps a counter on its device, the same on every rank of the
// node, advanced by one per exchange through the staging buffers. An
// exchange is:
//   wait     every peer's `done` >= counter     (it has read my stage)
//   fill     my stage
//   post     counter += 1, my `ready` = counter; wait every peer's `ready`
//   consume  the peers' stages
//   done     my `done` = counter
// The counter lives on the device, so a captured CUDA graph replays
// correctly: nothing the host baked into the graph names a sequence number.
// A wait spins with back-off and ends, instead of hanging, when the host
// sets the abort word or after `timeout_ns`; it then writes a non-zero error
// word the watchdog reads (host memory mapped into the device).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "algorithm/device_setup.h"

namespace smddp::algorithm::cuda {

// The host-visible words of one communicator's waits (pinned, mapped).
struct SyncWords {
  uint32_t abort = 0;  // set by the host: every wait ends at once
  uint32_t error = 0;  // set by a wait that ended without its flags: 1 timeout, 2 aborted
};

struct SyncStep {
  uint64_t* counter = nullptr;  // this rank's (device memory)
  bool bump = false;            // counter += 1 first
  uint64_t* post = nullptr;     // then, if set, *post = counter (release, system scope)
  const uint64_t* wait[kMaxDeviceSources] = {};  // then wait until each >= counter
  int nwait = 0;
  SyncWords* words = nullptr;  // device view of the host words
  uint64_t timeout_ns = 0;
};

// Enqueues one step on `stream` (one thread block of one warp).
void launchSyncStep(const SyncStep& step, cudaStream_t stream);

} // namespace smddp::algorithm::cuda
