// The CUDA side of ProcessGroupSMDDP: stream semantics as in
// ProcessGroupNCCL around the CUDA communicator.
//
//   call time (caller's thread)   an event on the caller's current stream;
//                                 the tensors are recorded on the group's
//                                 communication stream (recordStream), so
//                                 the caching allocator keeps them alive
//   run time (executor)           the communication stream waits for that
//                                 event, the collective is enqueued on it,
//                                 an end event is recorded after it
//   wait() / synchronize()        the caller's current stream waits for the
//                                 end event (the host does not block)
//   is_completed()                enqueued, and the end event has fired
//
// The communicator of a device is created at the first CUDA collective of
// the group (collective: every rank makes that call too).
//
// Built without CUDA, available() is false and the backend delegates every
// CUDA tensor to its fallback.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithm/communicator.h"
#include "algorithm/op.h"
#include "common/config.h"
#include "topology/topology.h"

namespace smddp {

class CudaPath {
 public:
  // What the backend needs to run one CUDA collective.
  struct Call {
    // Runs on the executor: enqueue the collective.
    std::function<void(uint64_t seq, const Deadline& deadline)> body;
    // Called by Work::wait()/synchronize() after the body ran.
    std::function<void()> on_wait;
    // Whether the GPU has finished (for is_completed()).
    std::function<bool()> gpu_done;
    // Runs the completion of the Work's future with the communication
    // stream current (CUDA futures record events on current streams).
    std::function<void(const std::function<void()>&)> completion_context;
  };

  // Whether this build has the CUDA path.
  static bool available();

  CudaPath(
      const c10::intrusive_ptr<::c10d::Store>& store,
      const topology::Topology& topology,
      const Config& config,
      std::chrono::milliseconds timeout,
      algorithm::Communicator* host);
  ~CudaPath();
  CudaPath(const CudaPath&) = delete;
  CudaPath& operator=(const CudaPath&) = delete;

  // Whether reductions of this dtype/op run on the CUDA path.
  bool supportsReduce(at::ScalarType dtype, const ReduceOp op) const;

  // Prepares `kind` on CUDA tensors (all on one device): `args` has
  // everything but the pointers' validity (taken from the tensors, which
  // the call keeps alive), seq and deadline.
  Call prepare(
      CollectiveKind kind,
      const algorithm::OpArgs& args,
      const std::vector<at::Tensor>& inputs,
      const std::vector<at::Tensor>& outputs);

  void abort(const std::string& why);
  std::string describe() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace smddp
