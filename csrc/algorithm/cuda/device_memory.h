// Memory the CUDA schedules allocate while they run (scratch for partial
// sums, pinned host buffers for host staging), from allocators the caller
// provides. The backend passes torch's caching allocators: cudaFree and
// cudaFreeHost synchronize the whole device, which a collective on the
// executor's thread must never do to the computation beside it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "algorithm/scratch_buffer.h"

namespace smddp::algorithm::cuda {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // `bytes` of device memory for work on `stream` (stream-ordered: freeing
  // it while that work runs is safe).
  virtual void* allocDevice(size_t bytes, cudaStream_t stream) = 0;
  virtual void freeDevice(void* p) = 0;
  // `bytes` of pinned host memory.
  virtual void* allocHost(size_t bytes) = 0;
  // Frees pinned memory that work enqueued on `stream` may still use: it is
  // handed out again only after that work.
  virtual void freeHost(void* p, cudaStream_t stream) = 0;
};

// A scratch buffer of device or pinned host memory from `memory`, which
// grows and keeps what CUDA graphs captured (algorithm/scratch_buffer.h).
class GrowingBuffer {
 public:
  enum class Kind { kDevice, kHost };
  GrowingBuffer(DeviceMemory& memory, Kind kind)
      : buffer_(
            [this, &memory, kind](size_t n) {
              return kind == Kind::kDevice ? memory.allocDevice(n, stream_) : memory.allocHost(n);
            },
            [this, &memory, kind](void* p) {
              if (kind == Kind::kDevice) {
                memory.freeDevice(p);
              } else {
                memory.freeHost(p, stream_);
              }
            }) {}

  // At least `bytes`, for work on `stream`; the contents are not kept.
  uint8_t* reserve(size_t bytes, cudaStream_t stream) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky; taken as captured, to be safe
      capture = cudaStreamCaptureStatusActive;
    }
    stream_ = stream;
    return buffer_.reserve(bytes, capture != cudaStreamCaptureStatusNone);
  }

  // Frees the buffer and what it outgrew (the work that used them has ended).
  void free() {
    stream_ = nullptr;
    buffer_.free();
  }

 private:
  cudaStream_t stream_ = nullptr;  // of the reserve being served
  ScratchBuffer buffer_;
};

} // namespace smddp::algorithm::cuda
