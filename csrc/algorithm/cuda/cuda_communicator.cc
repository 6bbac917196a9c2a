#include "algorithm/cuda/cuda_communicator.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "algorithm/cuda/device_reduce.h"
#include "algorithm/ring.h"
#include "common/error.h"
#include "common/log.h"

namespace smddp::algorithm::cuda {

using transport::cudaCheck;
using transport::ncclCheck;

namespace {

constexpr uint8_t kDevicePath = 2;

ncclDataType_t ncclTypeOf(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    default:
      SMDDP_THROW(kInvalidArgument, "no NCCL type for ", dataTypeName(t));
  }
}

// Sums (SUM, AVG, PREMUL_SUM with the factor applied in the node stage) go
// to NCCL as sums; AVG divides once at the end.
ncclRedOp_t ncclOpOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::kProduct:
      return ncclProd;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    default:
      return ncclSum;
  }
}

void copyAsync(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  if (bytes > 0 && dst != src) {
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
  }
}

std::string busId(int device) {
  char id[64] = {0};
  cudaCheck(cudaDeviceGetPCIBusId(id, sizeof(id), device), "cudaDeviceGetPCIBusId");
  return id;
}

} // namespace

CudaCommunicator::CudaCommunicator(
    Store& store,
    const topology::Topology& topology,
    const Config& config,
    std::chrono::milliseconds timeout,
    int device,
    Communicator* host)
    : topo_(topology), config_(config), device_(device), host_comm_(host) {
  cudaCheck(cudaSetDevice(device_), "cudaSetDevice");
  // Which GPU each rank drives decides how nodes talk: NCCL needs one each.
  auto ids = storeAllGather(
      store, "smddp/cuda/bus", topo_.rank(), topo_.size(),
      toBytes(str(topology::hostIdentity(), "/", busId(device_))));
  std::set<std::string> distinct;
  for (auto& id : ids) {
    distinct.insert(toString(id));
  }
  const bool own_gpu = distinct.size() == static_cast<size_t>(topo_.size());
  if (topo_.numNodes() == 1) {
    mode_ = Mode::kNode;
  } else if (topo_.uniform() && config_.cuda_inter_node != "host" && own_gpu) {
    mode_ = Mode::kRails;
  } else {
    if (config_.cuda_inter_node == "nccl" && topo_.rank() == 0) {
      SMDDP_LOG(kWarn, "SMDDP_CUDA_INTER_NODE=nccl needs a GPU per rank and a uniform topology; "
                       "staging CUDA collectives through host memory instead");
    }
    mode_ = Mode::kHostStaging;
  }
  if (mode_ == Mode::kHostStaging) {
    SMDDP_CHECK_ARG(host_comm_ != nullptr, "CUDA collectives across nodes need the CPU communicator");
    return;
  }
  transport::NodeArena::Options o;
  o.slot_bytes = 4096;
  o.wait = waitPolicyOf(config_);
  o.timeout = timeout;
  arena_ = std::make_unique<transport::NodeArena>(
      store, str("smddp/cuda/arena/", topo_.myNode()), topo_.myLocalRank(), topo_.nodeRanks(topo_.myNode()), o);
  host_ = std::make_unique<NodeCollectives>(*arena_, config_);
  ipc_ = std::make_unique<transport::CudaIpcArena>(
      store, str("smddp/cuda/ipc/", topo_.myNode()), topo_.myLocalRank(), topo_.localSize(), device_,
      config_.cuda_staging_bytes);
  if (mode_ == Mode::kRails) {
    rail_ranks_ = topo_.railRanks(topo_.myLocalRank());
    rail_ = std::make_unique<transport::NcclRail>(
        store, str("smddp/cuda/rail/", topo_.myLocalRank()), topo_.myNode(), topo_.numNodes(), device_);
  }
}

CudaCommunicator::~CudaCommunicator() {
  cudaSetDevice(device_);
  if (scratch_ != nullptr) {
    cudaFree(scratch_);
  }
  if (pinned_in_ != nullptr) {
    cudaFreeHost(pinned_in_);
  }
  if (pinned_out_ != nullptr) {
    cudaFreeHost(pinned_out_);
  }
}

