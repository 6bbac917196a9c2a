#include "algorithm/cuda/device_sync.h"

#include "algorithm/cuda/load_kernel.h"
#include "common/error.h"

namespace smddp::algorithm::cuda {

namespace {

// What a step reads and writes, on the device; the host side of each member
// is never called (the host model has its own Ops).
struct DeviceOps {
  SMDDP_SYNC_HD uint64_t loadAcquire(const uint64_t* p) {
    uint64_t v = 0;
#if defined(__CUDA_ARCH__)
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
#endif
    return v;
  }
  SMDDP_SYNC_HD void storeRelease(uint64_t* p, uint64_t v) {
#if defined(__CUDA_ARCH__)
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#endif
  }
  SMDDP_SYNC_HD void fence() {
#if defined(__CUDA_ARCH__)
    __threadfence_system();
#endif
  }
  SMDDP_SYNC_HD uint64_t now() {
    uint64_t t = 0;
#if defined(__CUDA_ARCH__)
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
#endif
    return t;
  }
  SMDDP_SYNC_HD void pause(unsigned ns) {
#if defined(__CUDA_ARCH__)
    __nanosleep(ns);
#endif
  }
  SMDDP_SYNC_HD uint32_t loadWord(const uint32_t* p) {
    return *static_cast<const volatile uint32_t*>(p);
  }
  SMDDP_SYNC_HD void storeWord(uint32_t* p, uint32_t v) {
    *static_cast<volatile uint32_t*>(p) = v;
  }
};

__global__ void syncStep(SyncStep step) {
  if (threadIdx.x == 0) {
    DeviceOps ops;
    runSyncStep(step, ops);
  }
}

} // namespace

void loadSyncKernel() {
  loadKernel(syncStep, "the device synchronization kernel");
}

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
