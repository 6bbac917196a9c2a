#include "algorithm/hierarchical.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include "algorithm/chunks.h"
#include "algorithm/protocol.h"
#include "common/error.h"
#include "common/log.h"

namespace smddp::algorithm {

namespace {

// A call whose rail blocks each fit in one chunk (SMDDP_CHUNK_BYTES) and
// whose rail data (a block per node) is at most this runs its stages one
// after the other on the calling thread: a pipeline of one chunk per block
// could overlap nothing but the rail's own steps, and would pay two thread
// hand-offs for it.
constexpr size_t kSequentialBytes = size_t{512} << 10;
// The sequential single-copy AllGather pushes its own block to the node
// peers in pieces of at most this (and at most a rail chunk), each right
// after reading it from the input: a piece is written to the peers while
// it is still in this core's cache.
constexpr size_t kPushPiece = size_t{256} << 10;
// The rail cuts a block into at least kRailChunks chunks, so that the next
// stage starts on the first chunk while the second crosses; no chunk is cut
// under kMinRailChunk, which bounds the per-message cost against the bytes
// moved, nor over SMDDP_CHUNK_BYTES.
constexpr size_t kRailChunks = 2;
constexpr size_t kMinRailChunk = size_t{256} << 10;

// Visits bytes [from, from + n) of the concatenation of blocks of `b` bytes
// each: f(block, offset in the block, offset in the range, length).
template <class F>
void forEachPiece(size_t from, size_t n, size_t b, F f) {
  for (size_t pos = from; pos < from + n;) {
    const size_t k = pos / b;
    const size_t w = pos % b;
    const size_t len = std::min(b - w, from + n - pos);
    f(k, w, pos - from, len);
    pos += len;
  }
}

} // namespace

// ------------------------------------------------------------ StageThread

StageThread::StageThread() {
  thread_ = std::thread([this] { loop(); });
}

StageThread::~StageThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StageThread::start(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mu_);
  SMDDP_ASSERT(!has_job_ && !busy_, "stage thread already busy");
  job_ = std::move(job);
  has_job_ = true;
  busy_ = true;
  error_ = nullptr;
  cv_.notify_all();
}

std::exception_ptr StageThread::join() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
  return error_;
}

void StageThread::loop() {
  while (true) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || has_job_; });
      if (stop_ && !has_job_) {
        return;
      }
      job = std::move(job_);
      has_job_ = false;
    }
    std::exception_ptr err;
    try {
      job();
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = err;
      busy_ = false;
    }
    cv_.notify_all();
  }
}

// ------------------------------------------------------------ set-up

HierarchicalCommunicator::HierarchicalCommunicator(
    Store& store,
    const topology::Topology& topology,
    const Config& config,
    const NetOptions& net,
    std::unique_ptr<transport::NodeArena> arena)
    : topo_(topology), config_(config), arena_(std::move(arena)) {
  SMDDP_ASSERT(topo_.uniform(), "hierarchical schedules need a uniform topology");
  node_ = std::make_unique<NodeCollectives>(*arena_, config_);
  rail_ = topo_.railRanks(topo_.myLocalRank());
  const int N = topo_.numNodes();
  const int n = topo_.myNode();
  std::vector<int> peers;
  if (N > 1) {
    peers.push_back(rail_[mod(n + 1, N)]);
    if (N > 2) {
      peers.push_back(rail_[mod(n - 1, N)]);
    }
  }
  const transport::SocketMesh::Options so = socketOptions(config_, net);
  mesh_ = std::make_unique<transport::SocketMesh>(store, "smddp/rail", topo_.rank(), peers, so);
  if (N > 1) {
    rail_next_ = &mesh_->channel(rail_[mod(n + 1, N)]);
    rail_prev_ = &mesh_->channel(rail_[mod(n - 1, N)]);
  }
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  SMDDP_SYSCHECK(wake_fd_, "eventfd");
}

HierarchicalCommunicator::~HierarchicalCommunicator() {
  if (wake_fd_ >= 0) {
    ::close(wake_fd_);
  }
}

std::string HierarchicalCommunicator::describe() const {
  return str("hierarchical (shm+single-copy in nodes, tcp rails), ", topo_.describe());
}