std::string CudaCommunicator::describe() const {
  switch (mode_) {
    case Mode::kNode:
      return str("cuda ipc, ", topo_.describe());
    case Mode::kRails:
      return str("cuda ipc in nodes, nccl rails, ", topo_.describe());
    default:
      return str("cuda staged through host memory, ", topo_.describe());
  }
}

bool CudaCommunicator::supportsReduce(DataType dtype, ReduceOp op) const {
  return deviceReduceSupported(dtype, op);
}

void CudaCommunicator::abort(const std::string& why) {
  if (arena_) {
    arena_->abort(why);
  }
  if (rail_) {
    rail_->abort();
  }
}

uint8_t* CudaCommunicator::deviceScratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    if (scratch_ != nullptr) {
      cudaCheck(cudaFree(scratch_), "cudaFree");
      scratch_ = nullptr;
    }
    cudaCheck(cudaMalloc(reinterpret_cast<void**>(&scratch_), bytes), "cudaMalloc of scratch");
    scratch_bytes_ = bytes;
  }
  return scratch_;
}

void CudaCommunicator::begin(const OpArgs& args) {
  host_->openCall(args, static_cast<NodeCollectives::Path>(kDevicePath));
}

void CudaCommunicator::exchange(
    const OpArgs& args,
    cudaStream_t s,
    bool first,
    const std::function<void()>& fill,
    const std::function<void()>& consume) {
  const int L = topo_.localSize();
  const int me = topo_.myLocalRank();
  // The peers' "done" of the previous exchange: they have read this stage.
  for (int l = 0; l < L; ++l) {
    if (l != me) {
      cudaCheck(cudaStreamWaitEvent(s, ipc_->done(l), 0), "cudaStreamWaitEvent");
    }
  }
  fill();
  cudaCheck(cudaEventRecord(ipc_->ready(me), s), "cudaEventRecord");
  host_->round(args.deadline);
  if (first) {
    host_->verifyDescs(args);
  }
  for (int l = 0; l < L; ++l) {
    if (l != me) {
      cudaCheck(cudaStreamWaitEvent(s, ipc_->ready(l), 0), "cudaStreamWaitEvent");
    }
  }
  consume();
  cudaCheck(cudaEventRecord(ipc_->done(me), s), "cudaEventRecord");
  host_->round(args.deadline);
}

// ------------------------------------------------------------ dispatch

void CudaCommunicator::allGather(const OpArgs& args, cudaStream_t s) {
  cudaCheck(cudaSetDevice(device_), "cudaSetDevice");
  switch (mode_) {
    case Mode::kNode:
      return nodeAllGather(args, s);
    case Mode::kRails:
      return railsAllGather(args, s);
    default:
      return staged(args, s);
  }
}

void CudaCommunicator::reduceScatter(const OpArgs& args, cudaStream_t s) {
  cudaCheck(cudaSetDevice(device_), "cudaSetDevice");
  switch (mode_) {
    case Mode::kNode:
      return nodeReduceScatter(args, s);
    case Mode::kRails:
      return railsReduceScatter(args, s);
    default:
      return staged(args, s);
  }
}

void CudaCommunicator::allReduce(const OpArgs& args, cudaStream_t s) {
  cudaCheck(cudaSetDevice(device_), "cudaSetDevice");
  switch (mode_) {
    case Mode::kNode:
      return nodeAllReduce(args, s);
    case Mode::kRails:
      return railsAllReduce(args, s);
    default:
      return staged(args, s);
  }
}

void CudaCommunicator::broadcast(const OpArgs& args, cudaStream_t s) {
  cudaCheck(cudaSetDevice(device_), "cudaSetDevice");
  switch (mode_) {
    case Mode::kNode: {
      OpArgs a = args;
      a.root = topo_.localRankOf(args.root);
      return nodeBroadcast(a, s);
    }
    case Mode::kRails:
      return railsBroadcast(args, s);
    default:
      return staged(args, s);
  }
}

