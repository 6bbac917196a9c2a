#include "algorithm/cuda/device_sync.h"

#include "common/error.h"

namespace smddp::algorithm::cuda {

namespace {

__device__ __forceinline__ uint64_t loadAcquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void storeRelease(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void syncStep(SyncStep step) {
  if (threadIdx.x != 0) {
    return;
  }
  uint64_t c = *step.counter;
  if (step.bump) {
    c += 1;
    *step.counter = c;
  }
  if (step.post != nullptr) {
    // What this stream wrote before (the stage) is visible before the flag.
    __threadfence_system();
    storeRelease(step.post, c);
  }
  const uint64_t start = now();
  unsigned pause = 32;
  for (int i = 0; i < step.nwait; ++i) {
    while (loadAcquire(step.wait[i]) < c) {
      volatile SyncWords* w = step.words;
      if (w->abort != 0) {
        w->error = 2;
        return;
      }
      if (now() - start > step.timeout_ns) {
        w->error = 1;
        return;
      }
      __nanosleep(pause);
      pause = pause < 8192 ? pause * 2 : pause;
    }
  }
}

} // namespace

void launchSyncStep(const SyncStep& step, cudaStream_t stream) {
  SMDDP_CHECK_ARG(step.counter != nullptr && step.words != nullptr && step.nwait >= 0 &&
                      step.nwait <= kMaxDeviceSources,
                  "a bad device synchronization step");
  syncStep<<<1, 32, 0, stream>>>(step);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    SMDDP_THROW(kComm, "the device synchronization kernel could not be launched: ", cudaGetErrorName(err), " (",
                cudaGetErrorString(err), ")");
  }
}

} // namespace smddp::algorithm::cuda