Ring HierarchicalCommunicator::railRing(const OpArgs& args, RailOn on) {
  Ring ring;
  ring.index = topo_.myNode();
  ring.size = topo_.numNodes();
  ring.next = rail_next_;
  ring.prev = rail_prev_;
  ring.chunk_bytes = config_.chunk_bytes;
  ring.drive.policy = waitPolicyOf(config_);
  ring.drive.wake_fd = on == RailOn::kStageThread ? wake_fd_ : -1;
  ring.drive.check = [this] {
    if (cancel_.load()) {
      SMDDP_THROW(kAborted, "the node stage of this collective failed");
    }
    arena_->checkAborted();
  };
  const uint64_t seq = args.seq;
  ring.drive.what = [this, seq] {
    return str(
        "rail peers (rank ", rail_next_->peer(), ", rank ", rail_prev_->peer(), ", other nodes) in collective #",
        seq);
  };
  return ring;
}

size_t HierarchicalCommunicator::railChunk(size_t b, size_t es) const {
  // At least kRailChunks chunks per block, down to kMinRailChunk: a block in
  // one chunk crosses whole before the node stage may touch it, or before
  // the ReduceScatter's last step may reduce any of it.
  const size_t part = ceilDiv(ceilDiv(b, kRailChunks), 64) * 64;
  const size_t bytes = std::min(config_.chunk_bytes, std::max(kMinRailChunk, part));
  return std::max<size_t>(1, bytes / es) * es;
}

std::vector<size_t> HierarchicalCommunicator::railOffsets(size_t b) const {
  std::vector<size_t> offsets;
  for (int g : rail_) {
    offsets.push_back(static_cast<size_t>(g) * b);
  }
  return offsets;
}

void HierarchicalCommunicator::railAllGather(
    const OpArgs& args,
    RailOn on,
    const std::function<void(uint64_t unit)>& on_landed) {
  const size_t b = args.count * args.elemSize();
  Ring ring = railRing(args, on);
  ring.chunk_bytes = railChunk(b, 1);
  ringAllGather(
      ring, static_cast<uint8_t*>(args.out), railOffsets(b),
      std::vector<size_t>(static_cast<size_t>(topo_.numNodes()), b), protocol::tagOf(args), args.deadline, on_landed);
}

Contributions HierarchicalCommunicator::partialContributions(size_t b) {
  const size_t N = static_cast<size_t>(topo_.numNodes());
  Contributions contrib;
  contrib.base = partials_.reserve(N * b);
  for (size_t m = 0; m < N; ++m) {
    contrib.offsets.push_back(m * b);
  }
  return contrib;
}

void HierarchicalCommunicator::railReduceScatter(
    const OpArgs& args,
    const Contributions& contrib,
    Sources sources,
    RailOn on) {
  Ring ring = railRing(args, on);
  ring.chunk_bytes = railChunk(args.count * args.elemSize(), args.elemSize());
  ringReduceScatter(
      ring, args.reduce, contrib, args.out,
      std::vector<size_t>(static_cast<size_t>(topo_.numNodes()), args.count), sources, Result::kFinal, protocol::tagOf(args),
      args.deadline, &ring_scratch_);
}

void HierarchicalCommunicator::railAllReduce(
    const OpArgs& args,
    const void* in,
    void* out,
    size_t count,
    Sources sources) {
  ringAllReduce(
      railRing(args, RailOn::kCaller), args.reduce, in, out, count, sources, Result::kFinal, protocol::tagOf(args),
      args.deadline, &ring_scratch_);
}

uint32_t HierarchicalCommunicator::openProgressCall(const OpArgs& args) {
  protocol::openCall(*arena_, args, protocol::Path::kSingleCopy);
  node_->round(args.deadline);
  protocol::verifyCall(*arena_, args);
  return protocol::myCall(*arena_, args.seq).progress_base;
}

std::function<bool(int block, size_t chunk)> HierarchicalCommunicator::railReadiness(size_t chunks) {
  partials_ready_.store(0);
  return [this, chunks](int block, size_t c) {
    const auto order = static_cast<uint64_t>(railOrder().consumeOrder(block));
    return partials_ready_.load(std::memory_order_acquire) >= order * chunks + c + 1;
  };
}

