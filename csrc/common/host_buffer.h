// Scratch memory that smddp keeps between calls (staged partial sums,
// received chunks).
#pragma once

#include <cstddef>
#include <cstdint>

namespace smddp {

// Grows on demand and never shrinks; contents are not kept across growth.
// Buffers of at least 2 MiB are mapped on 2 MiB boundaries and advised to
// use transparent huge pages: each call touches the whole buffer, and with
// 4 KiB pages its page walks (slow under virtualization, and cold after any
// pause) cost more than the copies into it.
class HostBuffer {
 public:
  HostBuffer() = default;
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  // At least `bytes` usable from data(); throws std::bad_alloc if the
  // mapping fails.
  uint8_t* reserve(size_t bytes);
  uint8_t* data() const {
    return data_;
  }
  size_t size() const {
    return size_;
  }

 private:
  void release();

  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

} // namespace smddp
