// Memory the CUDA schedules allocate while they run (scratch for partial
// sums, pinned host buffers for host staging), from allocators the caller
// provides. The backend passes torch's caching allocators: cudaFree and
// cudaFreeHost synchronize the whole device, which a collective on the
// executor's thread must never do to the computation beside it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

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

// A buffer that grows (to the size asked for, rounded up to a power of two
// so that growing is rare) and is freed through `memory`.
class GrowingBuffer {
 public:
  enum class Kind { kDevice, kHost };
  GrowingBuffer(DeviceMemory& memory, Kind kind) : memory_(memory), kind_(kind) {}
  ~GrowingBuffer() {
    release(nullptr);
  }
  GrowingBuffer(const GrowingBuffer&) = delete;
  GrowingBuffer& operator=(const GrowingBuffer&) = delete;

  // At least `bytes`, for work on `stream`; the contents are not kept.
  uint8_t* reserve(size_t bytes, cudaStream_t stream) {
    if (bytes > bytes_ || ptr_ == nullptr) {
      release(stream);
      size_t n = 4096;
      while (n < bytes) {
        n *= 2;
      }
      ptr_ = static_cast<uint8_t*>(kind_ == Kind::kDevice ? memory_.allocDevice(n, stream) : memory_.allocHost(n));
      bytes_ = n;
    }
    return ptr_;
  }

 private:
  void release(cudaStream_t stream) {
    if (ptr_ != nullptr) {
      if (kind_ == Kind::kDevice) {
        memory_.freeDevice(ptr_);
      } else {
        memory_.freeHost(ptr_, stream);
      }
      ptr_ = nullptr;
      bytes_ = 0;
    }
  }

  DeviceMemory& memory_;
  Kind kind_;
  uint8_t* ptr_ = nullptr;
  size_t bytes_ = 0;
};

} // namespace smddp::algorithm::cuda
