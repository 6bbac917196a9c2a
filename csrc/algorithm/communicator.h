// A communicator runs the natively implemented collectives of one process
// group on host memory. Which schedule and which transports it uses is
// decided once, when the group is created, from the topology and the
// configuration:
//
//   one node                      NodeCollectives over shared memory
//   several nodes, uniform        hierarchical (rails over sockets, then the
//                                 node over shared memory), or the flat ring
//                                 with SMDDP_ALGO=ring
//   several nodes, not uniform    the flat ring (logged once, with the reason)
//
// Every method is collective: all ranks of the group call it, in the same
// order, with matching arguments (checked). Calls come from one thread at a
// time. abort() may be called from any thread: it makes every rank that
// waits on this one fail promptly instead of waiting for its timeout.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "algorithm/op.h"
#include "common/config.h"
#include "common/store.h"
#include "topology/topology.h"
#include "transport/network.h"
#include "transport/shm/futex.h"

namespace smddp::algorithm {

// This rank's NIC and the set-up's bound (transport/network.h).
using NetOptions = transport::NetOptions;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual void allGather(const OpArgs& args) = 0;
  virtual void reduceScatter(const OpArgs& args) = 0;
  virtual void allReduce(const OpArgs& args) = 0;
  // args.root is a group rank.
  virtual void broadcast(const OpArgs& args) = 0;
  virtual void barrier(const OpArgs& args) = 0;
  // After a failure, from the thread that ran the failed call: tell every
  // peer why (they fail promptly instead of at their timeout).
  virtual void abort(const std::string& why) = 0;
  // From any thread, also while a call runs: make it fail now.
  virtual void interrupt(const std::string& why) = 0;
  // "shm, 1 node x 4 ranks", for logs and Python.
  virtual std::string describe() const = 0;
};

// Collective over the group: builds the transports the schedule needs (the
// network between nodes from transport::createNetwork()); `timeout` bounds
// set-up. Every rank reaches the same choice.
std::unique_ptr<Communicator> createCommunicator(
    Store& store,
    const topology::Topology& topology,
    const Config& config,
    const NetOptions& net,
    std::chrono::milliseconds timeout);

// The wait policy and the way a channel driver checks for aborts, shared by
// the communicators.
transport::WaitPolicy waitPolicyOf(const Config& config);

} // namespace smddp::algorithm
