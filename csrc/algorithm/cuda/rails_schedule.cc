// Several uniform nodes, a GPU per rank: the hierarchical schedules with the
// rail stage on NCCL (grouped send/recv for AllGather, reduce-scatter /
// all-reduce / broadcast) and the node stage on CUDA IPC. With one rank per
// node the rail is the group: each collective is the NCCL one on the user's
// buffers (PREMUL_SUM's factor still applied by the node stage).
//
//   AllGather:      each rank's block to its rail peers (NCCL), straight to
//                   its place in the output; then the rail's N blocks to
//                   every local peer through the stages (SMDDP_CUDA_PIPELINE:
//                   chunk by chunk, the rail on a stream of its own, so the
//                   two stages overlap)
//   ReduceScatter:  the node reduces every rail member's block (IPC, in
//                   local rank order) into partials; then NCCL reduces the
//                   partials over the rail, member m keeping block m
//                   (SMDDP_CUDA_PIPELINE: each chunk's partials as soon as
//                   the node has them, on the rail's stream)
//   AllReduce:      each rank reduces its slice of every chunk over the
//                   node, all-reduces its slices over the rail (NCCL, one
//                   call), and every rank gathers the node's slices
//                   (SMDDP_CUDA_PIPELINE: a call per chunk on the rail's
//                   stream, while the node reduces the next chunk)
//
// With SMDDP_CUDA_ZERO_COPY the node stage reads the peers' tensors instead
// of their stages; the rail's calls stay those of the staged path, since a
// node whose tensors cannot be mapped stages the call (nodes decide apart):
//   AllGather       after the rail stage (pipelined: after each chunk of
//                   it), rank r copies every peer's rail blocks from the
//                   peer's output into its own
//   ReduceScatter   one launch (pipelined: one per chunk) reduces every rail
//                   member's block of every peer's input into the partials;
//                   the rail as above
//   AllReduce       the staged path's chunks, slices and slots: rank r
//                   reduces its slice of each chunk of every peer's input
//                   into a slot, the rail as above, then rank r copies its
//                   slot into its output and every peer's slice from the
//                   peer's output
#include <algorithm>
#include <optional>

#include "algorithm/cuda/device_reduce.h"
#include "algorithm/cuda/schedules.h"
#include "algorithm/device_plan.h"
#include "algorithm/reduce_ops.h"
#include "algorithm/ring.h"
#include "common/error.h"

namespace smddp::algorithm::cuda {

using transport::cudaCheck;

namespace {

ncclDataType_t ncclTypeOf(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat64:
    case DataType::kInt8:
    case DataType::kUInt8:
    case DataType::kInt32:
    case DataType::kInt64:
    case DataType::kBool:
    case DataType::kCount:
      break;
  }
  SMDDP_THROW(kInvalidArgument, "no NCCL reduction of ", dataTypeName(t), " on the CUDA path");
}

// How partial results combine across nodes. The node stage has applied
// PREMUL_SUM's factor, AVG divides once at the end: both are sums here.
ncclRedOp_t ncclOpOf(ReduceOp op) {
  switch (ops::traitsOf(op).combine) {
    case ops::Combine::kSum:
      return ncclSum;
    case ops::Combine::kProduct:
      return ncclProd;
    case ops::Combine::kMin:
      return ncclMin;
    case ops::Combine::kMax:
      return ncclMax;
  }
  SMDDP_THROW(kInternal, "no NCCL operation for ", reduceOpName(op));
}

class RailsSchedule : public Schedule {
 public:
  explicit RailsSchedule(DeviceContext& ctx)
      : ctx_(ctx),
        partials_(*ctx.memory, GrowingBuffer::Kind::kDevice),
        gathered_(*ctx.memory, GrowingBuffer::Kind::kDevice),
        one_per_node_(ctx.topo.localSize() == 1) {
    // The topology numbers nodes by their first rank, so with one rank per
    // node rail member m is group rank m: NCCL's layouts of AllGather and
    // ReduceScatter blocks are then the group's.
    for (size_t m = 0; one_per_node_ && m < ctx.rail_ranks.size(); ++m) {
      SMDDP_ASSERT(ctx.rail_ranks[m] == static_cast<int>(m), "(one rank per node, rail member ", m, " is rank ",
                   ctx.rail_ranks[m], ")");
    }
  }

