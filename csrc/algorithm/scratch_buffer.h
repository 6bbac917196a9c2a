// A scratch buffer that grows, and what it may free when it does. CUDA-free,
// so that the native tests check the rule on the host; the CUDA schedules
// use it through algorithm/cuda/device_memory.h (GrowingBuffer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace smddp::algorithm {

// Grows to the size asked for, rounded up to a power of two so that growing
// is rare. A CUDA graph keeps the addresses it was captured with: once the
// buffer has served a call being captured, what it outgrows is kept until
// free() (at most as much again as its largest size), never handed back to
// the allocator while a graph may still replay into it. Otherwise what it
// outgrows goes back at once (the allocator orders reuse after the work
// enqueued on it).
class ScratchBuffer {
 public:
  using Alloc = std::function<void*(size_t bytes)>;
  using Free = std::function<void(void* p)>;

  ScratchBuffer(Alloc alloc, Free free) : alloc_(std::move(alloc)), free_(std::move(free)) {}
  ~ScratchBuffer() {
    free();
  }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;

  // At least `bytes`, for a call that is being captured in a graph or not;
  // the contents are not kept.
  uint8_t* reserve(size_t bytes, bool capturing) {
    if (bytes > bytes_ || ptr_ == nullptr) {
      if (captured_) {
        retired_.push_back(ptr_);
      } else if (ptr_ != nullptr) {
        free_(ptr_);
      }
      ptr_ = nullptr;
      bytes_ = 0;
      captured_ = false;
      size_t n = 4096;
      while (n < bytes) {
        n *= 2;
      }
      ptr_ = static_cast<uint8_t*>(alloc_(n));
      bytes_ = n;
    }
    captured_ = captured_ || capturing;
    return ptr_;
  }

  // Frees the buffer and what it outgrew (the work that used them has ended).
  void free() {
    for (uint8_t* p : retired_) {
      free_(p);
    }
    retired_.clear();
    if (ptr_ != nullptr) {
      free_(ptr_);
    }
    ptr_ = nullptr;
    bytes_ = 0;
    captured_ = false;
  }

 private:
  Alloc alloc_;
  Free free_;
  uint8_t* ptr_ = nullptr;
  size_t bytes_ = 0;
  // Whether a call being captured has used ptr_; what the buffer outgrew
  // after such a call.
  bool captured_ = false;
  std::vector<uint8_t*> retired_;
};

} // namespace smddp::algorithm
