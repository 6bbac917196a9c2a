// Synchronization of a node's ranks on the GPU itself, without the host in
// the loop (SMDDP_CUDA_SYNC=device): flags in each rank's IPC-mapped staging
// header, written and awaited by tiny kernels on the collective's stream. The
// protocol (an exchange's three steps, what one step does) is in
// algorithm/device_sync_protocol.h.
#pragma once

#include <cuda_runtime.h>

#include "algorithm/device_sync_protocol.h"

namespace smddp::algorithm::cuda {

// Enqueues one step on `stream` (one thread block of one warp).
void launchSyncStep(const SyncStep& step, cudaStream_t stream);

// Loads the synchronization kernel into the current device's context now
// (see loadReduceKernels). Throws kComm.
void loadSyncKernel();

} // namespace smddp::algorithm::cuda