  ~RailsSchedule() override {
    // The scratch first: its blocks go back to the allocator while the
    // stream they were last used on still exists.
    partials_.free();
    gathered_.free();
    // Work still enqueued keeps what it uses: destroying a stream or an
    // event does not wait for it.
    for (cudaEvent_t e : chunk_events_) {
      cudaEventDestroy(e);
    }
    if (rail_stream_ != nullptr) {
      cudaStreamDestroy(rail_stream_);
    }
  }

  // SMDDP_CUDA_PIPELINE: the rail stage chunk by chunk on a stream of its
  // own (chunk c of every member's block, a group of send/recv each), an
  // event after each; the node stage's chunk c waits on the collective's
  // stream for chunk c's event only. The collective's stream has waited for
  // every event when the call returns, so the rail stream's work is part of
  // the call.
  void allGather(const OpArgs& args, cudaStream_t s) override {
    if (one_per_node_) {
      // One rank per node: the rail is the group, NCCL on the user's buffers.
      const size_t b = args.count * args.elemSize();
      openDeviceCall(ctx_, args);
      ctx_.rail->run("the rail AllGather (one rank per node)", args.deadline, [&](ncclComm_t comm) {
        return ncclAllGather(args.in, args.out, b, ncclUint8, comm, s);
      });
      return;
    }
    const int N = ctx_.topo.numNodes();
    const int L = ctx_.topo.localSize();
    const int me = ctx_.topo.myLocalRank();
    const size_t b = args.count * args.elemSize();
    auto* out = static_cast<uint8_t*>(args.out);
    const auto* in = static_cast<const uint8_t*>(args.in);
    MappedCall call;
    const Opened how = openNodeCall(ctx_, args, s, b, static_cast<size_t>(ctx_.topo.size()) * b, &call);
    const bool mapped = how == Opened::kMapped;
    const bool pipelined = ctx_.config.cuda_pipeline;
    // Chunks of a stage's share. A mapped call has no stage to fit, but its
    // rail's calls must be those of a node that stages the call (nodes
    // decide apart): one rail call unpipelined, as a staged node's; the
    // staged chunks pipelined.
    const size_t staged = std::max<size_t>(1, ctx_.ipc->stagingBytes() / static_cast<size_t>(N));
    const size_t cb = mapped && !pipelined ? std::max<size_t>(1, b) : staged;
    const size_t chunks = chunkCount(b, cb);
    std::optional<StreamJoin> join;
    if (pipelined) {
      reserveEvents(chunks + 2);
      // The rail stream starts after what the caller enqueued before the call.
      cudaCheck(cudaEventRecord(chunk_events_[0], s), "cudaEventRecord");
      cudaCheck(cudaStreamWaitEvent(railStream(), chunk_events_[0], 0), "cudaStreamWaitEvent");
      join.emplace(s, railStream(), chunk_events_[chunks + 1]);
    }
    copyAsync(out + static_cast<size_t>(ctx_.topo.rank()) * b, in, b, s);
    // Rails: every member's block straight to its place in the output.
    if (!pipelined) {
      railGather(args, 0, b, s);
    }
    for (size_t c = 0; pipelined && c < chunks; ++c) {
      railGather(args, c * cb, chunkLen(b, cb, c), railStream());
      cudaCheck(cudaEventRecord(chunk_events_[c + 1], railStream()), "cudaEventRecord");
    }
    // Node: my rail's N blocks to every local peer, through the stages, or
    // (mapped) every peer's rail's blocks from the peer's output.
    for (size_t c = 0; c < chunks; ++c) {
      const size_t off = c * cb;
      const size_t len = chunkLen(b, cb, c);
      if (pipelined) {
        cudaCheck(cudaStreamWaitEvent(s, chunk_events_[c + 1], 0), "cudaStreamWaitEvent");
      }
      if (mapped) {
        // Not `first`: the peers' outputs hold their rails' chunks only now.
        mappedStep(ctx_, args, s, false, [&] {
          for (int k = 1; k < L; ++k) {
            const int l = (me + k) % L;
            const std::vector<size_t> at = railOffsets(l, b);
            copyBlocks(out + off, at, call.out[static_cast<size_t>(l)] + off, at, len, s);
          }
        });
        continue;
      }
      exchange(
          ctx_, args, s, c == 0 && how == Opened::kStaged,
          [&] {
            // My rail's N blocks, one strided copy where they lie evenly.
            copyBlocks(ctx_.ipc->staging(me), slots(N, cb), out + off, railOffsets(me, b), len, s);
          },
          [&] {
            for (int k = 1; k < L; ++k) {
              const int l = (me + k) % L;
              copyBlocks(out + off, railOffsets(l, b), ctx_.ipc->staging(l), slots(N, cb), len, s);
            }
          });
    }
    if (join) {
      join->join();  // checked, unlike the join on the way out of an error
    }
  }

