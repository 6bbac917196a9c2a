// Device memory and events shared by the ranks of one node through CUDA IPC.
//
// Each rank allocates a staging buffer on its GPU and two events (ready,
// done; interprocess, no timing), exports their IPC handles, and opens every
// peer's (the set-up protocol, algorithm/device_setup.h, moves the handles
// through the store: this class is its DeviceLinks). Peers then copy from
// each other's staging buffers with the copy engines (over NVLink where GPUs
// differ, within the GPU's memory where ranks share one) and reduction
// kernels read them directly.
//
// Ordering is split between the host and the GPU: a rank records its event
// on its stream and then posts a round in the node's host arena; a peer
// waits for the round on the host and then makes its stream wait for the
// event (cudaStreamWaitEvent takes the event as last recorded, so the host
// round is what guarantees it is this call's record). No thread waits for
// the GPU.
//
// Teardown: a rank may free its exported buffer and destroy its exported
// events only after every peer has closed them (CUDA leaves the other order
// undefined). closeImports() closes this rank's imports; the owner then meets
// the node in a round before releaseExports() (or the destructor) frees the
// exports.
//
// Each staging buffer begins with a header of kHeaderBytes holding the flags
// of the device-side synchronization (algorithm/cuda/device_sync.h): this
// rank's `ready` and `done` words, each on a line of its own, and the inboxes
// of the memory-operation synchronization (algorithm/cuda/memop_sync.h), a
// word per local rank each; the staged data follows it, 4 KiB aligned.
//
// Works with several ranks on one GPU (each process has its own context;
// IPC maps between them).
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "transport/device_links.h"

namespace smddp::transport {

// Throws kComm naming `what` if `err` is not cudaSuccess.
void cudaCheck(cudaError_t err, const char* what);

// Zeroes `bytes` of device memory at `p` and waits for it, on a stream of its
// own that does not wait for the legacy default stream. Flags that the
// communication streams set once the communicator exists (the staging
// header's, the sync counter) must be zero before that: a cudaMemset on the
// legacy stream runs only after whatever the caller's stream has queued, and
// could wipe a flag set in the meantime. `what` names the memory in errors.
void zeroDeviceMemory(void* p, size_t bytes, const char* what);

class CudaIpcArena : public DeviceLinks {
 public:
  // This rank is `local_rank` of `local_size` on its node and drives
  // `device`. Nothing is allocated before exportLocal().
  CudaIpcArena(int local_rank, int local_size, int device, size_t staging_bytes);
  ~CudaIpcArena() override;
  CudaIpcArena(const CudaIpcArena&) = delete;
  CudaIpcArena& operator=(const CudaIpcArena&) = delete;

  // DeviceLinks
  std::string identity() override;
  std::vector<uint8_t> exportLocal() override;
  void importPeer(int local_rank, const std::vector<uint8_t>& exported) override;
  void closeImports() override;
  void releaseExports() override;

  int device() const {
    return device_;
  }
  static constexpr size_t kHeaderBytes = 4096;
  size_t stagingBytes() const {
    return staging_bytes_;
  }
  // Local rank l's staged data (after its header).
  uint8_t* staging(int l) const {
    return staging_[static_cast<size_t>(l)] + kHeaderBytes;
  }
  // Local rank l's device-side flags.
  uint64_t* readyFlag(int l) const {
    return reinterpret_cast<uint64_t*>(staging_[static_cast<size_t>(l)]);
  }
  uint64_t* doneFlag(int l) const {
    return reinterpret_cast<uint64_t*>(staging_[static_cast<size_t>(l)] + 128);
  }
  // Local rank l's memory-operation inboxes: a word per local rank each,
  // 1 KiB apart (room for 256 ranks).
  uint32_t* readyInbox(int l) const {
    return reinterpret_cast<uint32_t*>(staging_[static_cast<size_t>(l)] + 1024);
  }
  uint32_t* busyInbox(int l) const {
    return reinterpret_cast<uint32_t*>(staging_[static_cast<size_t>(l)] + 2048);
  }
  cudaEvent_t ready(int l) const {
    return ready_[static_cast<size_t>(l)];
  }
  cudaEvent_t done(int l) const {
    return done_[static_cast<size_t>(l)];
  }

 private:
  int local_rank_;
  int local_size_;
  int device_;
  size_t staging_bytes_;
  std::vector<uint8_t*> staging_;
  std::vector<cudaEvent_t> ready_;
  std::vector<cudaEvent_t> done_;
};

} // namespace smddp::transport
