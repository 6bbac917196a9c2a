// The collectives of a group on CUDA tensors.
//
// Inside a node: CUDA IPC (transport/cuda/ipc_arena.h). Each rank copies its
// data into its staging buffer (copy engine), the peers copy from it
// (AllGather, Broadcast: copy engines again, no SMs) or reduce from it
// directly over NVLink (ReduceScatter, AllReduce: device_reduce.h with few
// blocks). Large calls go through the staging buffers in chunks.
//
//   AllGather 2 ranks:   A: a -> stage A   B: b -> stage B
//                        A: stage B -> out[1]   B: stage A -> out[0]
//   ReduceScatter:       every rank stages sub-chunk c of every block;
//                        rank r reduces sub-chunk c of block r from every
//                        stage, in local rank order
//   AllReduce:           per chunk, rank r reduces its slice from every stage
//                        into its stage's result half; then every rank
//                        copies all result slices
//
// Across nodes, two ways:
//   NCCL rails     (every rank has a GPU of its own): the hierarchical
//                  schedules with the rail stage on NCCL (grouped send/recv
//                  for AllGather, reduce-scatter / all-reduce / broadcast)
//                  and the node stage on IPC.
//   host staging   (ranks share GPUs, e.g. emulated nodes on one GPU): copy
//                  to pinned host memory, run the group's CPU schedules
//                  (hierarchical over sockets), copy back.
//
// Ordering: every step is enqueued on the caller's communication stream;
// the host only meets its node peers in the host arena to know their events
// are recorded. The calling thread never waits for the GPU, except on the
// host-staging path.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "algorithm/communicator.h"
#include "algorithm/node_collectives.h"
#include "transport/cuda/ipc_arena.h"
#include "transport/cuda/nccl_rail.h"
#include "transport/shm/node_arena.h"

namespace smddp::algorithm::cuda {

class CudaCommunicator {
 public:
  // Collective over the group. `host` is the group's CPU communicator (for
  // host staging); `device` this rank's GPU.
  CudaCommunicator(
      Store& store,
      const topology::Topology& topology,
      const Config& config,
      std::chrono::milliseconds timeout,
      int device,
      Communicator* host);
  ~CudaCommunicator();

  // Whether reductions of this dtype/op run here (else the caller delegates).
  bool supportsReduce(DataType dtype, ReduceOp op) const;

  void allGather(const OpArgs& args, cudaStream_t stream);
  void reduceScatter(const OpArgs& args, cudaStream_t stream);
  void allReduce(const OpArgs& args, cudaStream_t stream);
  void broadcast(const OpArgs& args, cudaStream_t stream);
  void abort(const std::string& why);
  std::string describe() const;

 private:
  enum class Mode { kNode, kRails, kHostStaging };

  // One round trip through the staging buffers: wait until the peers have
  // read this rank's stage, fill it, announce it, wait for the peers' stages,
  // consume them, announce that.
  void exchange(
      const OpArgs& args,
      cudaStream_t stream,
      bool first,
      const std::function<void()>& fill,
      const std::function<void()>& consume);
  void begin(const OpArgs& args);

  void nodeAllGather(const OpArgs& args, cudaStream_t stream);
  void nodeReduceScatter(const OpArgs& args, cudaStream_t stream);
  void nodeAllReduce(const OpArgs& args, cudaStream_t stream);
  void nodeBroadcast(const OpArgs& args, cudaStream_t stream);
  void railsAllGather(const OpArgs& args, cudaStream_t stream);
  void railsReduceScatter(const OpArgs& args, cudaStream_t stream);
  void railsAllReduce(const OpArgs& args, cudaStream_t stream);
  void railsBroadcast(const OpArgs& args, cudaStream_t stream);
  void staged(const OpArgs& args, cudaStream_t stream);
  uint8_t* deviceScratch(size_t bytes);
  void pinned(size_t in_bytes, size_t out_bytes);

  topology::Topology topo_;
  Config config_;
  int device_;
  Mode mode_ = Mode::kNode;
  Communicator* host_comm_;
  std::unique_ptr<transport::NodeArena> arena_;
  std::unique_ptr<NodeCollectives> host_;
  std::unique_ptr<transport::CudaIpcArena> ipc_;
  std::unique_ptr<transport::NcclRail> rail_;
  std::vector<int> rail_ranks_;
  uint8_t* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  uint8_t* pinned_in_ = nullptr;
  uint8_t* pinned_out_ = nullptr;
  size_t pinned_in_bytes_ = 0;
  size_t pinned_out_bytes_ = 0;
};

} // namespace smddp::algorithm::cuda