// ------------------------------------------------------------ one node

void CudaCommunicator::nodeAllGather(const OpArgs& args, cudaStream_t s) {
  const int L = topo_.localSize();
  const int me = topo_.myLocalRank();
  const size_t b = args.count * args.elemSize();
  const size_t S = ipc_->stagingBytes();
  auto* out = static_cast<uint8_t*>(args.out);
  const auto* in = static_cast<const uint8_t*>(args.in);
  begin(args);
  copyAsync(out + static_cast<size_t>(me) * b, in, b, s);
  const size_t chunks = std::max<size_t>(1, ceilDiv(b, S));
  for (size_t c = 0; c < chunks; ++c) {
    const size_t off = c * S;
    const size_t n = std::min(S, b - std::min(b, off));
    exchange(
        args, s, c == 0, [&] { copyAsync(ipc_->staging(me), in + off, n, s); },
        [&] {
          for (int k = 1; k < L; ++k) {
            const int l = (me + k) % L;
            copyAsync(out + static_cast<size_t>(l) * b + off, ipc_->staging(l), n, s);
          }
        });
  }
}

void CudaCommunicator::nodeReduceScatter(const OpArgs& args, cudaStream_t s) {
  const int L = topo_.localSize();
  const int me = topo_.myLocalRank();
  const size_t es = args.elemSize();
  const size_t ce = std::max<size_t>(1, ipc_->stagingBytes() / (static_cast<size_t>(L) * es));
  const auto* in = static_cast<const uint8_t*>(args.in);
  auto* out = static_cast<uint8_t*>(args.out);
  std::vector<const void*> srcs(static_cast<size_t>(L));
  begin(args);
  const size_t chunks = std::max<size_t>(1, ceilDiv(args.count, ce));
  for (size_t c = 0; c < chunks; ++c) {
    const size_t off = c * ce;
    const size_t n = std::min(ce, args.count - std::min(args.count, off));
    exchange(
        args, s, c == 0,
        [&] {
          if (n > 0) {
            cudaCheck(
                cudaMemcpy2DAsync(
                    ipc_->staging(me), ce * es, in + off * es, args.count * es, n * es, static_cast<size_t>(L),
                    cudaMemcpyDeviceToDevice, s),
                "cudaMemcpy2DAsync");
          }
        },
        [&] {
          for (int l = 0; l < L; ++l) {
            srcs[static_cast<size_t>(l)] = ipc_->staging(l) + static_cast<size_t>(me) * ce * es;
          }
          cudaCheck(
              launchReduce(args.reduce, out + off * es, srcs.data(), L, n, true, true, config_.cuda_reduce_blocks, s),
              "reduction kernel");
        });
  }
}

void CudaCommunicator::nodeAllReduce(const OpArgs& args, cudaStream_t s) {
  const int L = topo_.localSize();
  const int me = topo_.myLocalRank();
  const size_t es = args.elemSize();
  const size_t half = ipc_->stagingBytes() / 2 / 16 * 16;
  const size_t ce = std::max<size_t>(1, half / es);
  const auto* in = static_cast<const uint8_t*>(args.in);
  auto* out = static_cast<uint8_t*>(args.out);
  std::vector<const void*> srcs(static_cast<size_t>(L));
  begin(args);
  const size_t chunks = std::max<size_t>(1, ceilDiv(args.count, ce));
  for (size_t c = 0; c < chunks; ++c) {
    const size_t off = c * ce;
    const size_t n = std::min(ce, args.count - std::min(args.count, off));
    const Slices slices{n, static_cast<size_t>(L)};
    const size_t b0 = slices.begin(static_cast<size_t>(me));
    // Reduce my slice of the chunk from every stage into my result half.
    exchange(
        args, s, c == 0, [&] { copyAsync(ipc_->staging(me), in + off * es, n * es, s); },
        [&] {
          for (int l = 0; l < L; ++l) {
            srcs[static_cast<size_t>(l)] = ipc_->staging(l) + b0 * es;
          }
          cudaCheck(
              launchReduce(
                  args.reduce, ipc_->staging(me) + half + b0 * es, srcs.data(), L, slices.size(static_cast<size_t>(me)),
                  true, true, config_.cuda_reduce_blocks, s),
              "reduction kernel");
        });
    // Gather every rank's reduced slice.
    exchange(
        args, s, false, [] {},
        [&] {
          for (int l = 0; l < L; ++l) {
            const size_t bl = slices.begin(static_cast<size_t>(l));
            copyAsync(out + (off + bl) * es, ipc_->staging(l) + half + bl * es, slices.size(static_cast<size_t>(l)) * es, s);
          }
        });
  }
}

