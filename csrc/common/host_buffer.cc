#include "common/host_buffer.h"

#include <new>

#include <sys/mman.h>

namespace smddp {

namespace {

constexpr size_t kHuge = size_t{2} << 20;

size_t roundUp(size_t a, size_t b) {
  return (a + b - 1) / b * b;
}

} // namespace

HostBuffer::~HostBuffer() {
  release();
}

void HostBuffer::release() {
  if (map_ != nullptr) {
    ::munmap(map_, map_bytes_);
  }
  map_ = nullptr;
  map_bytes_ = 0;
  data_ = nullptr;
  size_ = 0;
}

uint8_t* HostBuffer::reserve(size_t bytes) {
  if (bytes <= size_) {
    return data_;
  }
  release();
  const bool huge = bytes >= kHuge;
  const size_t usable = roundUp(bytes, huge ? kHuge : size_t{4096});
  // One huge page of slack to start on a 2 MiB boundary.
  const size_t total = usable + (huge ? kHuge : 0);
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    throw std::bad_alloc();
  }
  map_ = p;
  map_bytes_ = total;
  auto start = reinterpret_cast<uintptr_t>(p);
  if (huge) {
    start = roundUp(start, kHuge);
    // Advice only: without transparent huge pages the buffer still works.
    ::madvise(reinterpret_cast<void*>(start), usable, MADV_HUGEPAGE);
  }
  data_ = reinterpret_cast<uint8_t*>(start);
  size_ = usable;
  return data_;
}

} // namespace smddp
