// Host staging: copy to pinned host memory, run the group's CPU schedules
// (hierarchical over sockets, or the node's shared memory), copy back. For
// ranks that share GPUs across nodes (emulated nodes on one GPU), and
// wherever CUDA IPC is unavailable (SMDDP_CUDA_IPC=0, sandboxed runtimes).
// The only path on which the executor's thread waits for the GPU.
#include <algorithm>

#include "algorithm/cuda/schedules.h"
#include "common/error.h"

namespace smddp::algorithm::cuda {

namespace {

using transport::cudaCheck;

class StagedSchedule : public Schedule {
 public:
  explicit StagedSchedule(DeviceContext& ctx)
      : ctx_(ctx),
        in_(*ctx.memory, GrowingBuffer::Kind::kHost),
        out_(*ctx.memory, GrowingBuffer::Kind::kHost) {
    SMDDP_CHECK_ARG(ctx_.host != nullptr, "CUDA collectives staged through host memory need the CPU communicator");
  }

  void allGather(const OpArgs& args, cudaStream_t s) override {
    run(args, s);
  }
  void reduceScatter(const OpArgs& args, cudaStream_t s) override {
    run(args, s);
  }
  void allReduce(const OpArgs& args, cudaStream_t s) override {
    run(args, s);
  }
  void broadcast(const OpArgs& args, cudaStream_t s) override {
    run(args, s);
  }

 private:
  void run(const OpArgs& args, cudaStream_t s) {
    const size_t es = args.elemSize();
    const size_t world = static_cast<size_t>(ctx_.topo.size());
    size_t in_bytes = args.count * es;
    size_t out_bytes = args.count * es;
    if (args.kind == CollectiveKind::kAllGather) {
      out_bytes *= world;
    } else if (args.kind == CollectiveKind::kReduceScatter) {
      in_bytes *= world;
    }
    const bool in_place = args.kind == CollectiveKind::kAllReduce || args.kind == CollectiveKind::kBroadcast;
    uint8_t* pin = in_.reserve(std::max<size_t>(in_bytes, 1), s);
    uint8_t* pout = in_place ? pin : out_.reserve(std::max<size_t>(out_bytes, 1), s);
    if (in_bytes > 0) {
      cudaCheck(cudaMemcpyAsync(pin, args.in, in_bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync to host");
    }
    // The host schedule needs the data now (and the previous call's copy
    // back out of the pinned buffers done).
    cudaCheck(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    OpArgs h = args;
    h.in = pin;
    h.out = pout;
    switch (args.kind) {
      case CollectiveKind::kAllGather:
        ctx_.host->allGather(h);
        break;
      case CollectiveKind::kReduceScatter:
        ctx_.host->reduceScatter(h);
        break;
      case CollectiveKind::kAllReduce:
        ctx_.host->allReduce(h);
        break;
      case CollectiveKind::kBroadcast:
        ctx_.host->broadcast(h);
        break;
      case CollectiveKind::kBarrier:
        SMDDP_THROW(kInternal, "no staged path for ", collectiveName(args.kind));
    }
    if (out_bytes > 0) {
      cudaCheck(cudaMemcpyAsync(args.out, pout, out_bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync to device");
    }
  }

  DeviceContext& ctx_;
  GrowingBuffer in_;
  GrowingBuffer out_;
};

} // namespace

std::unique_ptr<Schedule> makeStagedSchedule(DeviceContext& ctx) {
  return std::make_unique<StagedSchedule>(ctx);
}

} // namespace smddp::algorithm::cuda