void CudaCommunicator::nodeBroadcast(const OpArgs& args, cudaStream_t s) {
  const int me = topo_.myLocalRank();
  const size_t b = args.count * args.elemSize();
  const size_t S = ipc_->stagingBytes();
  const auto* in = static_cast<const uint8_t*>(args.in);
  auto* out = static_cast<uint8_t*>(args.out);
  begin(args);
  const size_t chunks = std::max<size_t>(1, ceilDiv(b, S));
  for (size_t c = 0; c < chunks; ++c) {
    const size_t off = c * S;
    const size_t n = std::min(S, b - std::min(b, off));
    exchange(
        args, s, c == 0,
        [&] {
          if (me == args.root) {
            copyAsync(ipc_->staging(me), in + off, n, s);
          }
        },
        [&] {
          if (me == args.root) {
            copyAsync(out + off, in + off, n, s);
          } else {
            copyAsync(out + off, ipc_->staging(args.root), n, s);
          }
        });
  }
}

// ------------------------------------------------------------ NCCL rails

void CudaCommunicator::railsAllGather(const OpArgs& args, cudaStream_t s) {
  const int N = topo_.numNodes();
  const int L = topo_.localSize();
  const int n = topo_.myNode();
  const int me = topo_.myLocalRank();
  const size_t b = args.count * args.elemSize();
  auto* out = static_cast<uint8_t*>(args.out);
  const auto* in = static_cast<const uint8_t*>(args.in);
  begin(args);
  copyAsync(out + static_cast<size_t>(topo_.rank()) * b, in, b, s);
  // Rails: every member's block straight to its place in the output.
  ncclCheck(ncclGroupStart(), "ncclGroupStart");
  for (int m = 0; m < N; ++m) {
    if (m != n) {
      ncclCheck(ncclSend(in, b, ncclUint8, m, rail_->comm(), s), "ncclSend");
      ncclCheck(ncclRecv(out + static_cast<size_t>(rail_ranks_[m]) * b, b, ncclUint8, m, rail_->comm(), s), "ncclRecv");
    }
  }
  ncclCheck(ncclGroupEnd(), "ncclGroupEnd");
  // Node: my rail's N blocks to every local peer, through the stages.
  const size_t cb = std::max<size_t>(1, ipc_->stagingBytes() / static_cast<size_t>(N));
  const size_t chunks = std::max<size_t>(1, ceilDiv(b, cb));
  for (size_t c = 0; c < chunks; ++c) {
    const size_t off = c * cb;
    const size_t len = std::min(cb, b - std::min(b, off));
    exchange(
        args, s, c == 0,
        [&] {
          for (int m = 0; m < N; ++m) {
            copyAsync(ipc_->staging(me) + static_cast<size_t>(m) * cb, out + static_cast<size_t>(rail_ranks_[m]) * b + off, len, s);
          }
        },
        [&] {
          for (int k = 1; k < L; ++k) {
            const int l = (me + k) % L;
            for (int m = 0; m < N; ++m) {
              const size_t g = static_cast<size_t>(topo_.nodeRanks(m)[l]);
              copyAsync(out + g * b + off, ipc_->staging(l) + static_cast<size_t>(m) * cb, len, s);
            }
          }
        });
  }
}

