// One node: CUDA IPC between its ranks, through each rank's staging buffer.
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
// With SMDDP_CUDA_ZERO_COPY the peers map each other's tensors instead, and
// each step is one pass over the whole message, without staging copies:
//   AllGather            rank r copies every peer's input into out
//   ReduceScatter        rank r reduces block r of every peer's input
//   AllReduce            rank r reduces its slice of every peer's input into
//                        its output; then copies every peer's output slice
// (every rank's inputs and outputs mapped; each element reduced in local rank
// order, as on the staged path, so the bits are the same).
#include <algorithm>
#include <functional>

#include "algorithm/cuda/device_reduce.h"
#include "algorithm/cuda/schedules.h"
#include "algorithm/device_plan.h"
#include "algorithm/ring.h"

namespace smddp::algorithm::cuda {

namespace {

class NodeSchedule : public Schedule {
 public:
  explicit NodeSchedule(DeviceContext& ctx) : ctx_(ctx) {}

  void allGather(const OpArgs& args, cudaStream_t s) override {
    const int L = ctx_.topo.localSize();
    const int me = ctx_.topo.myLocalRank();
    const size_t b = args.count * args.elemSize();
    const size_t S = ctx_.ipc->stagingBytes();
    auto* out = static_cast<uint8_t*>(args.out);
    const auto* in = static_cast<const uint8_t*>(args.in);
    MappedCall call;
    const Opened how = openNodeCall(ctx_, args, s, b, 0, &call);
    if (how == Opened::kMapped) {
      mappedStep(ctx_, args, s, true, [&] {
        std::vector<void*> dsts;
        std::vector<const void*> srcs;
        for (int k = 0; k < L; ++k) {
          const int l = (me + k) % L;
          dsts.push_back(out + static_cast<size_t>(l) * b);
          srcs.push_back(call.in[static_cast<size_t>(l)]);
        }
        copyBatch(ctx_, dsts, srcs, std::vector<size_t>(dsts.size(), b), s);
      });
      return;
    }
    copyAsync(out + static_cast<size_t>(me) * b, in, b, s);
    const size_t chunks = chunkCount(b, S);
    for (size_t c = 0; c < chunks; ++c) {
      const size_t off = c * S;
      const size_t n = chunkLen(b, S, c);
      exchange(
          ctx_, args, s, c == 0 && how == Opened::kStaged, [&] { copyAsync(ctx_.ipc->staging(me), in + off, n, s); },
          [&] {
            std::vector<void*> dsts;
            std::vector<const void*> srcs;
            for (int k = 1; k < L; ++k) {
              const int l = (me + k) % L;
              dsts.push_back(out + static_cast<size_t>(l) * b + off);
              srcs.push_back(ctx_.ipc->staging(l));
            }
            copyBatch(ctx_, dsts, srcs, std::vector<size_t>(dsts.size(), n), s);
          });
    }
  }

  void reduceScatter(const OpArgs& args, cudaStream_t s) override {
    const int L = ctx_.topo.localSize();
    const int me = ctx_.topo.myLocalRank();
    const size_t es = args.elemSize();
    const size_t ce = std::max<size_t>(1, ctx_.ipc->stagingBytes() / (static_cast<size_t>(L) * es));
    const auto* in = static_cast<const uint8_t*>(args.in);
    auto* out = static_cast<uint8_t*>(args.out);
    std::vector<const void*> srcs(static_cast<size_t>(L));
    MappedCall call;
    const size_t block = args.count * es;
    const Opened how = openNodeCall(ctx_, args, s, block * static_cast<size_t>(L), 0, &call);
    if (how == Opened::kMapped) {
      mappedStep(ctx_, args, s, true, [&] {
        for (int l = 0; l < L; ++l) {
          srcs[static_cast<size_t>(l)] = call.in[static_cast<size_t>(l)] + static_cast<size_t>(me) * block;
        }
        launchReduce(args.reduce, out, srcs.data(), L, args.count, Sources::kInputs, Result::kFinal,
                     ctx_.config.cuda_reduce_blocks, s);
      });
      return;
    }
    const size_t chunks = chunkCount(args.count, ce);
    for (size_t c = 0; c < chunks; ++c) {
      const size_t off = c * ce;
      const size_t n = chunkLen(args.count, ce, c);
      exchange(
          ctx_, args, s, c == 0 && how == Opened::kStaged,
          [&] {
            copyRows(ctx_, ctx_.ipc->staging(me), ce * es, in + off * es, args.count * es, n * es,
                     static_cast<size_t>(L), s);
          },
          [&] {
            for (int l = 0; l < L; ++l) {
              srcs[static_cast<size_t>(l)] = ctx_.ipc->staging(l) + static_cast<size_t>(me) * ce * es;
            }
            launchReduce(args.reduce, out + off * es, srcs.data(), L, n, Sources::kInputs, Result::kFinal, ctx_.config.cuda_reduce_blocks, s);
          });
    }
  }

  void allReduce(const OpArgs& args, cudaStream_t s) override {
    const int L = ctx_.topo.localSize();
    auto reduce = [&](const void* const* srcs, uint8_t* result, size_t count) {
      launchReduce(args.reduce, result, srcs, L, count, Sources::kInputs, Result::kFinal,
                   ctx_.config.cuda_reduce_blocks, s);
    };
    const size_t bytes = args.count * args.elemSize();
    if (bytes <= ctx_.config.cuda_oneshot_bytes && bytes <= ctx_.ipc->stagingBytes()) {
      oneShotAllReduce(ctx_, args, s, reduce);
      return;
    }
    MappedCall call;
    const Opened how = openNodeCall(ctx_, args, s, bytes, bytes, &call);
    if (how == Opened::kMapped) {
      mappedAllReduce(ctx_, args, s, call, reduce);
      return;
    }
    slicedAllReduce(ctx_, args, s, reduce, how);
  }

  void broadcast(const OpArgs& args, cudaStream_t s) override {
    OpArgs a = args;
    a.root = ctx_.topo.localRankOf(args.root);
    nodeBroadcast(ctx_, a, s);
  }

 private:
  DeviceContext& ctx_;
};

} // namespace

std::unique_ptr<Schedule> makeNodeSchedule(DeviceContext& ctx) {
  return std::make_unique<NodeSchedule>(ctx);
}

} // namespace smddp::algorithm::cuda
