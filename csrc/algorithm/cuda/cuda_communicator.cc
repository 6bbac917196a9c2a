#include "algorithm/cuda/cuda_communicator.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "algorithm/cuda/schedules.h"
#include "common/error.h"
#include "common/log.h"

namespace smddp::algorithm::cuda {

using transport::cudaCheck;

namespace {

// The teardown round waits at most this long for the node's peers: a
// destroy must end, also when a peer never destroys its group.
constexpr std::chrono::seconds kTeardownBound{10};

// The live zero-copy communicators of this process, for segmentFreed();
// never destroyed, since torch may free a segment during static teardown.
std::mutex& registryMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::vector<CudaCommunicator*>& registry() {
  static auto* comms = new std::vector<CudaCommunicator*>;
  return *comms;
}

// A revocation waits this long for a peer that missed one before: the
// allocator's lock is held meanwhile.
constexpr std::chrono::milliseconds kLateBound{100};

} // namespace

void CudaCommunicator::segmentFreed(int device, uint64_t base, uint64_t size) {
  std::lock_guard<std::mutex> lock(registryMutex());
  for (CudaCommunicator* comm : registry()) {
    if (comm->ctx_->device == device) {
      comm->revokeSegment(base, size);
    }
  }
}

void CudaCommunicator::revokeSegment(uint64_t base, uint64_t size) {
  // Also after an abort: the peers' service threads still close mappings,
  // and an exited peer holds none.
  for (uint64_t id : buffers_->forget(base, size)) {
    std::string late;
    const auto bound = peers_late_.load() ? kLateBound : std::min<std::chrono::milliseconds>(timeout_, kTeardownBound);
    if (revocations_->revoke(id, Deadline::after(bound), &late)) {
      ctx_->revoked_segments.fetch_add(1, std::memory_order_relaxed);
    } else {
      peers_late_.store(true);
      SMDDP_LOG(kWarn, "rank ", ctx_->topo.rank(), " cuda:", ctx_->device, ": ", late,
                " did not close its mapping of a segment torch is freeing within ", bound.count(),
                " ms (SMDDP_CUDA_ZERO_COPY); the free goes on, which CUDA leaves undefined for that peer");
    }
  }
}

CudaCommunicator::CudaCommunicator(
    Store& store,
    DeviceSetup& setup,
    const topology::Topology& topology,
    const Config& config,
    std::chrono::milliseconds timeout,
    int device,
    Communicator* host,
    DeviceMemory& memory)
    : timeout_(timeout), ctx_(std::make_unique<DeviceContext>(topology)) {
  cudaCheck(cudaSetDevice(device), "cudaSetDevice");
  DeviceContext& c = *ctx_;
  c.config = config;
  c.device = device;
  c.host = host;
  c.memory = &memory;
  int pitch = 0;
  cudaCheck(cudaDeviceGetAttribute(&pitch, cudaDevAttrMaxPitch, device), "cudaDeviceGetAttribute(MaxPitch)");
  c.max_pitch = static_cast<size_t>(pitch);

  ipc_ = std::make_unique<transport::CudaIpcArena>(
      topology.myLocalRank(), topology.localSize(), device, config.cuda_staging_bytes);
  if (config.cuda_ranks_per_gpu > 1 && config.cuda_inter_node == "nccl" && topology.numNodes() > 1) {
    // Ranks sharing a GPU asked for NCCL rails: each its own host to NCCL
    // (the identity the plan compares follows), over NCCL's network transport.
    // Outside the log macro, which evaluates nothing at a level that is off.
    const std::string host = transport::ncclHostPerProcess();
    SMDDP_LOG(kInfo, "rank ", topology.rank(), ": NCCL_HOSTID ", host,
              " (SMDDP_CUDA_RANKS_PER_GPU with SMDDP_CUDA_INTER_NODE=nccl)");
  }
  plan_ = setup.plan(store, *ipc_);
  waits_on_ = std::make_shared<const std::string>(deviceWaitsOn(plan_.mode, topology));
  if (plan_.mode == DeviceMode::kHostStaging) {
    ipc_.reset();
    schedule_ = makeStagedSchedule(c);
    SMDDP_LOG(kInfo, "rank ", topology.rank(), " cuda:", device, ": ", describe());
    return;
  }
  c.ipc = ipc_.get();
  transport::NodeArena::Options o;
  o.slot_bytes = kArenaSlotBytes;
  o.wait = waitPolicyOf(config);
  o.timeout = timeout;
  arena_ = std::make_unique<transport::NodeArena>(
      store, plan_.key(str("arena/", topology.myNode())), topology.myLocalRank(),
      topology.nodeRanks(topology.myNode()), o);
  node_ = std::make_unique<NodeCollectives>(*arena_, config);
  c.arena = arena_.get();
  c.node = node_.get();
  // The device-side steps wait on at most kMaxDeviceSources peers' flags;
  // a larger node meets in host rounds.
  const bool on_device = config.cuda_sync != "host";
  const bool device_sync = on_device && deviceSyncServes(topology.localSize());
  if (on_device && !device_sync && topology.myLocalRank() == 0) {
    SMDDP_LOG(kWarn, "rank ", topology.rank(), ": SMDDP_CUDA_SYNC=", config.cuda_sync, " serves nodes of at most ",
              kMaxDeviceSources, " ranks; this node has ", topology.localSize(),
              ", whose ranks meet in host rounds (no CUDA graph capture)");
  }
  if (device_sync && config.cuda_sync == "memops") {
    // The inboxes live in the staging headers, zeroed (at rest) before the
    // handles were exchanged.
    memops_ = std::make_unique<MemOpStream>(config.cuda_batch_memops);
    MemOpFlags flags;
    flags.local_size = topology.localSize();
    flags.me = topology.myLocalRank();
    for (int l = 0; l < flags.local_size; ++l) {
      flags.ready[l] = ipc_->readyInbox(l);
      flags.busy[l] = ipc_->busyInbox(l);
    }
    c.device_sync = true;
    c.memops = memops_.get();
    c.memop_steps = memOpSteps(flags);
  } else if (device_sync) {
    cudaCheck(cudaMalloc(reinterpret_cast<void**>(&sync_counter_), sizeof(uint64_t)), "cudaMalloc of the sync counter");
    transport::zeroDeviceMemory(sync_counter_, sizeof(uint64_t), "zeroing the sync counter");
    cudaCheck(cudaHostAlloc(reinterpret_cast<void**>(&sync_words_), sizeof(SyncWords), cudaHostAllocMapped),
              "cudaHostAlloc of the sync words");
    *sync_words_ = SyncWords{};
    SyncWords* dev = nullptr;
    cudaCheck(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), sync_words_, 0), "cudaHostGetDevicePointer");
    ExchangeFlags flags;
    flags.counter = sync_counter_;
    flags.words = dev;
    flags.timeout_ns = static_cast<uint64_t>(timeout.count()) * 1000000ull;
    flags.local_size = topology.localSize();
    flags.me = topology.myLocalRank();
    for (int l = 0; l < flags.local_size; ++l) {
      flags.ready[l] = ipc_->readyFlag(l);
      flags.done[l] = ipc_->doneFlag(l);
    }
    c.device_sync = true;
    c.sync_steps = exchangeSteps(flags);
  }
  const bool rails = plan_.mode == DeviceMode::kRails;
  // With one rank per node the rails have no node stage to map for.
  if (config.cuda_zero_copy && !(rails && topology.localSize() == 1)) {
    buffers_ = std::make_unique<transport::IpcBuffers>(device, topology.localSize());
    c.buffers = buffers_.get();
    transport::NodeArena* arena = arena_.get();
    revocations_ = std::make_unique<transport::Revocations>(
        *arena_,
        [arena](int l) { return reinterpret_cast<transport::RevokeBox*>(arena->slot(l, 0) + kRevokeBoxOffset); },
        [this](int owner, uint64_t id) { buffers_->close(owner, id); });
  }
  if (rails) {
    const int l = topology.myLocalRank();
    c.rail_ranks = topology.railRanks(l);
    rail_ = std::make_unique<transport::NcclRail>(
        store, plan_.key(str("rail/", l)), str("the NCCL rail of local rank ", l), topology.myNode(),
        topology.numNodes(), device, Deadline::after(timeout));
    c.rail = rail_.get();
    schedule_ = makeRailsSchedule(c);
  } else {
    schedule_ = makeNodeSchedule(c);
  }
  SMDDP_LOG(kInfo, "rank ", topology.rank(), " cuda:", device, ": ", describe());
  if (revocations_) {
    std::lock_guard<std::mutex> lock(registryMutex());
    registry().push_back(this);
  }
}