void CudaCommunicator::railsReduceScatter(const OpArgs& args, cudaStream_t s) {
  const int N = topo_.numNodes();
  const int L = topo_.localSize();
  const int world = topo_.size();
  const size_t es = args.elemSize();
  const size_t b = args.count * es;
  const auto* in = static_cast<const uint8_t*>(args.in);
  uint8_t* partials = deviceScratch(static_cast<size_t>(N) * b);
  std::vector<const void*> srcs(static_cast<size_t>(L));
  begin(args);
  // Node: the partial of every rail member's block, reduced over the node.
  const size_t ce = std::max<size_t>(1, ipc_->stagingBytes() / (static_cast<size_t>(world) * es));
  const size_t chunks = std::max<size_t>(1, ceilDiv(args.count, ce));
  for (size_t c = 0; c < chunks; ++c) {
    const size_t off = c * ce;
    const size_t len = std::min(ce, args.count - std::min(args.count, off));
    exchange(
        args, s, c == 0,
        [&] {
          if (len > 0) {
            cudaCheck(
                cudaMemcpy2DAsync(
                    ipc_->staging(topo_.myLocalRank()), ce * es, in + off * es, b, len * es, static_cast<size_t>(world),
                    cudaMemcpyDeviceToDevice, s),
                "cudaMemcpy2DAsync");
          }
        },
        [&] {
          for (int m = 0; m < N; ++m) {
            const size_t g = static_cast<size_t>(rail_ranks_[m]);
            for (int l = 0; l < L; ++l) {
              srcs[static_cast<size_t>(l)] = ipc_->staging(l) + g * ce * es;
            }
            cudaCheck(
                launchReduce(
                    args.reduce, partials + static_cast<size_t>(m) * b + off * es, srcs.data(), L, len, true, false,
                    config_.cuda_reduce_blocks, s),
                "reduction kernel");
          }
        });
  }
  // Rail: reduce-scatter of the partials (member m's block is m's output).
  ncclCheck(
      ncclReduceScatter(partials, args.out, args.count, ncclTypeOf(args.dtype()), ncclOpOf(args.reduce.op), rail_->comm(), s),
      "ncclReduceScatter");
  cudaCheck(launchFinalize(args.reduce, args.out, args.count, false, config_.cuda_reduce_blocks, s), "finalize kernel");
}

void CudaCommunicator::railsAllReduce(const OpArgs& args, cudaStream_t s) {
  const int L = topo_.localSize();
  const int me = topo_.myLocalRank();
  const size_t es = args.elemSize();
  const size_t half = ipc_->stagingBytes() / 2 / 16 * 16;
  const size_t ce = std::max<size_t>(1, half / es);
  const auto* in = static_cast<const uint8_t*>(args.in);
  auto* out = static_cast<uint8_t*>(args.out);
  std::vector<const void*> srcs(static_cast<size_t>(L));
  begin(args);
  const size_t chunks = std::max<size_t>(1, ceilDiv(args.count, ce));
  for (size_t c = 0; c < chunks; ++c) {
    const size_t off = c * ce;
    const size_t n = std::min(ce, args.count - std::min(args.count, off));
    const Slices slices{n, static_cast<size_t>(L)};
    const size_t b0 = slices.begin(static_cast<size_t>(me));
    const size_t sz = slices.size(static_cast<size_t>(me));
    uint8_t* result = ipc_->staging(me) + half + b0 * es;
    exchange(
        args, s, c == 0, [&] { copyAsync(ipc_->staging(me), in + off * es, n * es, s); },
        [&] {
          for (int l = 0; l < L; ++l) {
            srcs[static_cast<size_t>(l)] = ipc_->staging(l) + b0 * es;
          }
          cudaCheck(launchReduce(args.reduce, result, srcs.data(), L, sz, true, false, config_.cuda_reduce_blocks, s),
                    "reduction kernel");
          // Rail: my slice over the nodes, then AVG's division.
          ncclCheck(
              ncclAllReduce(result, result, sz, ncclTypeOf(args.dtype()), ncclOpOf(args.reduce.op), rail_->comm(), s),
              "ncclAllReduce");
          cudaCheck(launchFinalize(args.reduce, result, sz, false, config_.cuda_reduce_blocks, s), "finalize kernel");
        });
    exchange(
        args, s, false, [] {},
        [&] {
          for (int l = 0; l < L; ++l) {
            const size_t bl = slices.begin(static_cast<size_t>(l));
            copyAsync(out + (off + bl) * es, ipc_->staging(l) + half + bl * es, slices.size(static_cast<size_t>(l)) * es, s);
          }
        });
  }
}

