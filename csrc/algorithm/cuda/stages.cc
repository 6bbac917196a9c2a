#include <algorithm>
#include <cstring>
#include <optional>

#include "algorithm/cuda/schedules.h"
#include "algorithm/device_plan.h"
#include "algorithm/protocol.h"
#include "common/error.h"
#include "common/log.h"

namespace smddp::algorithm::cuda {

using transport::cudaCheck;

void copyAsync(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  if (bytes > 0 && dst != src) {
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
  }
}

#if CUDART_VERSION >= 12080
namespace {
bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaCheck(cudaStreamIsCapturing(s, &capture), "cudaStreamIsCapturing");
  return capture != cudaStreamCaptureStatusNone;
}
} // namespace
#endif

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
#if CUDART_VERSION >= 12080
  // A CUDA graph has no node for a batch of copies: captured, they go one
  // after another. (Toolkits before 12.8 have no batch.)
  if (ctx.config.cuda_batch_copies && d.size() > 1 && !capturing(s)) {
    // Every source is ready in stream order (the stream waited for it).
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t first = 0;
#if CUDART_VERSION >= 13000
    cudaCheck(cudaMemcpyBatchAsync(d.data(), from.data(), n.data(), d.size(), &attr, &first, 1, s),
              "cudaMemcpyBatchAsync");
#else
    size_t failed = 0;
    cudaCheck(cudaMemcpyBatchAsync(d.data(), const_cast<void**>(from.data()), n.data(), d.size(), &attr, &first, 1,
                                   &failed, s),
              "cudaMemcpyBatchAsync");
#endif
    return;
  }
#else
  (void)ctx;
#endif
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

void StreamJoin::join() {
  cudaCheck(cudaEventRecord(event_, side_), "cudaEventRecord");
  cudaCheck(cudaStreamWaitEvent(main_, event_, 0), "cudaStreamWaitEvent");
  joined_ = true;
}

void openDeviceCall(DeviceContext& ctx, const OpArgs& args) {
  protocol::openCall(*ctx.arena, args, protocol::Path::kDevice);
}

namespace {

// `s` waits for every peer's last record of its event `which` (ready, done).
void waitPeers(const DeviceContext& ctx, cudaStream_t s, cudaEvent_t (transport::CudaIpcArena::*which)(int) const) {
  for (int l = 0; l < ctx.topo.localSize(); ++l) {
    if (l != ctx.topo.myLocalRank()) {
      cudaCheck(cudaStreamWaitEvent(s, (ctx.ipc->*which)(l), 0), "cudaStreamWaitEvent");
    }
  }
}

enum class Step { kBefore, kBetween, kAfter };

// One step of the device-side synchronization: kernels, or the stream's own
// memory operations.
void deviceStep(const DeviceContext& ctx, Step step, cudaStream_t s) {
  if (ctx.memops != nullptr) {
    const MemOpSteps& m = ctx.memop_steps;
    ctx.memops->enqueue(step == Step::kBefore ? m.before : step == Step::kBetween ? m.between : m.after, s);
    return;
  }
  const ExchangeSteps& k = ctx.sync_steps;
  launchSyncStep(step == Step::kBefore ? k.before : step == Step::kBetween ? k.between : k.after, s);
}

void exchangeOnDevice(
    DeviceContext& ctx,
    const OpArgs& args,
    cudaStream_t s,
    bool first,
    const std::function<void()>& fill,
    const std::function<void()>& consume) {
  if (first) {
    // The host checks once per call that every rank makes the same call.
    ctx.node->round(args.deadline);
    protocol::verifyCall(*ctx.arena, args);
  }
  deviceStep(ctx, Step::kBefore, s);
  fill();
  deviceStep(ctx, Step::kBetween, s);
  consume();
  deviceStep(ctx, Step::kAfter, s);
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
  const int me = ctx.topo.myLocalRank();
  // The peers' "done" of the previous exchange: they have read this stage.
  waitPeers(ctx, s, &transport::CudaIpcArena::done);
  fill();
  cudaCheck(cudaEventRecord(ctx.ipc->ready(me), s), "cudaEventRecord");
  ctx.node->round(args.deadline);
  if (first) {
    protocol::verifyCall(*ctx.arena, args);
  }
  waitPeers(ctx, s, &transport::CudaIpcArena::ready);
  consume();
  cudaCheck(cudaEventRecord(ctx.ipc->done(me), s), "cudaEventRecord");
  ctx.node->round(args.deadline);
}

namespace {

// How slicedAllReduce cuts a call: chunks of `ce` elements, each of which
// fills the input half of a stage (its results take the other half).
struct SliceChunks {
  SliceChunks(const DeviceContext& ctx, const OpArgs& args)
      : es(args.elemSize()),
        half(ctx.ipc->stagingBytes() / 2 / 16 * 16),
        ce(std::max<size_t>(1, half / es)),
        parts(static_cast<size_t>(ctx.topo.localSize())) {}