void HierarchicalCommunicator::handToRail(int j, size_t c, size_t chunks) {
  partials_ready_.store(static_cast<uint64_t>(j) * chunks + c + 1, std::memory_order_release);
  wakeRail();
}

void HierarchicalCommunicator::wakeRail() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wake_fd_, &one, sizeof(one));
}

void HierarchicalCommunicator::runStages(
    const std::function<void()>& rail_stage,
    const std::function<void()>& node_stage) {
  cancel_.store(false);
  stage_.start([this, &rail_stage] {
    try {
      rail_stage();
    } catch (const std::exception& e) {
      // The node peers may be waiting for this rank's rail data: release
      // them now rather than at their timeout.
      if (!cancel_.load()) {
        arena_->abort(e.what());
      }
      throw;
    }
  });
  std::exception_ptr node_error;
  try {
    node_stage();
  } catch (...) {
    node_error = std::current_exception();
    cancel_.store(true);
    wakeRail();
  }
  std::exception_ptr rail_error = stage_.join();
  if (rail_error && !node_error) {
    std::rethrow_exception(rail_error);
  }
  if (node_error) {
    // A node stage that failed because the rail did says more by the rail's.
    if (rail_error) {
      try {
        std::rethrow_exception(rail_error);
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kAborted) {
          std::rethrow_exception(rail_error);
        }
      } catch (...) {
      }
    }
    std::rethrow_exception(node_error);
  }
}

// ------------------------------------------------------------ AllGather

void HierarchicalCommunicator::allGather(const OpArgs& args) {
  const int N = topo_.numNodes();
  if (N == 1) {
    node_->allGather(args);
    return;
  }
  if (topo_.localSize() == 1) {
    const size_t b = args.count * args.elemSize();
    auto* out = static_cast<uint8_t*>(args.out);
    copyBytes(out + static_cast<size_t>(topo_.rank()) * b, args.in, b);
    railAllGather(args, RailOn::kCaller);
    return;
  }
  if (sequential(args.count * args.elemSize())) {
    allGatherSequential(args);
  } else {
    allGatherPipelined(args);
  }
}

void HierarchicalCommunicator::allGatherPipelined(const OpArgs& args) {
  const int L = topo_.localSize();
  const int l = topo_.myLocalRank();
  const size_t b = args.count * args.elemSize();
  const size_t chunk = railChunk(b, 1);
  const size_t C = chunkCount(b, chunk);
  const protocol::ProgressUnits units{railOrder(), C};
  auto* out = static_cast<uint8_t*>(args.out);
  const auto* in = static_cast<const uint8_t*>(args.in);

  // Round A: descriptors (output address, progress base), checked.
  const uint32_t base = openProgressCall(args);

  // Units, in the order every rank announces them: its own block's chunks,
  // then the rail's chunks as they land (step-major).
  auto rail_stage = [&] {
    uint8_t* my_block = out + static_cast<size_t>(topo_.rank()) * b;
    for (size_t c = 0; c < C; ++c) {
      const size_t len = chunkLen(b, chunk, c);
      if (my_block != in) {
        copyBytes(my_block + c * chunk, in + c * chunk, len);
      }
      arena_->postProgress(protocol::progressAfter(base, c + 1));
    }
    railAllGather(args, RailOn::kStageThread, [&](uint64_t u) { arena_->postProgress(protocol::progressAfter(base, C + u + 1)); });
  };

  auto node_stage = [&] {
    for (uint64_t u = 0; u < units.count(); ++u) {
      const protocol::RingUnit unit = units.at(u);
      const size_t len = chunkLen(b, chunk, unit.chunk);
      for (int k = 1; k < L; ++k) {
        const int peer = (l + k) % L;
        const protocol::CallDesc& d = protocol::peerCall(*arena_, peer, args.seq);
        arena_->waitProgress(peer, protocol::progressAfter(d.progress_base, u + 1), args.deadline);
        const size_t off = static_cast<size_t>(topo_.nodeRanks(unit.block)[peer]) * b + unit.chunk * chunk;
        arena_->readFrom(peer, out + off, d.out_addr + off, len);
      }
    }
  };

  runStages(rail_stage, node_stage);
  // Nobody returns while a peer may still read its output.
  node_->round(args.deadline);
}

