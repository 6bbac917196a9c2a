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
// Threading: one thread (the group's executor) uses an IpcBuffers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "transport/peer_mappings.h"

namespace smddp::transport {

class IpcBuffers {
 public:
  // `peers`: the node's ranks; mappings of each one's buffers are cached up
  // to `capacity`.
  IpcBuffers(int device, int peers, size_t capacity);
  ~IpcBuffers();
  IpcBuffers(const IpcBuffers&) = delete;
  IpcBuffers& operator=(const IpcBuffers&) = delete;

  // The record of `bytes` at `p` on this rank's device for work on `stream`;
  // its `why` says when the peers cannot map it. Throws on a failed driver
  // call (an unexpected state of the device, not an unmappable buffer).
  BufferRecord describe(const void* p, size_t bytes, cudaStream_t stream);

  // Peer l's buffer of `rec` (of at least `bytes`) in this process. `stream`
  // is the work that may still read a mapping that makes room. Throws kComm.
  uint8_t* map(int l, const BufferRecord& rec, size_t bytes, cudaStream_t stream);

  // Closes every mapping of the peers' buffers (teardown, before the node
  // meets so that the owners may free them).
  void closeAll();

 private:
  int device_;
  PeerMappings mappings_;
  // This rank's exported allocations: id -> handle (newest last). Handles
  // hold no resources, so dropping one past the bound only costs a driver
  // call when the allocation is published again.
  std::vector<std::pair<uint64_t, cudaIpcMemHandle_t>> exported_;
};

} // namespace smddp::transport