CudaCommunicator::~CudaCommunicator() {
  cudaSetDevice(ctx_->device);
  schedule_.reset();
  // The releaser writes into this rank's staging header: it stops first.
  memops_.reset();
  if (ipc_) {
    // Peers free their exports only after everybody closed them.
    ipc_->closeImports();
    if (buffers_) {
      buffers_->closeAll();
    }
    if (!aborted_.load() && node_) {
      try {
        node_->round(Deadline::after(std::min<std::chrono::milliseconds>(timeout_, kTeardownBound)));
      } catch (const std::exception& e) {
        SMDDP_LOG(kDebug, "CUDA teardown: the node's peers did not all come (", e.what(), ")");
      }
    }
    if (revocations_) {
      // Torch may free this rank's segments without asking once no peer
      // maps them: revoke what is left (peers that closed everything in
      // their teardown answer at once), then leave the registry (which
      // waits for a revocation under way).
      revokeSegment(0, ~0ull);
      {
        std::lock_guard<std::mutex> lock(registryMutex());
        auto& r = registry();
        r.erase(std::remove(r.begin(), r.end(), this), r.end());
      }
      revocations_.reset();
    }
    ipc_.reset();
  }
  rail_.reset();
  node_.reset();
  arena_.reset();
  if (sync_counter_ != nullptr) {
    cudaFree(sync_counter_);
  }
  if (sync_words_ != nullptr) {
    cudaFreeHost(sync_words_);
  }
}

