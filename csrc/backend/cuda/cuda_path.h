// The CUDA implementation of the backend's device path (backend/device_path.h):
// one communication stream and one CudaCommunicator per device a rank
// drives, created at the group's first collective on that device; a
// watchdog over every collective enqueued; torch's caching allocators for the
// buffers the schedules need while they run.
//
// Built into the CUDA module (smddp._C_cuda) only.
#pragma once

#include <c10/cuda/CUDAStream.h>

#include <memory>
#include <mutex>
#include <unordered_map>

#include "algorithm/cuda/cuda_communicator.h"
#include "algorithm/device_setup.h"
#include "backend/device_path.h"
#include "common/watchdog.h"

namespace smddp {

class CudaPath : public DevicePath {
 public:
  explicit CudaPath(const DevicePathArgs& args);
  ~CudaPath() override;

  bool supportsReduce(at::ScalarType dtype, ReduceOp op) const override;
  Call prepare(
      CollectiveKind kind,
      const algorithm::OpArgs& args,
      const std::vector<at::Tensor>& inputs,
      const std::vector<at::Tensor>& outputs,
      uint64_t record) override;
  void synchronize(const Deadline& deadline) override;
  void abort(const std::string& why) override;
  std::string describe() const override;

 private:
  c10::cuda::CUDAStream streamFor(int device);
  // Created on first use, from the executor (collective).
  algorithm::cuda::CudaCommunicator& commFor(int device);
  std::vector<std::shared_ptr<algorithm::cuda::CudaCommunicator>> comms() const;
  // Waits (polling, bounded) until every stream's work enqueued so far has
  // finished; false at the deadline.
  bool drain(const Deadline& deadline);

  DevicePathArgs args_;
  // The end of a timed-out collective's message: where to compare the ranks'
  // last collectives (SMDDP_DEBUG_DUMP).
  std::shared_ptr<const std::string> dump_advice_;
  algorithm::DeviceSetup setup_;
  std::unique_ptr<algorithm::cuda::DeviceMemory> memory_;
  mutable std::mutex mu_;
  std::unordered_map<int, c10::cuda::CUDAStream> streams_;
  std::unordered_map<int, std::shared_ptr<algorithm::cuda::CudaCommunicator>> comms_;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;
  // Last member: stopped first, so that its callbacks never meet a half
  // destroyed path.
  Watchdog watchdog_;
};

} // namespace smddp