// ------------------------------------------------------------ ReduceScatter

void HierarchicalCommunicator::reduceScatter(const OpArgs& args) {
  const int N = topo_.numNodes();
  if (N == 1) {
    node_->reduceScatter(args);
    return;
  }
  if (topo_.localSize() == 1) {
    Contributions contrib;
    contrib.base = static_cast<const uint8_t*>(args.in);
    contrib.offsets = railOffsets(args.count * args.elemSize());
    railReduceScatter(args, contrib, Sources::kInputs, RailOn::kCaller);
    return;
  }
  if (sequential(args.count * args.elemSize())) {
    reduceScatterSequential(args);
  } else {
    reduceScatterPipelined(args);
  }
}

void HierarchicalCommunicator::reduceScatterPipelined(const OpArgs& args) {
  const int N = topo_.numNodes();
  const size_t es = args.elemSize();
  const size_t b = args.count * es;
  const size_t chunk = railChunk(b, es);
  const size_t C = chunkCount(b, chunk);
  const auto* in = static_cast<const uint8_t*>(args.in);

  protocol::openCall(*arena_, args, protocol::Path::kSingleCopy);
  node_->round(args.deadline);
  protocol::verifyCall(*arena_, args);

  Contributions contrib = partialContributions(b);
  contrib.ready = railReadiness(C);

  auto rail_stage = [&] { railReduceScatter(args, contrib, Sources::kPartials, RailOn::kStageThread); };
  auto node_stage = [&] {
    for (int j = 0; j < N; ++j) {
      const int member = railOrder().consumedAt(j);
      const size_t block = static_cast<size_t>(rail_[member]) * b;
      for (size_t c = 0; c < C; ++c) {
        const size_t len = chunkLen(b, chunk, c);
        node_->reduceFromPeers(
            args, in, block + c * chunk, len / es, partials_.data() + static_cast<size_t>(member) * b + c * chunk,
            Sources::kInputs, Result::kPartial);
        handToRail(j, c, C);
      }
    }
  };
  runStages(rail_stage, node_stage);
  node_->round(args.deadline);
}

// ------------------------------------------------------------ small messages

bool HierarchicalCommunicator::sequential(size_t block_bytes) const {
  if (config_.pipeline != Tristate::kAuto) {
    return config_.pipeline == Tristate::kOff;
  }
  // With more ranks than CPUs the rail stage's thread has no core of its
  // own to overlap on.
  if (config_.oversubscribed()) {
    return true;
  }
  // One chunk per block: the pipeline would only overlap the rail's steps.
  return block_bytes <= config_.chunk_bytes &&
      static_cast<size_t>(topo_.numNodes()) * block_bytes <= kSequentialBytes;
}

void HierarchicalCommunicator::railStage(const std::function<void()>& stage) {
  try {
    stage();
  } catch (const std::exception& e) {
    // Whatever failed (a lost peer or memory for scratch), the node peers
    // must not wait for this rank until their timeout.
    arena_->abort(e.what());
    throw;
  }
}

