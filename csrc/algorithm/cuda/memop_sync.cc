#include "algorithm/cuda/memop_sync.h"

#include <cuda.h>

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "common/log.h"

namespace smddp::algorithm::cuda {

namespace {

// The ABI of the three functions since CUDA 12.0 (the _v2 entry points).
constexpr unsigned kEntryPointVersion = 12000;

// cuStreamBatchMemOp takes fewer than 256 operations per call.
constexpr size_t kMaxBatch = 255;

template <typename Fn>
Fn entryPoint(const char* name, const char* instead) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(name, &fn, kEntryPointVersion, cudaEnableDefault, &found);
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
    const std::string why =
        err != cudaSuccess ? str("could not be looked up: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")")
                           : std::string("this driver does not offer");
    SMDDP_THROW(kComm, "SMDDP_CUDA_SYNC=memops needs the driver's ", name, ", which ", why, "; ", instead);
  }
  return reinterpret_cast<Fn>(fn);
}

void check(int rc, const char* what,
           const char* instead = "SMDDP_CUDA_SYNC=device meets on the GPU with kernels instead") {
  if (rc != CUDA_SUCCESS) {
    SMDDP_THROW(kComm, what, " failed: CUresult ", rc, " (SMDDP_CUDA_SYNC=memops; ", instead, ")");
  }
}

constexpr const char* kOtherSync = "use SMDDP_CUDA_SYNC=device or host";

} // namespace

MemOpStream::MemOpStream(bool batch)
    : write_(entryPoint<MemOpFn>("cuStreamWriteValue32", kOtherSync)),
      wait_(entryPoint<MemOpFn>("cuStreamWaitValue32", kOtherSync)),
      batch_(batch ? entryPoint<BatchFn>("cuStreamBatchMemOp", "unset SMDDP_CUDA_BATCH_MEMOPS") : nullptr) {}

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
  if (batch_ != nullptr) {
    // The enqueuing threads (a collective's, the releaser) each fill their own.
    thread_local std::vector<CUstreamBatchMemOpParams> params;
    for (size_t at = 0; at < ops.size(); at += kMaxBatch) {
      const size_t n = std::min(kMaxBatch, ops.size() - at);
      params.assign(n, CUstreamBatchMemOpParams{});
      for (size_t i = 0; i < n; ++i) {
        const MemOp& op = ops[at + i];
        const auto addr = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(op.word));
        if (op.kind == MemOp::Kind::kWrite) {
          auto& w = params[i].writeValue;
          w.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
          w.address = addr;
          w.value = op.value;
          w.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
        } else {
          auto& w = params[i].waitValue;
          w.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
          w.address = addr;
          w.value = op.value;
          w.flags = CU_STREAM_WAIT_VALUE_EQ;
        }
      }
      check(batch_(stream, static_cast<unsigned>(n), params.data(), 0), "cuStreamBatchMemOp",
            "unset SMDDP_CUDA_BATCH_MEMOPS for one driver call per operation");
    }
    return;
  }
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
