#include "algorithm/hierarchical/stages.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include "algorithm/chunks.h"
#include "algorithm/hierarchical/tuning.h"
#include "common/error.h"

namespace smddp::algorithm::hierarchical {

Stages::Stages(
    Store& store,
    const topology::Topology& topology,
    const Config& config,
    std::unique_ptr<transport::Network> network,
    std::unique_ptr<transport::NodeArena> arena)
    : topo_(topology), config_(config), arena_(std::move(arena)), network_(std::move(network)) {
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
  mesh_ = network_->connect(store, "smddp/rail", topo_.rank(), peers);
  if (N > 1) {
    rail_next_ = &mesh_->channel(rail_[mod(n + 1, N)]);
    rail_prev_ = &mesh_->channel(rail_[mod(n - 1, N)]);
  }
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  SMDDP_SYSCHECK(wake_fd_, "eventfd");
}

Stages::~Stages() {
  if (wake_fd_ >= 0) {
    ::close(wake_fd_);
  }
}

// ------------------------------------------------------------ the rail

Ring Stages::railRing(const OpArgs& args, RailOn on) {
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
    // A rail of two nodes has one peer, both ring neighbours: named once.
    const int next = rail_next_->peer();
    const int prev = rail_prev_->peer();
    return str("rail peers (", mesh_->describePeer(next), next == prev ? std::string() : ", " + mesh_->describePeer(prev),
               ") in collective #", seq);
  };
  return ring;
}

size_t Stages::railChunk(size_t b, size_t es) const {
  const size_t part = ceilDiv(ceilDiv(b, tuning::kRailChunks), 64) * 64;
  const size_t bytes = std::min(config_.chunk_bytes, std::max(tuning::kMinRailChunkBytes, part));
  return std::max<size_t>(1, bytes / es) * es;
}

std::vector<size_t> Stages::railOffsets(size_t b) const {
  std::vector<size_t> offsets;
  for (int g : rail_) {
    offsets.push_back(static_cast<size_t>(g) * b);
  }
  return offsets;
}

void Stages::railAllGather(
    const OpArgs& args,
    RailOn on,
    const std::function<void(uint64_t unit)>& on_landed,
    const uint8_t* own) {
  const size_t b = args.count * args.elemSize();
  Ring ring = railRing(args, on);
  ring.chunk_bytes = railChunk(b, 1);
  ringAllGather(
      ring, static_cast<uint8_t*>(args.out), railOffsets(b),
      std::vector<size_t>(static_cast<size_t>(topo_.numNodes()), b), protocol::tagOf(args), args.deadline,
      on_landed, own);
}

void Stages::railReduceScatter(const OpArgs& args, const Contributions& contrib, Sources sources, RailOn on) {
  Ring ring = railRing(args, on);
  ring.chunk_bytes = railChunk(args.count * args.elemSize(), args.elemSize());
  ringReduceScatter(
      ring, args.reduce, contrib, args.out, std::vector<size_t>(static_cast<size_t>(topo_.numNodes()), args.count),
      sources, Result::kFinal, protocol::tagOf(args), args.deadline, &ring_scratch_);
}

void Stages::railAllReduce(const OpArgs& args, const void* in, void* out, size_t count, Sources sources) {
  ringAllReduce(
      railRing(args, RailOn::kCaller), args.reduce, in, out, count, sources, Result::kFinal, protocol::tagOf(args),
      args.deadline, &ring_scratch_);
}

// ------------------------------------------------------------ the node

Contributions Stages::partialContributions(size_t b) {
  const size_t N = static_cast<size_t>(topo_.numNodes());
  Contributions contrib;
  contrib.base = partials_.reserve(N * b);
  for (size_t m = 0; m < N; ++m) {
    contrib.offsets.push_back(m * b);
  }
  return contrib;
}

// ------------------------------------------------------------ running

bool Stages::sequential(size_t block_bytes) const {
  if (config_.pipeline != Tristate::kAuto) {
    return config_.pipeline == Tristate::kOff;
  }
  // With more ranks than CPUs the stage thread has no core of its own to
  // overlap on.
  if (config_.oversubscribed()) {
    return true;
  }
  return block_bytes <= config_.chunk_bytes &&
      static_cast<size_t>(topo_.numNodes()) * block_bytes <= tuning::kSequentialBytes;
}

void Stages::runRail(const std::function<void()>& stage) {
  try {
    stage();
  } catch (const std::exception& e) {
    // Whatever failed (a lost peer or memory for scratch), the node peers
    // must not wait for this rank until their timeout.
    arena_->abort(e.what());
    throw;
  }
}

void Stages::runPipelined(const std::function<void()>& rail_stage, const std::function<void()>& node_stage) {
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

uint32_t Stages::startCall(const OpArgs& args, protocol::Path path) {
  protocol::openCall(*arena_, args, path);
  node_->round(args.deadline);
  protocol::verifyCall(*arena_, args);
  return protocol::myCall(*arena_, args.seq).progress_base;
}

std::function<bool(int block, size_t chunk)> Stages::railReadiness(size_t chunks) {
  partials_ready_.store(0);
  return [this, chunks](int block, size_t c) {
    const auto order = static_cast<uint64_t>(railOrder().consumeOrder(block));
    return partials_ready_.load(std::memory_order_acquire) >= order * chunks + c + 1;
  };
}

void Stages::handToRail(int j, size_t c, size_t chunks) {
  partials_ready_.store(static_cast<uint64_t>(j) * chunks + c + 1, std::memory_order_release);
  wakeRail();
}

void Stages::wakeRail() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wake_fd_, &one, sizeof(one));
}

// ------------------------------------------------------------ failures

void Stages::abort(const std::string& why) {
  arena_->abort(why);
  mesh_->sendAbortAll(why);
}

void Stages::interrupt(const std::string& why) {
  cancel_.store(true);
  wakeRail();
  arena_->abort(why);
  mesh_->shutdownAll(why);
}

} // namespace smddp::algorithm::hierarchical
