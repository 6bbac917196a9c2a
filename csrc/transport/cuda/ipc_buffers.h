// CUDA IPC of the user's own device buffers (SMDDP_CUDA_ZERO_COPY): what a
// rank publishes about a buffer (its allocation's handle, id, range and the
// buffer's offset there), and the mappings of the peers' buffers, cached by
// allocation (transport/peer_mappings.h states the cache's rules).
//
// The buffers are torch's: the caching allocator carves tensors out of
// cudaMalloc'd segments, so the segment is what is exported and mapped, once,
// and a later tensor in the same segment costs no driver call on either side.
// An allocation made with the virtual memory management API (torch's
// expandable segments) has no legacy IPC handle: it is reported as
// Unmappable::kNotIpc and the call goes through the staging buffers.
//
// This rank's published allocations are remembered until their owner frees
// them (forget(), from the allocator's hook before the free), so that the
// peers can be told to close their mappings first.
//
// Threading: describe() and map() on the group's executor; close() on the
// revocation service thread; forget() on whatever thread frees memory:
// each part under its own lock, none held while waiting for another rank.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "transport/peer_mappings.h"

namespace smddp::transport {

class IpcBuffers {
 public:
  // `peers`: the node's ranks.
  IpcBuffers(int device, int peers);
  ~IpcBuffers();
  IpcBuffers(const IpcBuffers&) = delete;
  IpcBuffers& operator=(const IpcBuffers&) = delete;

  // The record of `bytes` at `p` on this rank's device for work on `stream`;
  // its `why` says when the peers cannot map it. Throws on a failed driver
  // call (an unexpected state of the device, not an unmappable buffer).
  BufferRecord describe(const void* p, size_t bytes, cudaStream_t stream);

  // Peer l's buffer of `rec` (of at least `bytes`) in this process. Throws
  // kComm.
  uint8_t* map(int l, const BufferRecord& rec, size_t bytes);

  // Closes this rank's mapping of peer l's allocation `id`, if it holds one.
  void close(int l, uint64_t id);

  // Closes every mapping of the peers' buffers (teardown, before the node
  // meets so that the owners may free them).
  void closeAll();

  // The ids of this rank's published allocations that overlap [base, base +
  // size), which are forgotten: the allocator is about to free them.
  std::vector<uint64_t> forget(uint64_t base, uint64_t size);

 private:
  struct Exported {
    uint64_t id;
    uint64_t base;
    uint64_t size;
    cudaIpcMemHandle_t handle;
  };

  int device_;
  std::mutex mappings_mu_;
  PeerMappings mappings_;
  // This rank's published allocations, until they are freed.
  std::mutex exported_mu_;
  std::vector<Exported> exported_;
};

} // namespace smddp::transport