  void reduceScatter(const OpArgs& args, cudaStream_t s) override {
    if (one_per_node_ && direct(args)) {
      openDeviceCall(ctx_, args);
      ctx_.rail->run("the rail ReduceScatter (one rank per node)", args.deadline, [&](ncclComm_t comm) {
        return ncclReduceScatter(args.in, args.out, args.count, ncclTypeOf(args.dtype()), ncclOpOf(args.reduce.op),
                                 comm, s);
      });
      launchFinalize(args.reduce, args.out, args.count, Sources::kPartials, ctx_.config.cuda_reduce_blocks, s);
      return;
    }
    const int N = ctx_.topo.numNodes();
    const int L = ctx_.topo.localSize();
    const int world = ctx_.topo.size();
    const size_t es = args.elemSize();
    const size_t b = args.count * es;
    const auto* in = static_cast<const uint8_t*>(args.in);
    uint8_t* partials = partials_.reserve(static_cast<size_t>(N) * b, s);
    std::vector<const void*> srcs(static_cast<size_t>(L));
    const ncclDataType_t type = ncclTypeOf(args.dtype());
    const ncclRedOp_t op = ncclOpOf(args.reduce.op);
    MappedCall call;
    const Opened how = openNodeCall(ctx_, args, s, static_cast<size_t>(world) * b, 0, &call);
    const bool mapped = how == Opened::kMapped;
    // SMDDP_CUDA_PIPELINE: the partials chunk-major (chunk c of every
    // member's block side by side), each chunk reduce-scattered over the rail
    // on the rail's stream as soon as the node has reduced it.
    const bool pipelined = ctx_.config.cuda_pipeline;
    // Chunks of what fits a stage; a mapped call's as a staged node's (its
    // rail's calls must match theirs): one launch unpipelined, the same
    // partials and one rail call; pipelined, the staged chunks.
    // A whole number of 16-byte vectors where that fits, so that every rail
    // member's block of a stage starts aligned and the kernel reads vectors.
    const size_t align = std::max<size_t>(1, 16 / es);
    const size_t fits = std::max<size_t>(1, ctx_.ipc->stagingBytes() / (static_cast<size_t>(world) * es));
    const size_t staged = fits >= align ? fits / align * align : fits;
    const size_t ce = mapped && !pipelined ? std::max<size_t>(1, args.count) : staged;
    const size_t chunks = chunkCount(args.count, ce);
    std::optional<StreamJoin> join;
    if (pipelined) {
      reserveEvents(chunks + 1);
      join.emplace(s, railStream(), chunk_events_[chunks]);
    }
    // The node's partial of every rail member's block of chunk c, in one
    // launch: segment m reads block rail_ranks[m] of every source, the
    // blocks `pitch` bytes apart there.
    std::vector<size_t> offsets(static_cast<size_t>(N));
    auto reduceChunk = [&](size_t c, size_t pitch) {
      const size_t off = c * ce;
      const size_t len = chunkLen(args.count, ce, c);
      for (int m = 0; m < N; ++m) {
        offsets[static_cast<size_t>(m)] = static_cast<size_t>(ctx_.rail_ranks[static_cast<size_t>(m)]) * pitch;
      }
      uint8_t* dst = pipelined ? partials + static_cast<size_t>(N) * off * es : partials + off * es;
      launchReduceSegments(args.reduce, dst, pipelined ? len * es : b, srcs.data(), L, offsets.data(), N, len,
                           Sources::kInputs, Result::kPartial, ctx_.config.cuda_reduce_blocks, s);
    };
    // Pipelined: chunk c's partials over the rail on the rail's stream.
    auto railChunk = [&](size_t c) {
      const size_t off = c * ce;
      cudaStream_t r = railStream();
      cudaCheck(cudaEventRecord(chunk_events_[c], s), "cudaEventRecord");
      cudaCheck(cudaStreamWaitEvent(r, chunk_events_[c], 0), "cudaStreamWaitEvent");
      ctx_.rail->run("the rail ReduceScatter (pipelined)", args.deadline, [&](ncclComm_t comm) {
        return ncclReduceScatter(partials + static_cast<size_t>(N) * off * es,
                                 static_cast<uint8_t*>(args.out) + off * es, chunkLen(args.count, ce, c), type, op,
                                 comm, r);
      });
    };
    if (mapped) {
      // Every peer's input as it is (the staged path's partials, so its bits).
      mappedStep(ctx_, args, s, true, [&] {
        for (size_t c = 0; c < chunks; ++c) {
          for (int l = 0; l < L; ++l) {
            srcs[static_cast<size_t>(l)] = call.in[static_cast<size_t>(l)] + c * ce * es;
          }
          reduceChunk(c, b);
          if (pipelined) {
            railChunk(c);
          }
        }
      });
    }
    for (size_t c = 0; !mapped && c < chunks; ++c) {
      exchange(
          ctx_, args, s, c == 0 && how == Opened::kStaged,
          [&] {
            copyRows(ctx_, ctx_.ipc->staging(ctx_.topo.myLocalRank()), ce * es, in + c * ce * es, b,
                     chunkLen(args.count, ce, c) * es, static_cast<size_t>(world), s);
          },
          [&] {
            for (int l = 0; l < L; ++l) {
              srcs[static_cast<size_t>(l)] = ctx_.ipc->staging(l);
            }
            reduceChunk(c, ce * es);
          });
      if (pipelined) {
        railChunk(c);
      }
    }
    if (pipelined) {
      join->join();
    } else {
      // Rail: reduce-scatter of the partials (member m's block is m's output).
      ctx_.rail->run("the rail ReduceScatter", args.deadline, [&](ncclComm_t comm) {
        return ncclReduceScatter(partials, args.out, args.count, type, op, comm, s);
      });
    }
    launchFinalize(args.reduce, args.out, args.count, Sources::kPartials, ctx_.config.cuda_reduce_blocks, s);
  }