void HierarchicalCommunicator::allGatherSequential(const OpArgs& args) {
  const int N = topo_.numNodes();
  const int L = topo_.localSize();
  const int me = topo_.myLocalRank();
  const size_t b = args.count * args.elemSize();
  const size_t total = static_cast<size_t>(N) * b;
  auto* out = static_cast<uint8_t*>(args.out);
  // Local rank p ends the rail stage with the blocks of its rail: block k
  // of p's rail is the one of node k's local rank p.
  auto block = [&](int p, size_t k) {
    return static_cast<size_t>(topo_.nodeRanks(static_cast<int>(k))[static_cast<size_t>(p)]) * b;
  };
  const bool single = node_->useSingleCopy(total);
  protocol::openCall(*arena_, args, single ? protocol::Path::kSingleCopy : protocol::Path::kStaged);
  // The node agrees on the call before anyone waits on the rail: a rank
  // whose call differs (and so may take the pipelined path, which starts
  // with this round) must meet a kMismatch, not a wait on the rail.
  node_->round(args.deadline);
  protocol::verifyCall(*arena_, args);
  uint8_t* my_block = out + static_cast<size_t>(topo_.rank()) * b;
  if (single) {
    // Push, not pull: each chunk of my block and of my rail's blocks goes to
    // every node peer right after this rank has read or received it, while
    // it is still in cache; a peer pulling it after the rail would read it
    // from memory.
    const size_t chunk = railChunk(b, 1);
    auto push = [&](size_t off, const uint8_t* src, size_t len) {
      for (int k = 1; k < L; ++k) {
        const int peer = (me + k) % L;
        arena_->writeTo(peer, protocol::peerCall(*arena_, peer, args.seq).out_addr + off, src, len);
      }
    };
    const size_t C = chunkCount(b, chunk);
    const size_t mine = static_cast<size_t>(topo_.rank()) * b;
    const auto* in = static_cast<const uint8_t*>(args.in);
    railStage([&] {
      const size_t piece = std::min<size_t>(chunk, kPushPiece);
      for (size_t off = 0; off < b; off += piece) {
        const size_t len = std::min(piece, b - off);
        if (my_block != args.in) {
          copyBytes(my_block + off, in + off, len);
        }
        push(mine + off, in + off, len);
      }
      railAllGather(args, RailOn::kCaller, [&](uint64_t u) {
        const protocol::RingUnit unit = railOrder().landed(u, C);
        const size_t off = block(me, static_cast<size_t>(unit.block)) + unit.chunk * chunk;
        push(off, out + off, chunkLen(b, chunk, unit.chunk));
      });
    });
    // Every peer's pushes into my output have landed.
    node_->round(args.deadline);
    return;
  }
  if (my_block != args.in) {
    copyBytes(my_block, args.in, b);
  }
  railStage([&] { railAllGather(args, RailOn::kCaller); });
  // Staged: each rank's rail blocks, packed, through its slot.
  const size_t slot = arena_->slotBytes();
  const size_t rounds = chunkCount(total, slot);
  for (size_t t = 0; t < rounds; ++t) {
    const size_t off = t * slot;
    const size_t n = chunkLen(total, slot, t);
    const uint32_t parity = arena_->phase() + 1;
    uint8_t* mine = arena_->slot(me, parity);
    forEachPiece(off, n, b, [&](size_t k, size_t w, size_t at, size_t len) {
      copyBytes(mine + at, out + block(me, k) + w, len);
    });
    node_->round(args.deadline);
    for (int k = 1; k < L; ++k) {
      const int peer = (me + k) % L;
      const uint8_t* theirs = arena_->slot(peer, parity);
      forEachPiece(off, n, b, [&](size_t m, size_t w, size_t at, size_t len) {
        copyBytes(out + block(peer, m) + w, theirs + at, len);
      });
    }
  }
}

void HierarchicalCommunicator::reduceScatterSequential(const OpArgs& args) {
  const int N = topo_.numNodes();
  const int L = topo_.localSize();
  const int me = topo_.myLocalRank();
  const size_t es = args.elemSize();
  const size_t b = args.count * es;
  const auto* in = static_cast<const uint8_t*>(args.in);
  Contributions contrib = partialContributions(b);
  uint8_t* partials = partials_.data();
  // Block m of local rank p's rail: the block of node m's local rank p.
  auto block = [&](int p, int m) {
    return static_cast<size_t>(topo_.nodeRanks(m)[static_cast<size_t>(p)]);
  };
  // (Staging needs one element of every block in a slot.)
  const bool single = node_->useSingleCopy(static_cast<size_t>(N) * b) ||
      static_cast<size_t>(L) * static_cast<size_t>(N) * es > arena_->slotBytes();
  protocol::openCall(*arena_, args, single ? protocol::Path::kSingleCopy : protocol::Path::kStaged);
  // Node stage: partial m = the node's contributions to block m of my rail,
  // reduced in local rank order (as the pipelined path does).
  if (single) {
    node_->round(args.deadline);
    protocol::verifyCall(*arena_, args);
    const int n = topo_.myNode();
    for (int m = 0; m < N; ++m) {
      if (m != n) {
        node_->reduceFromPeers(args, in, block(me, m) * b, args.count, partials + static_cast<size_t>(m) * b,
                               Sources::kInputs, Result::kPartial);
      }
    }
    // My own block skips the partial in memory: the rail's last step reduces
    // the node's inputs chunk by chunk, through the cache, and combines each
    // chunk with the other nodes' sum straight into the output, in the same
    // operations as with the partial (the same bits). No peer reads my block
    // of my input (an in-place output), but I read my block of theirs until
    // the rail ends: nobody returns before then.
    contrib.finish = [&](void* dst, const void* part, size_t offset, size_t count) {
      node_->reduceFromPeers(args, in, block(me, n) * b + offset, count, dst, Sources::kInputs, Result::kFinal, part);
    };
    railStage([&] { railReduceScatter(args, contrib, Sources::kPartials, RailOn::kCaller); });
    node_->round(args.deadline);
    return;
  }
  node_->reduceScatterStagedBlocks(args, N, block, partials, Result::kPartial);
  railStage([&] { railReduceScatter(args, contrib, Sources::kPartials, RailOn::kCaller); });
}

