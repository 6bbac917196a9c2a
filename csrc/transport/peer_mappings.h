// What a rank publishes about one of its device buffers so that the ranks of
// its node can map it (SMDDP_CUDA_ZERO_COPY), and the cache of the mappings
// a rank holds of its peers' buffers. CUDA-free: the cache takes the open
// and close operations as functions, so that its rules are tested on the
// host (tests/native/test_peer_mappings.cc); transport/cuda/ipc_buffers.h
// supplies CUDA IPC's.
//
// A buffer is published as the allocation that holds it (base, size, the
// handle a peer opens) and its offset there. An allocation is named by the
// process-wide unique id the driver gives it, never reused while the
// process lives: a mapping cached under an id can never show another
// allocation's memory, however the owner's allocator reuses addresses.
//
// The rules of the cache, per peer:
//   - The owner frees an allocation only after every peer has closed its
//     mapping (transport/shm/revocations.h: CUDA IPC leaves a free of memory
//     another process maps undefined); close(owner, id) is that.
//   - A record of a new id whose range overlaps a cached mapping means the
//     owner freed that allocation without it (its revocation timed out):
//     the stale mapping is closed then. Neither waits for this rank's work:
//     a rank frees memory only after its collectives on it are complete, and
//     a zero-copy collective completes only after every peer has read what
//     it mapped of it (algorithm/cuda/schedules.h, mappedStep).
// Mappings are not bounded otherwise: they are of the peers' live
// allocations.
//
// Threading: the caller serializes the calls (transport/cuda/ipc_buffers.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <vector>

namespace smddp::transport {

// Why a buffer cannot be mapped by the peers (kMappable: it can).
enum class Unmappable : uint32_t {
  kMappable = 0,
  kEmpty = 1,        // no bytes: nothing to map
  kNotDevice = 2,    // host, managed or another device's memory
  kNotIpc = 3,       // an allocation CUDA IPC cannot export (virtual memory
                     // management, e.g. torch's expandable segments)
  kCapturing = 4,    // the stream is being captured into a CUDA graph
  kUntraced = 5,     // memory whose free nobody announces (not torch's
                     // caching allocator, or its caching is off)
};
const char* unmappableName(Unmappable why);

// One buffer as its owner publishes it (in the node arena's slot of the
// call: plain bytes, the same layout in every process).
struct BufferRecord {
  uint8_t handle[64] = {};  // what a peer opens (cudaIpcMemHandle_t)
  uint64_t id = 0;          // the allocation's unique id
  uint64_t base = 0;        // the allocation's address in the owner
  uint64_t size = 0;        // its bytes
  uint64_t offset = 0;      // the buffer's offset in it
  Unmappable why = Unmappable::kMappable;
  uint32_t reserved = 0;
};
static_assert(sizeof(BufferRecord) == 104, "BufferRecord layout");
static_assert(std::is_trivially_copyable_v<BufferRecord>, "a BufferRecord lives in shared memory");

class PeerMappings {
 public:
  struct Ops {
    // Maps the allocation of `rec`; returns its base in this process. Throws.
    std::function<void*(const BufferRecord& rec)> open;
    // Unmaps what open returned.
    std::function<void(void* mapped)> close;
  };

  PeerMappings(int peers, Ops ops) : ops_(std::move(ops)), peers_(static_cast<size_t>(peers)) {}
  ~PeerMappings() {
    closeAll();
  }
  PeerMappings(const PeerMappings&) = delete;
  PeerMappings& operator=(const PeerMappings&) = delete;

  // The buffer of `rec`, published by peer `l`, as this process addresses
  // it: a cached mapping, or one made now.
  uint8_t* map(int l, const BufferRecord& rec) {
    std::vector<Entry>& cache = peers_[static_cast<size_t>(l)];
    for (Entry& e : cache) {
      if (e.id == rec.id) {
        return static_cast<uint8_t*>(e.mapped) + rec.offset;
      }
    }
    for (size_t i = cache.size(); i-- > 0;) {
      const Entry& e = cache[i];
      if (e.base < rec.base + rec.size && rec.base < e.base + e.size) {
        closeAt(cache, i);
      }
    }
    void* mapped = ops_.open(rec);
    cache.push_back(Entry{rec.id, rec.base, rec.size, mapped});
    return static_cast<uint8_t*>(mapped) + rec.offset;
  }

  // Closes the mapping of peer l's allocation `id`; false if none is held.
  bool close(int l, uint64_t id) {
    std::vector<Entry>& cache = peers_[static_cast<size_t>(l)];
    for (size_t i = 0; i < cache.size(); ++i) {
      if (cache[i].id == id) {
        closeAt(cache, i);
        return true;
      }
    }
    return false;
  }

  // Mappings held of peer l's buffers.
  size_t cached(int l) const {
    return peers_[static_cast<size_t>(l)].size();
  }

  // Closes every mapping (idempotent); the caller's work on them is done.
  void closeAll() {
    for (std::vector<Entry>& cache : peers_) {
      while (!cache.empty()) {
        closeAt(cache, cache.size() - 1);
      }
    }
  }

 private:
  struct Entry {
    uint64_t id;
    uint64_t base;
    uint64_t size;
    void* mapped;
  };

  void closeAt(std::vector<Entry>& cache, size_t i) {
    void* mapped = cache[i].mapped;
    cache.erase(cache.begin() + static_cast<std::ptrdiff_t>(i));
    ops_.close(mapped);
  }

  Ops ops_;
  std::vector<std::vector<Entry>> peers_;
};

inline const char* unmappableName(Unmappable why) {
  switch (why) {
    case Unmappable::kMappable:
      return "mappable";
    case Unmappable::kEmpty:
      return "empty";
    case Unmappable::kNotDevice:
      return "not device memory of the communicator's GPU";
    case Unmappable::kNotIpc:
      return "an allocation CUDA IPC cannot export (virtual memory management, e.g. expandable segments)";
    case Unmappable::kCapturing:
      return "the stream is capturing a CUDA graph";
    case Unmappable::kUntraced:
      return "memory whose free is not announced (not from torch's caching allocator, or "
             "PYTORCH_NO_CUDA_MEMORY_CACHING)";
  }
  return "?";
}

} // namespace smddp::transport
