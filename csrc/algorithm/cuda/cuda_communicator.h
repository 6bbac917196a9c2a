// The collectives of a group on CUDA tensors, for one device of this rank.
//
// Set-up (collective, algorithm/device_setup.h) chooses one schedule for the
// communicator's life:
//   node          (one node) CUDA IPC: each rank copies its data into its
//                 staging buffer (copy engine), the peers copy from it
//                 (AllGather, Broadcast: copy engines again, no SMs) or
//                 reduce from it directly over NVLink (ReduceScatter,
//                 AllReduce: device_reduce.h with few blocks). Large calls
//                 go through the staging buffers in chunks. With
//                 SMDDP_CUDA_ZERO_COPY the peers map the tensors themselves
//                 (transport/cuda/ipc_buffers.h) and skip the staging.
//   rails         (uniform nodes, a GPU per rank) the hierarchical schedules
//                 with the rail stage on NCCL and the node stage on IPC
//                 (staged, or zero-copy as above).
//   host staging  (anything else) pinned host memory and the group's CPU
//                 schedules.
// node_schedule.cc, rails_schedule.cc and staged_schedule.cc draw them.
//
// Ordering: every step is enqueued on the caller's communication stream;
// the host only meets its node peers in the host arena to know their events
// are recorded. The calling thread never waits for the GPU, except on the
// host-staging path.
//
// Teardown (the destructor, after the caller has synchronized the stream):
// the node's ranks close each other's IPC mappings (staging buffers, mapped
// tensors), meet once, and only then
// free their own exports; NCCL rails are finalized, or aborted when a peer
// does not finish its teardown.
//
// Threading: the collectives and the destructor run on one thread (the
// group's executor); abort() and asyncError() may be called from any thread.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "algorithm/communicator.h"
#include "algorithm/cuda/device_memory.h"
#include "algorithm/cuda/device_sync.h"
#include "algorithm/cuda/memop_sync.h"
#include "algorithm/device_setup.h"
#include "algorithm/node_collectives.h"
#include "transport/cuda/ipc_arena.h"
#include "transport/cuda/ipc_buffers.h"
#include "transport/shm/revocations.h"
#include "transport/cuda/nccl_rail.h"
#include "transport/shm/node_arena.h"

namespace smddp::algorithm::cuda {

struct DeviceContext;
class Schedule;

class CudaCommunicator {
 public:
  // Collective over the group: `setup` hands out the store scope and chooses
  // the schedule; `host` is the group's CPU communicator (host staging);
  // `device` this rank's GPU; `memory` the allocator of run-time buffers.
  // All of them outlive the communicator.
  CudaCommunicator(
      Store& store,
      DeviceSetup& setup,
      const topology::Topology& topology,
      const Config& config,
      std::chrono::milliseconds timeout,
      int device,
      Communicator* host,
      DeviceMemory& memory);
  ~CudaCommunicator();
  CudaCommunicator(const CudaCommunicator&) = delete;
  CudaCommunicator& operator=(const CudaCommunicator&) = delete;

  void allGather(const OpArgs& args, cudaStream_t stream);
  void reduceScatter(const OpArgs& args, cudaStream_t stream);
  void allReduce(const OpArgs& args, cudaStream_t stream);
  void broadcast(const OpArgs& args, cudaStream_t stream);

  DeviceMode mode() const {
    return plan_.mode;
  }
  // Before a collective the caller's stream is capturing into a CUDA graph,
  // and before anything joins the capture: throws unless the schedule
  // enqueues the whole collective without host rounds.
  void checkCapture(const OpArgs& args) const;
  // From any thread: waits in the node arena and NCCL operations fail.
  void abort(const std::string& why);
  // NCCL's asynchronous error on the rail, "" if none (from any thread).
  std::string asyncError();
  std::string describe() const;
  // What its collectives wait on (deviceWaitsOn), for the message of one
  // that outlives the group's timeout; made once.
  const std::shared_ptr<const std::string>& waitsOn() const {
    return waits_on_;
  }

  // SMDDP_CUDA_ZERO_COPY: the allocator of `device` is about to free the
  // segment [base, base + size) of this process (from any thread, with the
  // allocator's lock held): every live communicator that published it asks
  // its node's peers to close their mappings first, and waits until they
  // have (bounded).
  static void segmentFreed(int device, uint64_t base, uint64_t size);

 private:
  // Before a collective: an error the device already holds belongs to
  // earlier work, and is named so.
  void checkDevice(const OpArgs& args);
  void revokeSegment(uint64_t base, uint64_t size);

  std::chrono::milliseconds timeout_;
  DevicePlan plan_;
  std::unique_ptr<DeviceContext> ctx_;
  std::unique_ptr<transport::NodeArena> arena_;
  std::unique_ptr<NodeCollectives> node_;
  std::unique_ptr<transport::CudaIpcArena> ipc_;
  std::unique_ptr<transport::NcclRail> rail_;
  std::unique_ptr<transport::IpcBuffers> buffers_;
  // The peers' revocations of their segments this rank maps, and this
  // rank's of its own (zero-copy only).
  std::unique_ptr<transport::Revocations> revocations_;
  // A peer missed a revocation's bound: later ones wait for it briefly.
  std::atomic<bool> peers_late_{false};
  std::unique_ptr<Schedule> schedule_;
  // SMDDP_CUDA_SYNC=device: the counter (device memory) and the words of
  // the waits (pinned host memory mapped into the device).
  uint64_t* sync_counter_ = nullptr;
  SyncWords* sync_words_ = nullptr;
  // SMDDP_CUDA_SYNC=memops: the driver's entry points, and after an abort
  // the thread that keeps releasing this rank's waits.
  std::unique_ptr<MemOpStream> memops_;
  std::atomic<bool> aborted_{false};
  std::shared_ptr<const std::string> waits_on_;
};

} // namespace smddp::algorithm::cuda