// ------------------------------------------------------------ AllReduce

void HierarchicalCommunicator::allReduce(const OpArgs& args) {
  const int N = topo_.numNodes();
  const int L = topo_.localSize();
  if (N == 1) {
    node_->allReduce(args);
    return;
  }
  if (L == 1) {
    railAllReduce(args, args.in, args.out, args.count, Sources::kInputs);
    return;
  }
  const size_t b = args.count * args.elemSize();
  // As on one node.
  if (b <= arena_->slotBytes() && !node_->useSingleCopyForAllReduce(b)) {
    allReduceStaged(args);
    return;
  }
  const int l = topo_.myLocalRank();
  const size_t es = args.elemSize();
  const Slices slices{args.count, static_cast<size_t>(L)};
  // The rail's blocks are the N sub-slices of a slice (the first the largest).
  const size_t rail_block = Slices{slices.size(0), static_cast<size_t>(N)}.size(0) * es;
  if (!sequential(rail_block)) {
    allReducePipelined(args);
    return;
  }
  auto* out = static_cast<uint8_t*>(args.out);
  uint8_t* mine = out + slices.begin(static_cast<size_t>(l)) * es;

  protocol::openCall(*arena_, args, protocol::Path::kSingleCopy);
  node_->round(args.deadline);
  protocol::verifyCall(*arena_, args);
  // Node stage: my slice, reduced over the node (PREMUL_SUM scales here).
  node_->reduceFromPeers(
      args, static_cast<const uint8_t*>(args.in), slices.begin(static_cast<size_t>(l)) * es,
      slices.size(static_cast<size_t>(l)), mine, Sources::kInputs, Result::kPartial);
  // Rail stage: my slice, reduced over the nodes.
  railStage([&] { railAllReduce(args, mine, mine, slices.size(static_cast<size_t>(l)), Sources::kPartials); });
  // Every rank has read the inputs (which may be the outputs) and finished
  // its slice: gather the slices.
  node_->round(args.deadline);
  for (int k = 1; k < L; ++k) {
    const int peer = (l + k) % L;
    const size_t off = slices.begin(static_cast<size_t>(peer)) * es;
    arena_->readFrom(peer, out + off, protocol::peerCall(*arena_, peer, args.seq).out_addr + off,
                     slices.size(static_cast<size_t>(peer)) * es);
  }
  node_->round(args.deadline);
}

