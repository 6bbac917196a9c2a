// The NCCL communicator of one rail (the ranks with the same local rank, one
// per node), for the inter-node stage of the CUDA schedules. On p4d/p5 it
// reaches EFA through the aws-ofi-nccl plugin; the node stage stays on
// NVLink through CUDA IPC.
//
// Created from a unique id that the rail's first member puts in the store.
// Needs one GPU per rank (NCCL refuses two ranks of a communicator on one
// GPU); with shared GPUs the CUDA schedules stage through the host instead.
//
// The communicator is non-blocking (ncclConfig_t::blocking = 0), so that no
// NCCL call can keep a thread for ever: its creation, every enqueue and its
// teardown return at once and are then polled (ncclCommGetAsyncError) until
// done, a deadline, or abort(). Every use of the communicator holds the
// rail's lock only for the call itself, never while polling, so abort()
// from another thread (the watchdog, ProcessGroup.abort()) is never kept
// waiting and never frees the communicator under a caller's feet: after it,
// every use throws kAborted.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <functional>
#include <mutex>
#include <string>

#include "common/clock.h"
#include "common/store.h"

namespace smddp::transport {

// Throws kComm naming `what` if `r` is not ncclSuccess (nor ncclInProgress).
void ncclCheck(ncclResult_t r, const char* what);

// Makes this process a host of its own to NCCL (NCCL_HOSTID, unless the
// environment sets it), before its first NCCL call: NCCL refuses two members
// of a communicator on one GPU of one host, so ranks that share a GPU (tests
// on one GPU, SMDDP_CUDA_RANKS_PER_GPU) form rails only as separate hosts,
// talking over NCCL's network transport. Returns the host id in force.
std::string ncclHostPerProcess();

class NcclRail {
 public:
  // Collective over the rail: member `index` of `size`. `name` says which
  // rail in messages ("rail 3 (local rank 3)"). Throws Error(kTimeout) if
  // the rail is not up by `deadline`.
  NcclRail(
      Store& store,
      const std::string& key,
      const std::string& name,
      int index,
      int size,
      int device,
      const Deadline& deadline);
  ~NcclRail();
  NcclRail(const NcclRail&) = delete;
  NcclRail& operator=(const NcclRail&) = delete;

  int index() const {
    return index_;
  }
  int size() const {
    return size_;
  }

  // Enqueues NCCL operations: `enqueue` makes its calls on the communicator
  // (a group of sends and receives, a reduce-scatter...) under the rail's
  // lock; then waits, without it, until NCCL has taken them. Throws Error
  // naming `what` and the rail on an error, at the deadline, or after abort().
  void run(const char* what, const Deadline& deadline, const std::function<ncclResult_t(ncclComm_t)>& enqueue);

  // The communicator's asynchronous error ("" if none), for the watchdog.
  std::string asyncError();

  // From any thread: NCCL operations in flight end (with undefined results)
  // and every later use of the rail throws.
  void abort();

 private:
  // Polls until the communicator is no longer in progress.
  void settle(const char* what, const Deadline& deadline);

  std::mutex mu_;
  ncclComm_t comm_ = nullptr;
  std::string name_;
  int index_;
  int size_;
  int device_;
  bool aborted_ = false;
};

} // namespace smddp::transport