void CudaCommunicator::railsBroadcast(const OpArgs& args, cudaStream_t s) {
  const int root_node = topo_.nodeOf(args.root);
  const int root_local = topo_.localRankOf(args.root);
  const size_t b = args.count * args.elemSize();
  auto* out = static_cast<uint8_t*>(args.out);
  if (topo_.rank() == args.root) {
    copyAsync(out, args.in, b, s);
  }
  if (topo_.myLocalRank() == root_local) {
    ncclCheck(ncclBroadcast(out, out, b, ncclUint8, root_node, rail_->comm(), s), "ncclBroadcast");
  }
  OpArgs a = args;
  a.in = out;
  a.root = root_local;
  nodeBroadcast(a, s);
}

// ------------------------------------------------------------ host staging

void CudaCommunicator::pinned(size_t in_bytes, size_t out_bytes) {
  if (in_bytes > pinned_in_bytes_) {
    if (pinned_in_ != nullptr) {
      cudaFreeHost(pinned_in_);
    }
    cudaCheck(cudaHostAlloc(reinterpret_cast<void**>(&pinned_in_), in_bytes, cudaHostAllocDefault), "cudaHostAlloc");
    pinned_in_bytes_ = in_bytes;
  }
  if (out_bytes > pinned_out_bytes_) {
    if (pinned_out_ != nullptr) {
      cudaFreeHost(pinned_out_);
    }
    cudaCheck(cudaHostAlloc(reinterpret_cast<void**>(&pinned_out_), out_bytes, cudaHostAllocDefault), "cudaHostAlloc");
    pinned_out_bytes_ = out_bytes;
  }
}

void CudaCommunicator::staged(const OpArgs& args, cudaStream_t s) {
  const size_t es = args.elemSize();
  const size_t world = static_cast<size_t>(topo_.size());
  size_t in_bytes = args.count * es;
  size_t out_bytes = args.count * es;
  if (args.kind == CollectiveKind::kAllGather) {
    out_bytes *= world;
  } else if (args.kind == CollectiveKind::kReduceScatter) {
    in_bytes *= world;
  }
  pinned(std::max<size_t>(in_bytes, 1), std::max<size_t>(out_bytes, 1));
  if (in_bytes > 0) {
    cudaCheck(cudaMemcpyAsync(pinned_in_, args.in, in_bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync to host");
  }
  // The host schedule needs the data now (and the previous call's copy back
  // out of pinned_out_ done).
  cudaCheck(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  OpArgs h = args;
  h.in = pinned_in_;
  h.out = (args.kind == CollectiveKind::kAllReduce || args.kind == CollectiveKind::kBroadcast) ? pinned_in_ : pinned_out_;
  switch (args.kind) {
    case CollectiveKind::kAllGather:
      host_comm_->allGather(h);
      break;
    case CollectiveKind::kReduceScatter:
      host_comm_->reduceScatter(h);
      break;
    case CollectiveKind::kAllReduce:
      host_comm_->allReduce(h);
      break;
    case CollectiveKind::kBroadcast:
      host_comm_->broadcast(h);
      break;
    default:
      SMDDP_THROW(kInternal, "no staged path for ", collectiveName(args.kind));
  }
  if (out_bytes > 0) {
    cudaCheck(cudaMemcpyAsync(args.out, h.out, out_bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync to device");
  }
}

} // namespace smddp::algorithm::cuda