void HierarchicalCommunicator::allReducePipelined(const OpArgs& args) {
  const int N = topo_.numNodes();
  const int L = topo_.localSize();
  const int n = topo_.myNode();
  const int l = topo_.myLocalRank();
  const size_t es = args.elemSize();
  const Slices slices{args.count, static_cast<size_t>(L)};
  const auto* in = static_cast<const uint8_t*>(args.in);
  auto* out = static_cast<uint8_t*>(args.out);
  const size_t my_begin = slices.begin(static_cast<size_t>(l)) * es;
  uint8_t* mine = out + my_begin;
  // My slice as the rail ring sees it: N sub-slices, the ring's blocks.
  const Slices sub{slices.size(static_cast<size_t>(l)), static_cast<size_t>(N)};
  std::vector<size_t> counts(static_cast<size_t>(N));
  std::vector<size_t> offsets(static_cast<size_t>(N));
  std::vector<size_t> sizes(static_cast<size_t>(N));
  for (size_t m = 0; m < static_cast<size_t>(N); ++m) {
    counts[m] = sub.size(m);
    offsets[m] = sub.begin(m) * es;
    sizes[m] = counts[m] * es;
  }
  // Chunks as the ring cuts them: its ReduceScatter in whole elements, its
  // AllGather in bytes.
  const size_t rs_chunk = std::max<size_t>(1, config_.chunk_bytes / es) * es;
  const size_t rs_chunks = chunkCount(sizes[0], rs_chunk);
  const size_t ag_chunk = config_.chunk_bytes;

  const uint32_t base = openProgressCall(args);

  // The node stage reduces my slice into place, the rail's contributions.
  Contributions contrib;
  contrib.base = mine;
  contrib.offsets = offsets;
  contrib.ready = railReadiness(rs_chunks);

  // Progress units, as every rank of the node counts them for its own
  // slice: the chunks of its rail block (final when the rail's
  // ReduceScatter returns), then the chunks of the AllGather as they land.
  auto rail_stage = [&] {
    const Ring ring = railRing(args, RailOn::kStageThread);
    const transport::MessageTag tag = protocol::tagOf(args);
    ringReduceScatter(
        ring, args.reduce, contrib, mine + offsets[static_cast<size_t>(n)], counts, Sources::kPartials, Result::kFinal, tag, args.deadline,
        &ring_scratch_);
    const size_t own = chunkCount(sizes[0], ag_chunk);
    arena_->postProgress(protocol::progressAfter(base, own));
    ringAllGather(ring, mine, offsets, sizes, tag, args.deadline,
                  [&](uint64_t u) { arena_->postProgress(protocol::progressAfter(base, own + u + 1)); });
  };

  auto node_stage = [&] {
    for (int j = 0; j < N; ++j) {
      const int m = railOrder().consumedAt(j);
      for (size_t c = 0; c < rs_chunks; ++c) {
        const size_t len = chunkLen(sizes[static_cast<size_t>(m)], rs_chunk, c);
        const size_t off = offsets[static_cast<size_t>(m)] + c * rs_chunk;
        if (len > 0) {
          // PREMUL_SUM scales here; AVG divides at the rail's end.
          node_->reduceFromPeers(args, in, my_begin + off, len / es, mine + off, Sources::kInputs, Result::kPartial);
        }
        handToRail(j, c, rs_chunks);
      }
    }
    // Each peer's slice, unit by unit as its rail finalizes it. Reading a
    // unit of peer p into my output also waits until p has read its slice
    // of my input (which an in-place call overwrites here): p reduced all
    // of it before its rail could end its ReduceScatter.
    struct Peer {
      int local;
      size_t begin;
      Slices sub;
      protocol::ProgressUnits units;
      uint32_t base;
      uint64_t addr;
    };
    std::vector<Peer> peers;
    uint64_t units = 0;
    for (int k = 1; k < L; ++k) {
      const int p = (l + k) % L;
      const Slices ps{slices.size(static_cast<size_t>(p)), static_cast<size_t>(N)};
      const protocol::CallDesc& d = protocol::peerCall(*arena_, p, args.seq);
      // Of p's slice (p is on node n too, so on the same rail position).
      const protocol::ProgressUnits pu{railOrder(), chunkCount(ps.size(0) * es, ag_chunk)};
      peers.push_back({p, slices.begin(static_cast<size_t>(p)) * es, ps, pu, d.progress_base, d.out_addr});
      units = std::max<uint64_t>(units, pu.count());
    }
    for (uint64_t u = 0; u < units; ++u) {
      for (const Peer& p : peers) {
        if (u >= p.units.count()) {
          continue;
        }
        const protocol::RingUnit unit = p.units.at(u);
        const auto m = static_cast<size_t>(unit.block);
        arena_->waitProgress(p.local, protocol::progressAfter(p.base, u + 1), args.deadline);
        const size_t len = chunkLen(p.sub.size(m) * es, ag_chunk, unit.chunk);
        if (len > 0) {
          const size_t off = p.begin + p.sub.begin(m) * es + unit.chunk * ag_chunk;
          arena_->readFrom(p.local, out + off, p.addr + off, len);
        }
      }
    }
  };
  runStages(rail_stage, node_stage);
  // Nobody returns while a peer may still read its output.
  node_->round(args.deadline);
}