std::string CudaCommunicator::describe() const {
  const char* sync = ctx_->memops != nullptr ? (ctx_->memops->batched() ? "batched memops" : "memops")
      : ctx_->device_sync                    ? "device"
                                             : "host";
  const std::string ipc = str("cuda ipc (", sync, " sync",
                              buffers_ ? str(", zero-copy: ", ctx_->mapped_calls.load(), " calls mapped, ",
                                             ctx_->staged_calls.load(), " staged, ", ctx_->revoked_segments.load(),
                                             " segments revoked")
                                       : std::string(),
                              ")");
  switch (plan_.mode) {
    case DeviceMode::kNode:
      return str(ipc, ", ", ctx_->topo.describe());
    case DeviceMode::kRails:
      return ctx_->topo.localSize() == 1 ? str("nccl on the group's buffers (one rank per node), ", ctx_->topo.describe())
                                         : str(ipc, " in nodes, nccl rails, ", ctx_->topo.describe());
    case DeviceMode::kHostStaging:
      return str("cuda staged through host memory (", plan_.why, "), ", ctx_->topo.describe());
  }
  return "cuda";
}

void CudaCommunicator::abort(const std::string& why) {
  aborted_.store(true);
  if (sync_words_ != nullptr) {
    // Device-side waits see it through the mapping and end.
    reinterpret_cast<volatile SyncWords*>(sync_words_)->abort = 1;
  }
  if (memops_) {
    // Stream waits have no abort word: the release makes them pass.
    memops_->releaseForever(ctx_->memop_steps.release, ctx_->device);
  }
  if (arena_) {
    arena_->abort(why);
  }
  if (rail_) {
    rail_->abort();
  }
}

std::string CudaCommunicator::asyncError() {
  if (arena_ && !aborted_.load()) {
    // A rank that failed between the host rounds (device-side waits, or a
    // zero-copy call that could not map a peer's buffer) aborted the arena;
    // the peers' streams may be waiting for it on the GPU.
    const std::string why = arena_->abortMessage();
    if (!why.empty()) {
      return str("cuda:", ctx_->device, ": the node's ranks stopped: ", why);
    }
  }
  if (sync_words_ != nullptr && !aborted_.load()) {
    const uint32_t error = reinterpret_cast<volatile SyncWords*>(sync_words_)->error;
    if (error == static_cast<uint32_t>(SyncEnd::kTimeout)) {
      return str("cuda:", ctx_->device, ": a node peer did not reach its step of the collective within the group's "
                 "timeout (device-side wait, SMDDP_CUDA_SYNC=device)");
    }
  }
  return rail_ ? rail_->asyncError() : std::string();
}

void CudaCommunicator::checkDevice(const OpArgs& args) {
  cudaCheck(cudaSetDevice(ctx_->device), "cudaSetDevice");
  const cudaError_t earlier = cudaGetLastError();
  if (earlier != cudaSuccess) {
    SMDDP_THROW(kComm, "cuda:", ctx_->device, " reported an error from earlier work before ",
                collectiveName(args.kind), " #", args.seq, " started: ", cudaGetErrorName(earlier), " (",
                cudaGetErrorString(earlier), "); find the kernel or copy that failed (CUDA_LAUNCH_BLOCKING=1)");
  }
}

void CudaCommunicator::checkCapture(const OpArgs& args) const {
  const std::string why = captureRefusal(plan_.mode, ctx_->device_sync, ctx_->topo.localSize());
  if (!why.empty()) {
    SMDDP_THROW(kInvalidArgument, collectiveName(args.kind), " #", args.seq, " on rank ", ctx_->topo.rank(), " (cuda:",
                ctx_->device, ") is being captured into a CUDA graph, but ", why);
  }
}

void CudaCommunicator::allGather(const OpArgs& args, cudaStream_t s) {
  checkDevice(args);
  schedule_->allGather(args, s);
}

void CudaCommunicator::reduceScatter(const OpArgs& args, cudaStream_t s) {
  checkDevice(args);
  schedule_->reduceScatter(args, s);
}

void CudaCommunicator::allReduce(const OpArgs& args, cudaStream_t s) {
  checkDevice(args);
  schedule_->allReduce(args, s);
}

void CudaCommunicator::broadcast(const OpArgs& args, cudaStream_t s) {
  checkDevice(args);
  schedule_->broadcast(args, s);
}

} // namespace smddp::algorithm::cuda
