#include "algorithm/cuda/memop_sync.h"

#include <cuda.h>

#include <chrono>

#include "common/error.h"
#include "common/log.h"

namespace smddp::algorithm::cuda {

namespace {

// The ABI of both functions since CUDA 12.0 (the _v2 entry points).
constexpr unsigned kEntryPointVersion = 12000;

template <typename Fn>
Fn entryPoint(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(name, &fn, kEntryPointVersion, cudaEnableDefault, &found);
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
    const std::string why =
        err != cudaSuccess ? str("could not be looked up: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")")
                           : std::string("this driver does not offer");
    SMDDP_THROW(kComm, "SMDDP_CUDA_SYNC=memops needs the driver's ", name, ", which ", why,
                "; use SMDDP_CUDA_SYNC=device or host");
  }
  return reinterpret_cast<Fn>(fn);
}

void check(int rc, const char* what) {
  if (rc != CUDA_SUCCESS) {
    SMDDP_THROW(kComm, what, " failed: CUresult ", rc,
                " (SMDDP_CUDA_SYNC=memops; SMDDP_CUDA_SYNC=device meets on the GPU with kernels instead)");
  }
}

} // namespace

MemOpStream::MemOpStream()
    : write_(entryPoint<MemOpFn>("cuStreamWriteValue32")), wait_(entryPoint<MemOpFn>("cuStreamWaitValue32")) {}

MemOpStream::~MemOpStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (releaser_.joinable()) {
    releaser_.join();
  }
}

void MemOpStream::enqueue(const std::vector<MemOp>& ops, cudaStream_t stream) const {
  for (const MemOp& op : ops) {
    const auto addr = static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(op.word));
    if (op.kind == MemOp::Kind::kWrite) {
      check(write_(stream, addr, op.value, CU_STREAM_WRITE_VALUE_DEFAULT), "cuStreamWriteValue32");
    } else {
      check(wait_(stream, addr, op.value, CU_STREAM_WAIT_VALUE_EQ), "cuStreamWaitValue32");
    }
  }
}

void MemOpStream::releaseForever(const std::vector<MemOp>& release, int device) {
  std::lock_guard<std::mutex> lock(mu_);
  if (releaser_.joinable() || stop_) {
    return;
  }
  releaser_ = std::thread([this, release, device] {
    cudaStream_t s = nullptr;
    if (cudaSetDevice(device) != cudaSuccess || cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
      SMDDP_LOG(kWarn, "cuda:", device, ": no stream to release this rank's memops waits after an abort");
      return;
    }
    // A capture under way on another thread must not forbid these calls.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      lock.unlock();
      // A new round of writes only once the last one has run, so that
      // nothing piles up; never a blocking wait on the device.
      const cudaError_t q = cudaStreamQuery(s);
      if (q == cudaSuccess) {
        try {
          enqueue(release, s);
        } catch (const std::exception& e) {
          SMDDP_LOG(kWarn, "cuda:", device, ": releasing this rank's memops waits after an abort: ", e.what());
          lock.lock();
          break;
        }
      } else if (q != cudaErrorNotReady) {
        lock.lock();
        break;
      }
      lock.lock();
      // Every step after a wait resets what the release wrote: write it
      // again until the communicator is gone.
      cv_.wait_for(lock, std::chrono::milliseconds(1), [this] { return stop_; });
    }
    lock.unlock();
    cudaStreamDestroy(s);
  });
}

} // namespace smddp::algorithm::cuda