  // The node's reduction of every chunk's slice into a slot of this rank's
  // own memory, the rail's AllReduce over all the slots at once (its
  // latency paid once per call, not once per chunk), then the node's gather
  // of every slot. SMDDP_CUDA_PIPELINE: each chunk's slot all-reduced over
  // the rail on the rail's stream (two slots), so that chunk c is on the
  // network while chunk c+1 is reduced over the node.
  void allReduce(const OpArgs& args, cudaStream_t s) override {
    const int L = ctx_.topo.localSize();
    const ncclDataType_t type = ncclTypeOf(args.dtype());
    const ncclRedOp_t op = ncclOpOf(args.reduce.op);
    if (one_per_node_ && direct(args)) {
      openDeviceCall(ctx_, args);
      ctx_.rail->run("the rail AllReduce (one rank per node)", args.deadline, [&](ncclComm_t comm) {
        return ncclAllReduce(args.in, args.out, args.count, type, op, comm, s);
      });
      launchFinalize(args.reduce, args.out, args.count, Sources::kPartials, ctx_.config.cuda_reduce_blocks, s);
      return;
    }
    // Rail: slices over the nodes, then AVG's division.
    auto railAllReduce = [&](uint8_t* slices, size_t count, cudaStream_t st) {
      ctx_.rail->run("the rail AllReduce", args.deadline, [&](ncclComm_t comm) {
        return ncclAllReduce(slices, slices, count, type, op, comm, st);
      });
      launchFinalize(args.reduce, slices, count, Sources::kPartials, ctx_.config.cuda_reduce_blocks, st);
    };
    const size_t bytes = args.count * args.elemSize();
    MappedCall call;
    const Opened how = openNodeCall(ctx_, args, s, bytes, bytes, &call);
    auto reduceSlice = [&](const void* const* srcs, uint8_t* result, size_t count) {
      launchReduce(args.reduce, result, srcs, L, count, Sources::kInputs, Result::kPartial,
                   ctx_.config.cuda_reduce_blocks, s);
    };
    const bool pipelined = ctx_.config.cuda_pipeline;
    SliceRail rail;
    rail.steps = pipelined ? RailSteps::kPerChunk : RailSteps::kWhole;
    // Slots 256-byte aligned, as the allocator's are: the kernel reads
    // vectors, and every element count is whole.
    rail.slot_bytes = (slicedAllReduceSliceBytes(ctx_, args) + 255) / 256 * 256;
    rail.slots = partials_.reserve((pipelined ? 2 : slicedAllReduceChunks(ctx_, args)) * rail.slot_bytes, s);
    if (pipelined) {
      reserveEvents(5);
      rail.stream = railStream();
      rail.reduced[0] = chunk_events_[0];
      rail.reduced[1] = chunk_events_[1];
      rail.railed[0] = chunk_events_[2];
      rail.railed[1] = chunk_events_[3];
      rail.joined = chunk_events_[4];
    }
    rail.run = railAllReduce;
    // Mapped too: the staged path's slices and rail steps (a node that
    // stages the call reduces and sends the same elements), without the
    // staging copies.
    slicedAllReduce(ctx_, args, s, reduceSlice, how, &rail, how == Opened::kMapped ? &call : nullptr);
  }