void HierarchicalCommunicator::allReduceStaged(const OpArgs& args) {
  const int L = topo_.localSize();
  const int me = topo_.myLocalRank();
  const size_t es = args.elemSize();
  const Slices slices{args.count, static_cast<size_t>(L)};
  const size_t begin = slices.begin(static_cast<size_t>(me)) * es;
  protocol::openCall(*arena_, args, protocol::Path::kStaged);
  const uint32_t parity = arena_->phase() + 1;
  copyBytes(arena_->slot(me, parity), args.in, args.count * es);
  node_->round(args.deadline);
  protocol::verifyCall(*arena_, args);
  // My slice, reduced over the node in local rank order (as the single-copy
  // path does), into my slot of the other parity: no peer reads it before
  // the next round, and it is next written after the round that follows.
  std::vector<const void*>& srcs = sources_;
  srcs.assign(static_cast<size_t>(L), nullptr);
  for (int l = 0; l < L; ++l) {
    srcs[static_cast<size_t>(l)] = arena_->slot(l, parity) + begin;
  }
  uint8_t* mine = arena_->slot(me, parity + 1) + begin;
  reduce(args.reduce, mine, srcs.data(), L, slices.size(static_cast<size_t>(me)), Sources::kInputs, Result::kPartial);
  railStage([&] { railAllReduce(args, mine, mine, slices.size(static_cast<size_t>(me)), Sources::kPartials); });
  node_->round(args.deadline);
  auto* out = static_cast<uint8_t*>(args.out);
  for (int k = 0; k < L; ++k) {
    const int l = (me + k) % L;
    const size_t off = slices.begin(static_cast<size_t>(l)) * es;
    copyBytes(out + off, arena_->slot(l, parity + 1) + off, slices.size(static_cast<size_t>(l)) * es);
  }
}

// ------------------------------------------------------------ Broadcast, Barrier

void HierarchicalCommunicator::broadcast(const OpArgs& args) {
  const int root_node = topo_.nodeOf(args.root);
  const int root_local = topo_.localRankOf(args.root);
  auto* out = static_cast<uint8_t*>(args.out);
  const size_t b = args.count * args.elemSize();
  if (topo_.rank() == args.root) {
    copyBytes(out, args.in, b);
  }
  if (topo_.numNodes() > 1 && topo_.myLocalRank() == root_local) {
    try {
      ringBroadcast(railRing(args, RailOn::kCaller), out, b, root_node, protocol::tagOf(args), args.deadline);
    } catch (const Error& e) {
      arena_->abort(e.what());
      throw;
    }
  }
  OpArgs node_args = args;
  node_args.in = out;
  node_args.root = root_local;
  node_->broadcast(node_args);
}

void HierarchicalCommunicator::barrier(const OpArgs& args) {
  node_->barrier(args);
  if (topo_.numNodes() > 1) {
    const int N = topo_.numNodes();
    try {
      ringAllGather(
          railRing(args, RailOn::kCaller), nullptr, std::vector<size_t>(static_cast<size_t>(N), 0),
          std::vector<size_t>(static_cast<size_t>(N), 0), protocol::tagOf(args), args.deadline);
    } catch (const Error& e) {
      arena_->abort(e.what());
      throw;
    }
  }
  node_->barrier(args);
}

// ------------------------------------------------------------ failures

void HierarchicalCommunicator::abort(const std::string& why) {
  arena_->abort(why);
  mesh_->sendAbortAll(why);
}

void HierarchicalCommunicator::interrupt(const std::string& why) {
  cancel_.store(true);
  wakeRail();
  arena_->abort(why);
  mesh_->shutdownAll();
}

} // namespace smddp::algorithm
