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

namespace smddp::algorithm {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual void allGather(const OpArgs& args) = 0;
  virtual void reduceScatter(const OpArgs& args) = 0;
  virtual void allReduce(const OpArgs& args) = 0;
  // args.root is a group rank.
  virtual void broadcast(const OpArgs& args) = 0;
  virtual void barrier(const OpArgs& args) = 0;
  virtual void abort(const std::string& why) = 0;
  // "shm, 1 node x 4 ranks", for logs and Python.
  virtual std::string describe() const = 0;
};

// Collective over the group: builds the transports the schedule needs.
// `group_ranks` are the group ranks (0..size-1); `timeout` bounds set-up.
std::unique_ptr<Communicator> createCommunicator(
    Store& store,
    const topology::Topology& topology,
    const Config& config,
    std::chrono::milliseconds timeout);

} // namespace smddp::algorithm