  void broadcast(const OpArgs& args, cudaStream_t s) override {
    const int root_node = ctx_.topo.nodeOf(args.root);
    const int root_local = ctx_.topo.localRankOf(args.root);
    const size_t b = args.count * args.elemSize();
    auto* out = static_cast<uint8_t*>(args.out);
    if (ctx_.topo.rank() == args.root) {
      copyAsync(out, args.in, b, s);
    }
    if (ctx_.topo.myLocalRank() == root_local) {
      ctx_.rail->run("the rail Broadcast", args.deadline, [&](ncclComm_t comm) {
        return ncclBroadcast(out, out, b, ncclUint8, root_node, comm, s);
      });
    }
    if (one_per_node_) {
      openDeviceCall(ctx_, args);
      return;
    }
    OpArgs a = args;
    a.in = out;
    a.root = root_local;
    nodeBroadcast(ctx_, a, s);
  }

 private:
  // Bytes [off, off + len) of this rank's block to every rail member, and of
  // theirs into their places in the output, on `st`: one group of send/recv
  // straight into the output, or (SMDDP_CUDA_RAIL_ALLGATHER=nccl)
  // ncclAllGather into a buffer of this rank's own, rail member m's bytes at
  // m * len, and one copy of them to their places.
  void railGather(const OpArgs& args, size_t off, size_t len, cudaStream_t st) {
    const int N = ctx_.topo.numNodes();
    const int n = ctx_.topo.myNode();
    const size_t b = args.count * args.elemSize();
    const auto* in = static_cast<const uint8_t*>(args.in) + off;
    auto* out = static_cast<uint8_t*>(args.out) + off;
    if (ctx_.config.cuda_rail_allgather == "nccl") {
      uint8_t* gathered = gathered_.reserve(static_cast<size_t>(N) * len, st);
      ctx_.rail->run("the rail AllGather (ncclAllGather)", args.deadline, [&](ncclComm_t comm) {
        return ncclAllGather(in, gathered, len, ncclUint8, comm, st);
      });
      // Every other member's bytes to their places (my own block is there
      // already: the call's first copy): one strided copy on either side of
      // mine where the blocks lie evenly, else one copy per member.
      const std::vector<size_t> offsets = railOffsets(ctx_.topo.myLocalRank(), b);
      size_t stride = 0;
      if (evenlySpaced(offsets, &stride)) {
        const size_t me = static_cast<size_t>(n);
        copyRows(ctx_, out + offsets[0], stride, gathered, len, len, me, st);
        if (me + 1 < offsets.size()) {
          copyRows(ctx_, out + offsets[me + 1], stride, gathered + (me + 1) * len, len, len, offsets.size() - me - 1,
                   st);
        }
        return;
      }
      std::vector<void*> dsts;
      std::vector<const void*> srcs;
      for (int m = 0; m < N; ++m) {
        if (m != n) {
          dsts.push_back(out + offsets[static_cast<size_t>(m)]);
          srcs.push_back(gathered + static_cast<size_t>(m) * len);
        }
      }
      copyBatch(ctx_, dsts, srcs, std::vector<size_t>(dsts.size(), len), st);
      return;
    }
    ctx_.rail->run("the rail AllGather (send/recv)", args.deadline, [&](ncclComm_t comm) {
      ncclResult_t r = ncclGroupStart();
      for (int m = 0; m < N && (r == ncclSuccess || r == ncclInProgress); ++m) {
        if (m != n) {
          r = ncclSend(in, len, ncclUint8, m, comm, st);
          if (r == ncclSuccess || r == ncclInProgress) {
            r = ncclRecv(out + static_cast<size_t>(ctx_.rail_ranks[static_cast<size_t>(m)]) * b, len, ncclUint8, m,
                         comm, st);
          }
        }
      }
      const ncclResult_t end = ncclGroupEnd();
      return r == ncclSuccess || r == ncclInProgress ? end : r;
    });
  }

