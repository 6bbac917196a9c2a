#include <algorithm>

#include "algorithm/cuda/schedules.h"
#include "algorithm/protocol.h"
#include "common/error.h"

namespace smddp::algorithm::cuda {

using transport::cudaCheck;

void copyAsync(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  if (bytes > 0 && dst != src) {
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
  }
}

void copyBatch(
    const DeviceContext& ctx,
    const std::vector<void*>& dsts,
    const std::vector<const void*>& srcs,
    const std::vector<size_t>& sizes,
    cudaStream_t s) {
  std::vector<void*> d;
  std::vector<const void*> from;
  std::vector<size_t> n;
  for (size_t i = 0; i < dsts.size(); ++i) {
    if (sizes[i] > 0 && dsts[i] != srcs[i]) {
      d.push_back(dsts[i]);
      from.push_back(srcs[i]);
      n.push_back(sizes[i]);
    }
  }
  if (d.empty()) {
    return;
  }
  if (ctx.config.cuda_batch_copies && d.size() > 1) {
    // Every source is ready in stream order (the stream waited for it).
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t first = 0;
    cudaCheck(cudaMemcpyBatchAsync(d.data(), from.data(), n.data(), d.size(), &attr, &first, 1, s),
              "cudaMemcpyBatchAsync");
    return;
  }
  for (size_t i = 0; i < d.size(); ++i) {
    copyAsync(d[i], from[i], n[i], s);
  }
}

void copyRows(
    const DeviceContext& ctx,
    void* dst,
    size_t dpitch,
    const void* src,
    size_t spitch,
    size_t width,
    size_t rows,
    cudaStream_t s) {
  if (width == 0 || rows == 0) {
    return;
  }
  if (dpitch <= ctx.max_pitch && spitch <= ctx.max_pitch) {
    cudaCheck(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, s),
              "cudaMemcpy2DAsync");
    return;
  }
  auto* d = static_cast<uint8_t*>(dst);
  const auto* p = static_cast<const uint8_t*>(src);
  for (size_t r = 0; r < rows; ++r) {
    copyAsync(d + r * dpitch, p + r * spitch, width, s);
  }
}

void openDeviceCall(DeviceContext& ctx, const OpArgs& args) {
  protocol::openCall(*ctx.arena, args, protocol::Path::kDevice);
}

namespace {

SyncStep syncStep(const DeviceContext& ctx) {
  SyncStep st;
  st.counter = ctx.sync_counter;
  st.words = ctx.sync_words;
  st.timeout_ns = ctx.sync_timeout_ns;
  return st;
}

void exchangeOnDevice(
    DeviceContext& ctx,
    const OpArgs& args,
    cudaStream_t s,
    bool first,
    const std::function<void()>& fill,
    const std::function<void()>& consume) {
  const int L = ctx.topo.localSize();
  const int me = ctx.topo.myLocalRank();
  if (first) {
    // The host checks once per call that every rank makes the same call.
    ctx.node->round(args.deadline);
    protocol::verifyCall(*ctx.arena, args);
  }
  // The peers have read this stage (their done >= the exchanges so far).
  SyncStep read = syncStep(ctx);
  for (int l = 0; l < L; ++l) {
    if (l != me) {
      read.wait[read.nwait++] = ctx.ipc->doneFlag(l);
    }
  }
  launchSyncStep(read, s);
  fill();
  SyncStep ready = syncStep(ctx);
  ready.bump = true;
  ready.post = ctx.ipc->readyFlag(me);
  for (int l = 0; l < L; ++l) {
    if (l != me) {
      ready.wait[ready.nwait++] = ctx.ipc->readyFlag(l);
    }
  }
  launchSyncStep(ready, s);
  consume();
  SyncStep done = syncStep(ctx);
  done.post = ctx.ipc->doneFlag(me);
  launchSyncStep(done, s);
}

} // namespace

void exchange(
    DeviceContext& ctx,
    const OpArgs& args,
    cudaStream_t s,
    bool first,
    const std::function<void()>& fill,
    const std::function<void()>& consume) {
  if (ctx.device_sync) {
    exchangeOnDevice(ctx, args, s, first, fill, consume);
    return;
  }
  const int L = ctx.topo.localSize();
  const int me = ctx.topo.myLocalRank();
  // The peers' "done" of the previous exchange: they have read this stage.
  for (int l = 0; l < L; ++l) {
    if (l != me) {
      cudaCheck(cudaStreamWaitEvent(s, ctx.ipc->done(l), 0), "cudaStreamWaitEvent");
    }
  }
  fill();
  cudaCheck(cudaEventRecord(ctx.ipc->ready(me), s), "cudaEventRecord");
  ctx.node->round(args.deadline);
  if (first) {
    protocol::verifyCall(*ctx.arena, args);
  }
  for (int l = 0; l < L; ++l) {
    if (l != me) {
      cudaCheck(cudaStreamWaitEvent(s, ctx.ipc->ready(l), 0), "cudaStreamWaitEvent");
    }
  }
  consume();
  cudaCheck(cudaEventRecord(ctx.ipc->done(me), s), "cudaEventRecord");
  ctx.node->round(args.deadline);
}

void nodeBroadcast(DeviceContext& ctx, const OpArgs& args, cudaStream_t s) {
  const int me = ctx.topo.myLocalRank();
  const size_t b = args.count * args.elemSize();
  const size_t S = ctx.ipc->stagingBytes();
  const auto* in = static_cast<const uint8_t*>(args.in);
  auto* out = static_cast<uint8_t*>(args.out);
  openDeviceCall(ctx, args);
  const size_t chunks = chunkCount(b, S);
  for (size_t c = 0; c < chunks; ++c) {
    const size_t off = c * S;
    const size_t n = chunkLen(b, S, c);
    exchange(
        ctx, args, s, c == 0,
        [&] {
          if (me == args.root) {
            copyAsync(ctx.ipc->staging(me), in + off, n, s);
          }
        },
        [&] {
          if (me == args.root) {
            copyAsync(out + off, in + off, n, s);
          } else {
            copyAsync(out + off, ctx.ipc->staging(args.root), n, s);
          }
        });
  }
}

} // namespace smddp::algorithm::cuda
