#include "backend/cuda_path.h"

#include "backend/store_adapter.h"
#include "common/error.h"

#ifdef SMDDP_WITH_CUDA

#include <ATen/cuda/CUDAEvent.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <mutex>
#include <unordered_map>

#include "algorithm/cuda/cuda_communicator.h"
#include "algorithm/cuda/device_reduce.h"

namespace smddp {

struct CudaPath::Impl {
  c10::intrusive_ptr<::c10d::Store> store;
  topology::Topology topo;
  Config config;
  std::chrono::milliseconds timeout;
  algorithm::Communicator* host;
  std::mutex mu;
  // Per device: the communication stream and the communicator.
  std::unordered_map<int, c10::cuda::CUDAStream> streams;
  std::unordered_map<int, std::unique_ptr<algorithm::cuda::CudaCommunicator>> comms;

  c10::cuda::CUDAStream streamFor(int device) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = streams.find(device);
    if (it == streams.end()) {
      it = streams.emplace(device, c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device)).first;
    }
    return it->second;
  }

  // Created on first use, from the executor (collective).
  algorithm::cuda::CudaCommunicator& commFor(int device) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = comms.find(device);
    if (it == comms.end()) {
      C10dStoreAdapter st(c10::make_intrusive<::c10d::PrefixStore>(str("smddp-cuda", device), store), timeout);
      it = comms
               .emplace(
                   device,
                   std::make_unique<algorithm::cuda::CudaCommunicator>(st, topo, config, timeout, device, host))
               .first;
    }
    return *it->second;
  }
};

bool CudaPath::available() {
  return true;
}

CudaPath::CudaPath(
    const c10::intrusive_ptr<::c10d::Store>& store,
    const topology::Topology& topology,
    const Config& config,
    std::chrono::milliseconds timeout,
    algorithm::Communicator* host)
    : impl_(new Impl{store, topology, config, timeout, host, {}, {}, {}}) {}

CudaPath::~CudaPath() = default;

bool CudaPath::supportsReduce(at::ScalarType dtype, ReduceOp op) const {
  switch (dtype) {
    case at::kFloat:
      return algorithm::cuda::deviceReduceSupported(DataType::kFloat32, op);
    case at::kHalf:
      return algorithm::cuda::deviceReduceSupported(DataType::kFloat16, op);
    case at::kBFloat16:
      return algorithm::cuda::deviceReduceSupported(DataType::kBFloat16, op);
    default:
      return false;
  }
}

CudaPath::Call CudaPath::prepare(
    CollectiveKind kind,
    const algorithm::OpArgs& args,
    const std::vector<at::Tensor>& inputs,
    const std::vector<at::Tensor>& outputs) {
  const at::Tensor& first = outputs.empty() ? inputs.at(0) : outputs.at(0);
  const int device = first.device().index();
  c10::cuda::CUDAGuard guard(device);
  c10::cuda::CUDAStream comm = impl_->streamFor(device);
  // The communication stream starts after what the caller enqueued so far.
  auto ready = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
  ready->record(c10::cuda::getCurrentCUDAStream(device));
  // The allocator must not reuse these tensors' memory before the
  // communication stream is done with them.
  for (const auto& t : inputs) {
    c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), comm);
  }
  for (const auto& t : outputs) {
    c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), comm);
  }
  auto end = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
  Impl* impl = impl_.get();
  Call call;
  call.body = [impl, kind, args, inputs, outputs, device, comm, ready, end](uint64_t seq, const Deadline& deadline) {
    c10::cuda::CUDAGuard g(device);
    ready->block(comm);
    algorithm::OpArgs a = args;
    a.seq = seq;
    a.deadline = deadline;
    auto& cc = impl->commFor(device);
    switch (kind) {
      case CollectiveKind::kAllGather:
        cc.allGather(a, comm.stream());
        break;
      case CollectiveKind::kReduceScatter:
        cc.reduceScatter(a, comm.stream());
        break;
      case CollectiveKind::kAllReduce:
        cc.allReduce(a, comm.stream());
        break;
      case CollectiveKind::kBroadcast:
        cc.broadcast(a, comm.stream());
        break;
      default:
        SMDDP_THROW(kInternal, "no CUDA path for ", collectiveName(kind));
    }
    end->record(comm);
  };
  call.on_wait = [end, device] {
    c10::cuda::CUDAGuard g(device);
    end->block(c10::cuda::getCurrentCUDAStream(device));
  };
  call.gpu_done = [end] { return end->query(); };
  call.completion_context = [comm, device](const std::function<void()>& fn) {
    c10::cuda::CUDAGuard g(device);
    c10::cuda::CUDAStreamGuard sg(comm);
    fn();
  };
  return call;
}

void CudaPath::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (auto& [device, comm] : impl_->comms) {
    comm->abort(why);
  }
}

std::string CudaPath::describe() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::string out;
  for (auto& [device, comm] : impl_->comms) {
    out += str(out.empty() ? "" : "; ", "cuda:", device, " ", comm->describe());
  }
  return out.empty() ? "cuda: not used yet" : out;
}

} // namespace smddp

#else // SMDDP_WITH_CUDA

namespace smddp {

struct CudaPath::Impl {};

bool CudaPath::available() {
  return false;
}

CudaPath::CudaPath(
    const c10::intrusive_ptr<::c10d::Store>&,
    const topology::Topology&,
    const Config&,
    std::chrono::milliseconds,
    algorithm::Communicator*) {}

CudaPath::~CudaPath() = default;

bool CudaPath::supportsReduce(at::ScalarType, ReduceOp) const {
  return false;
}

CudaPath::Call CudaPath::prepare(
    CollectiveKind kind,
    const algorithm::OpArgs&,
    const std::vector<at::Tensor>&,
    const std::vector<at::Tensor>&) {
  SMDDP_THROW(kInternal, "smddp was built without CUDA: no CUDA path for ", collectiveName(kind));
}

void CudaPath::abort(const std::string&) {}

std::string CudaPath::describe() const {
  return "cuda: not built";
}

} // namespace smddp

#endif // SMDDP_WITH_CUDA