  // Whether a reduction needs nothing of the node stage with one rank per
  // node: every op but those that scale their inputs (PREMUL_SUM), whose
  // factor the node stage applies to each input, so that the bits are the
  // node stage's on every path.
  static bool direct(const OpArgs& args) {
    return !ops::traitsOf(args.reduce.op).scales_inputs;
  }

  // At the collective's own stream's priority: a rail's kernels scheduled
  // behind the caller's compute would hold up every member of the rail.
  cudaStream_t railStream() {
    if (rail_stream_ == nullptr) {
      int least = 0;
      int greatest = 0;
      cudaCheck(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
      cudaCheck(cudaStreamCreateWithPriority(&rail_stream_, cudaStreamNonBlocking, greatest),
                "cudaStreamCreateWithPriority");
    }
    return rail_stream_;
  }

  void reserveEvents(size_t n) {
    while (chunk_events_.size() < n) {
      cudaEvent_t e = nullptr;
      cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      chunk_events_.push_back(e);
    }
  }

  // Where local rank l's block of every node starts in an AllGather's
  // output (node m's: group rank nodeRanks(m)[l]).
  std::vector<size_t> railOffsets(int l, size_t b) const {
    std::vector<size_t> out;
    for (int m = 0; m < ctx_.topo.numNodes(); ++m) {
      out.push_back(static_cast<size_t>(ctx_.topo.nodeRanks(m)[static_cast<size_t>(l)]) * b);
    }
    return out;
  }

  // Offsets 0, slot, 2 * slot, ...: the slots of a stage.
  static std::vector<size_t> slots(int n, size_t slot) {
    std::vector<size_t> out;
    for (int m = 0; m < n; ++m) {
      out.push_back(static_cast<size_t>(m) * slot);
    }
    return out;
  }

  // `len` bytes from src + src_at[m] to dst + dst_at[m] for every m: one
  // strided copy where both lie evenly (contiguous node ranks; a stage's
  // slots always do), else a batch of one copy per block.
  void copyBlocks(uint8_t* dst, const std::vector<size_t>& dst_at, const uint8_t* src,
                  const std::vector<size_t>& src_at, size_t len, cudaStream_t s) {
    size_t dpitch = 0;
    size_t spitch = 0;
    if (evenlySpaced(dst_at, &dpitch) && evenlySpaced(src_at, &spitch)) {
      copyRows(ctx_, dst + dst_at[0], dpitch, src + src_at[0], spitch, len, dst_at.size(), s);
      return;
    }
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    for (size_t m = 0; m < dst_at.size(); ++m) {
      dsts.push_back(dst + dst_at[m]);
      srcs.push_back(src + src_at[m]);
    }
    copyBatch(ctx_, dsts, srcs, std::vector<size_t>(dst_at.size(), len), s);
  }

  DeviceContext& ctx_;
  GrowingBuffer partials_;
  // SMDDP_CUDA_RAIL_ALLGATHER=nccl: what ncclAllGather gathers over the rail.
  GrowingBuffer gathered_;
  // One rank per node (a DeviceMesh's replicate dimension, say): the rail
  // is the whole group, and its collectives run on the user's buffers.
  bool one_per_node_ = false;
  // SMDDP_CUDA_PIPELINE: the rail stage's stream, and an event per chunk
  // (reused by later calls: a wait takes the event's state when enqueued).
  cudaStream_t rail_stream_ = nullptr;
  std::vector<cudaEvent_t> chunk_events_;
};

} // namespace

std::unique_ptr<Schedule> makeRailsSchedule(DeviceContext& ctx) {
  return std::make_unique<RailsSchedule>(ctx);
}

} // namespace smddp::algorithm::cuda