  size_t len(size_t count, size_t c) const {
    return chunkLen(count, ce, c);
  }
  AlignedSlices slices(size_t n) const {
    return AlignedSlices{n, parts, std::max<size_t>(1, 16 / es)};
  }

  size_t es;
  size_t half;
  size_t ce;
  size_t parts;
};

} // namespace

size_t slicedAllReduceChunks(const DeviceContext& ctx, const OpArgs& args) {
  return chunkCount(args.count, SliceChunks(ctx, args).ce);
}

size_t slicedAllReduceSliceBytes(const DeviceContext& ctx, const OpArgs& args) {
  const SliceChunks k(ctx, args);
  // The first chunk is the longest, and its first slice the longest in it.
  return k.slices(k.len(args.count, 0)).size(0) * k.es;
}

void slicedAllReduce(
    DeviceContext& ctx,
    const OpArgs& args,
    cudaStream_t s,
    const std::function<void(const void* const* srcs, uint8_t* result, size_t count)>& reduceSlice,
    Opened how,
    const SliceRail* rail,
    const MappedCall* call) {
  const bool mapped = how == Opened::kMapped;
  // One node maps through mappedAllReduce: a mapped call here is the rails'.
  SMDDP_ASSERT(!mapped || (call != nullptr && rail != nullptr),
               "(a mapped sliced AllReduce needs the mapped buffers and the rail)");
  const int L = ctx.topo.localSize();
  const size_t me = static_cast<size_t>(ctx.topo.myLocalRank());
  const SliceChunks k(ctx, args);
  const size_t es = k.es;
  const size_t chunks = chunkCount(args.count, k.ce);
  const auto* in = static_cast<const uint8_t*>(args.in);
  auto* out = static_cast<uint8_t*>(args.out);
  uint8_t* result = ctx.ipc->staging(static_cast<int>(me)) + k.half;
  const RailSteps steps = rail != nullptr ? rail->steps : RailSteps::kNone;
  const bool two_streams = steps == RailSteps::kPerChunk;
  auto slot = [&](size_t c) { return rail->slots + (two_streams ? c % 2 : c) * rail->slot_bytes; };
  std::optional<StreamJoin> join;
  if (two_streams) {
    join.emplace(s, rail->stream, rail->joined);
  }
  std::vector<const void*> srcs(static_cast<size_t>(L));
  // Mapped: this rank's slice of chunk c straight from every rank's input
  // into its slot; its own slice into the output from the slot and every
  // peer's slice from the peer's output.
  auto reduceMapped = [&](size_t c) {
    const AlignedSlices slices = k.slices(k.len(args.count, c));
    const size_t at = (c * k.ce + slices.begin(me)) * es;
    for (int l = 0; l < L; ++l) {
      srcs[static_cast<size_t>(l)] = call->in[static_cast<size_t>(l)] + at;
    }
    reduceSlice(srcs.data(), slot(c), slices.size(me));
  };
  std::vector<void*> dsts;
  std::vector<const void*> from;
  std::vector<size_t> sizes;
  auto gatherMapped = [&](size_t c) {
    const AlignedSlices slices = k.slices(k.len(args.count, c));
    copyAsync(out + (c * k.ce + slices.begin(me)) * es, slot(c), slices.size(me) * es, s);
    for (int l = 0; l < L; ++l) {
      if (static_cast<size_t>(l) != me) {
        const size_t at = (c * k.ce + slices.begin(static_cast<size_t>(l))) * es;
        dsts.push_back(out + at);
        from.push_back(call->out[static_cast<size_t>(l)] + at);
        sizes.push_back(slices.size(static_cast<size_t>(l)) * es);
      }
    }
  };
  if (mapped && !two_streams) {
    // Every input is ready at the open and nothing is staged: every chunk's
    // reduction in one step, the rail, every chunk's gather in one more.
    mappedStep(ctx, args, s, true, [&] {
      for (size_t c = 0; c < chunks; ++c) {
        reduceMapped(c);
      }
    });
    rail->run(rail->slots, chunks * rail->slot_bytes / es, s);
    for (size_t c = 0; c < chunks; ++c) {
      gatherMapped(c);
    }
    mappedStep(ctx, args, s, false, [&] { copyBatch(ctx, dsts, from, sizes, s); });
    return;
  }
  for (const PlannedStep& step : slicedAllReducePlan(chunks, steps)) {
    const size_t c = step.first;
    const size_t off = c * k.ce;
    const size_t n = k.len(args.count, c);
    const AlignedSlices slices = k.slices(n);
    const size_t b0 = slices.begin(me);
    const size_t mine = slices.size(me);
    switch (step.step) {
      case SliceStep::kReduce:
        if (mapped) {
          mappedStep(ctx, args, s, c == 0, [&] { reduceMapped(c); });
        } else {
          exchange(
              ctx, args, s, c == 0 && how == Opened::kStaged,
              [&] { copyAsync(ctx.ipc->staging(static_cast<int>(me)), in + off * es, n * es, s); },
              [&] {
                for (int l = 0; l < L; ++l) {
                  srcs[static_cast<size_t>(l)] = ctx.ipc->staging(l) + b0 * es;
                }
                reduceSlice(srcs.data(), rail != nullptr ? slot(c) : result + b0 * es, mine);
              });
        }
        if (two_streams) {
          cudaCheck(cudaEventRecord(rail->reduced[c % 2], s), "cudaEventRecord");
        }
        break;
      case SliceStep::kRail:
        if (two_streams) {
          cudaCheck(cudaStreamWaitEvent(rail->stream, rail->reduced[c % 2], 0), "cudaStreamWaitEvent");
          rail->run(slot(c), mine, rail->stream);
          cudaCheck(cudaEventRecord(rail->railed[c % 2], rail->stream), "cudaEventRecord");
        } else {
          // Every slot at once, the padding between slices too (it is never
          // read): the same count on every member of the rail.
          rail->run(rail->slots, step.count * rail->slot_bytes / es, s);
        }
        break;
      case SliceStep::kGather:
        if (two_streams) {
          cudaCheck(cudaStreamWaitEvent(s, rail->railed[c % 2], 0), "cudaStreamWaitEvent");
        }
        if (mapped) {
          dsts.clear();
          from.clear();
          sizes.clear();
          gatherMapped(c);
          mappedStep(ctx, args, s, false, [&] { copyBatch(ctx, dsts, from, sizes, s); });
          break;
        }
        exchange(
            ctx, args, s, false,
            [&] {
              if (rail != nullptr) {
                copyAsync(result + b0 * es, slot(c), mine * es, s);
              }
            },
            [&] {
              std::vector<void*> dsts;
              std::vector<const void*> from;
              std::vector<size_t> sizes;
              for (int l = 0; l < L; ++l) {
                const size_t bl = slices.begin(static_cast<size_t>(l));
                dsts.push_back(out + (off + bl) * es);
                from.push_back(ctx.ipc->staging(l) + k.half + bl * es);
                sizes.push_back(slices.size(static_cast<size_t>(l)) * es);
              }
              copyBatch(ctx, dsts, from, sizes, s);
            });
        break;
    }
  }
}

Opened openNodeCall(
    DeviceContext& ctx,
    const OpArgs& args,
    cudaStream_t s,
    size_t in_bytes,
    size_t out_bytes,
    MappedCall* call) {
  if (ctx.buffers == nullptr) {
    openDeviceCall(ctx, args);
    return Opened::kStaged;
  }
  const int L = ctx.topo.localSize();
  const int me = ctx.topo.myLocalRank();
  using transport::BufferRecord;
  using transport::Unmappable;
  BufferRecord mine[2];
  try {
    if (args.traced_memory) {
      mine[0] = ctx.buffers->describe(args.in, in_bytes, s);
      if (out_bytes > 0) {
        mine[1] = ctx.buffers->describe(args.out, out_bytes, s);
      }
    } else {
      // Peers may map only what is revoked before it is freed: memory
      // whose free nobody announces is not even published.
      mine[0].why = in_bytes == 0 ? Unmappable::kEmpty : Unmappable::kUntraced;
      mine[1].why = out_bytes == 0 ? Unmappable::kEmpty : Unmappable::kUntraced;
    }
  } catch (const Error& e) {
    // The peers would wait in the round below until their timeout.
    const std::string why = str(collectiveName(args.kind), " #", args.seq, " could not describe its tensors for the ",
                                "node's peers: ", e.what(), "; unset SMDDP_CUDA_ZERO_COPY to go through the staging buffers");
    ctx.arena->abort(why);
    SMDDP_THROW(kComm, "rank ", ctx.topo.rank(), ": ", why);
  }
  // The records travel in this rank's arena slot of the call's parity,
  // which the CUDA path uses for nothing else.
  SMDDP_ASSERT(ctx.arena->slotBytes() >= kArenaSlotBytes, "(the arena's slots hold a call's buffer records)");
  std::memcpy(ctx.arena->slot(me, static_cast<uint32_t>(args.seq & 1)), mine, sizeof(mine));
  openDeviceCall(ctx, args);
  if (!ctx.device_sync) {
    // What this rank published is ready where its stream is now.
    cudaCheck(cudaEventRecord(ctx.ipc->ready(me), s), "cudaEventRecord");
  }
  ctx.node->round(args.deadline);
  protocol::verifyCall(*ctx.arena, args);
  std::vector<BufferRecord> recs(static_cast<size_t>(2 * L));
  for (int l = 0; l < L; ++l) {
    std::memcpy(&recs[static_cast<size_t>(2 * l)], ctx.arena->slot(l, static_cast<uint32_t>(args.seq & 1)),
                2 * sizeof(BufferRecord));
    for (int k = 0; k < (out_bytes > 0 ? 2 : 1); ++k) {
      const Unmappable why = recs[static_cast<size_t>(2 * l + k)].why;
      if (why != Unmappable::kMappable) {
        if (why != Unmappable::kEmpty) {
          // Once at info (a user who asked for zero-copy sees why a call
          // was not), then at debug.
          const std::string text = str(collectiveName(args.kind), " #", args.seq, " goes through the staging ",
                                       "buffers: local rank ", l, "'s ", k == 0 ? "input" : "output", " is ",
                                       transport::unmappableName(why));
          if (ctx.told_staged) {
            SMDDP_LOG(kDebug, text);
          } else {
            SMDDP_LOG(kInfo, text);
            ctx.told_staged = true;
          }
        }
        ctx.staged_calls.fetch_add(1, std::memory_order_relaxed);
        return Opened::kChecked;
      }
    }
  }
  call->in.assign(static_cast<size_t>(L), nullptr);
  call->out.assign(out_bytes > 0 ? static_cast<size_t>(L) : 0, nullptr);
  for (int l = 0; l < L; ++l) {
    const size_t i = static_cast<size_t>(l);
    if (l == me) {
      call->in[i] = static_cast<const uint8_t*>(args.in);
      if (out_bytes > 0) {
        call->out[i] = static_cast<uint8_t*>(args.out);
      }
      continue;
    }
    try {
      call->in[i] = ctx.buffers->map(l, recs[2 * i], in_bytes);
      if (out_bytes > 0) {
        call->out[i] = ctx.buffers->map(l, recs[2 * i + 1], out_bytes);
      }
    } catch (const Error& e) {
      // The peers would wait for this rank's steps until their timeout;
      // the abort ends their host waits, and their device waits through
      // the watchdog (CudaCommunicator::asyncError).
      const std::string why =
          str(collectiveName(args.kind), " #", args.seq, " could not map the tensor of local rank ", l, " (rank ",
              ctx.arena->groupRankOf(l), "): ", e.what(), "; unset SMDDP_CUDA_ZERO_COPY to go through the staging buffers");
      ctx.arena->abort(why);
      SMDDP_THROW(kComm, "rank ", ctx.topo.rank(), ": ", why);
    }
  }
  ctx.mapped_calls.fetch_add(1, std::memory_order_relaxed);
  return Opened::kMapped;
}

void mappedStep(DeviceContext& ctx, const OpArgs& args, cudaStream_t s, bool first, const std::function<void()>& consume) {
  if (ctx.device_sync) {
    // No `before`: a mapped step writes no staging buffer, and the peers'
    // reads of this rank's tensors in an earlier step ended with it.
    deviceStep(ctx, Step::kBetween, s);
    consume();
    deviceStep(ctx, Step::kAfter, s);
    // The `before` of a next exchange: every peer's consume is done.
    deviceStep(ctx, Step::kBefore, s);
    return;
  }
  const int me = ctx.topo.myLocalRank();
  if (!first) {
    cudaCheck(cudaEventRecord(ctx.ipc->ready(me), s), "cudaEventRecord");
    ctx.node->round(args.deadline);
  }
  waitPeers(ctx, s, &transport::CudaIpcArena::ready);
  consume();
  cudaCheck(cudaEventRecord(ctx.ipc->done(me), s), "cudaEventRecord");
  ctx.node->round(args.deadline);
  waitPeers(ctx, s, &transport::CudaIpcArena::done);
}

void mappedAllReduce(
    DeviceContext& ctx,
    const OpArgs& args,
    cudaStream_t s,
    const MappedCall& call,
    const std::function<void(const void* const* srcs, uint8_t* result, size_t count)>& reduceSlice) {
  const int L = ctx.topo.localSize();
  const size_t me = static_cast<size_t>(ctx.topo.myLocalRank());
  const size_t es = args.elemSize();
  const AlignedSlices slices{args.count, static_cast<size_t>(L), std::max<size_t>(1, 16 / es)};
  const size_t b0 = slices.begin(me) * es;
  std::vector<const void*> srcs(static_cast<size_t>(L));
  // In place (in == out) too: rank r writes only slice r, which no peer
  // reads in this step, and each element only after reading it.
  mappedStep(ctx, args, s, true, [&] {
    for (size_t l = 0; l < srcs.size(); ++l) {
      srcs[l] = call.in[l] + b0;
    }
    reduceSlice(srcs.data(), call.out[me] + b0, slices.size(me));
  });
  mappedStep(ctx, args, s, false, [&] {
    std::vector<void*> dsts;
    std::vector<const void*> from;
    std::vector<size_t> sizes;
    for (size_t l = 0; l < srcs.size(); ++l) {
      if (l != me) {
        dsts.push_back(call.out[me] + slices.begin(l) * es);
        from.push_back(call.out[l] + slices.begin(l) * es);
        sizes.push_back(slices.size(l) * es);
      }
    }
    copyBatch(ctx, dsts, from, sizes, s);
  });
}

void oneShotAllReduce(
    DeviceContext& ctx,
    const OpArgs& args,
    cudaStream_t s,
    const std::function<void(const void* const* srcs, uint8_t* result, size_t count)>& reduceAll) {
  const int L = ctx.topo.localSize();
  const int me = ctx.topo.myLocalRank();
  const size_t bytes = args.count * args.elemSize();
  SMDDP_ASSERT(bytes <= ctx.ipc->stagingBytes(), "(a one-shot AllReduce must fit the staging buffer)");
  std::vector<const void*> srcs(static_cast<size_t>(L));
  openDeviceCall(ctx, args);
  exchange(
      ctx, args, s, true, [&] { copyAsync(ctx.ipc->staging(me), args.in, bytes, s); },
      [&] {
        for (int l = 0; l < L; ++l) {
          srcs[static_cast<size_t>(l)] = ctx.ipc->staging(l);
        }
        reduceAll(srcs.data(), static_cast<uint8_t*>(args.out), args.count);
      });
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
