#include "algorithm/ring_communicator.h"

#include "algorithm/op.h"
#include "algorithm/protocol.h"
#include "common/error.h"
#include "common/log.h"

namespace smddp::algorithm {

RingCommunicator::RingCommunicator(
    Store& store,
    const topology::Topology& topology,
    const Config& config,
    std::unique_ptr<transport::Network> network,
    std::unique_ptr<transport::NodeArena> arena,
    const std::string& why)
    : topo_(topology), config_(config), why_(why), arena_(std::move(arena)), network_(std::move(network)) {
  const int n = topo_.size();
  const int r = topo_.rank();
  const int next = (r + 1) % n;
  const int prev = (r + n - 1) % n;
  auto same_node = [&](int peer) { return arena_ && topo_.nodeOf(peer) == topo_.myNode(); };
  std::vector<int> net_peers;
  if (n > 1) {
    if (!same_node(next)) {
      net_peers.push_back(next);
    }
    if (!same_node(prev) && prev != next) {
      net_peers.push_back(prev);
    }
  }
  // Collective over the group even for ranks without peers on other nodes.
  mesh_ = network_->connect(store, "smddp/ring", r, net_peers);
  if (n > 1) {
    if (same_node(next)) {
      shm_next_ = std::make_unique<transport::ShmChannel>(*arena_, topo_.localRankOf(next), next);
      next_ = shm_next_.get();
    } else {
      next_ = &mesh_->channel(next);
    }
    if (same_node(prev)) {
      if (prev == next) {
        prev_ = next_;
      } else {
        shm_prev_ = std::make_unique<transport::ShmChannel>(*arena_, topo_.localRankOf(prev), prev);
        prev_ = shm_prev_.get();
      }
    } else {
      prev_ = &mesh_->channel(prev);
    }
  }
  if (!why_.empty()) {
    SMDDP_LOG(kInfo, "rank ", r, ": flat ring: ", why_);
  }
}

Ring RingCommunicator::ringFor(const OpArgs& args) const {
  Ring ring;
  ring.index = topo_.rank();
  ring.size = topo_.size();
  ring.next = next_;
  ring.prev = prev_;
  ring.chunk_bytes = config_.chunk_bytes;
  ring.drive.policy = waitPolicyOf(config_);
  transport::NodeArena* arena = arena_.get();
  ring.drive.check = [arena] {
    if (arena != nullptr) {
      arena->checkAborted();
    }
  };
  const uint64_t seq = args.seq;
  ring.drive.what = [seq, this] {
    // Neighbours on other nodes are described with their address and NIC; a
    // shared-memory one by its rank.
    auto who = [this](int peer) { return mesh_ ? mesh_->describePeer(peer) : str("rank ", peer); };
    const int next = next_->peer();
    const int prev = prev_->peer();
    return str("ring neighbours (", who(next), next == prev ? std::string() : " and " + who(prev), ") in collective #",
               seq);
  };
  return ring;
}

void RingCommunicator::allGather(const OpArgs& args) {
  const size_t b = args.count * args.elemSize();
  const int n = topo_.size();
  auto* out = static_cast<uint8_t*>(args.out);
  std::vector<size_t> offsets(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    offsets[i] = static_cast<size_t>(i) * b;
  }
  ringAllGather(
      ringFor(args), out, offsets, std::vector<size_t>(static_cast<size_t>(n), b),
      protocol::tagOf(args), args.deadline, nullptr, static_cast<const uint8_t*>(args.in));
}

void RingCommunicator::reduceScatter(const OpArgs& args) {
  const size_t b = args.count * args.elemSize();
  const int n = topo_.size();
  Contributions contrib;
  contrib.base = static_cast<const uint8_t*>(args.in);
  for (int i = 0; i < n; ++i) {
    contrib.offsets.push_back(static_cast<size_t>(i) * b);
  }
  ringReduceScatter(
      ringFor(args), args.reduce, contrib, args.out, std::vector<size_t>(static_cast<size_t>(n), args.count),
      Sources::kInputs, Result::kFinal, protocol::tagOf(args), args.deadline, &scratch_);
}

void RingCommunicator::allReduce(const OpArgs& args) {
  ringAllReduce(
      ringFor(args), args.reduce, args.in, args.out, args.count, Sources::kInputs, Result::kFinal,
      protocol::tagOf(args), args.deadline, &scratch_);
}

void RingCommunicator::broadcast(const OpArgs& args) {
  auto* out = static_cast<uint8_t*>(args.out);
  const size_t b = args.count * args.elemSize();
  if (topo_.rank() == args.root) {
    copyBytes(out, args.in, b);
  }
  ringBroadcast(ringFor(args), out, b, args.root, protocol::tagOf(args), args.deadline);
}

void RingCommunicator::barrier(const OpArgs& args) {
  const int n = topo_.size();
  ringAllGather(
      ringFor(args), nullptr, std::vector<size_t>(static_cast<size_t>(n), 0),
      std::vector<size_t>(static_cast<size_t>(n), 0), protocol::tagOf(args), args.deadline);
}

void RingCommunicator::abort(const std::string& why) {
  if (arena_) {
    arena_->abort(why);
  }
  mesh_->sendAbortAll(why);
}

void RingCommunicator::interrupt(const std::string& why) {
  if (arena_) {
    arena_->abort(why);
  }
  mesh_->shutdownAll(why);
}

std::string RingCommunicator::describe() const {
  return str("ring (", arena_ ? "shm+" : "", network_->transport(), "), ", topo_.describe());
}

} // namespace smddp::algorithm
