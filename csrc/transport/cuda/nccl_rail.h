// The NCCL communicator of one rail (the ranks with the same local rank, one
// per node), for the inter-node stage of the CUDA schedules. On p4d/p5 it
// reaches EFA through the aws-ofi-nccl plugin; the node stage stays on
// NVLink through CUDA IPC.
//
// Created from a unique id that the rail's first member puts in the store.
// Needs one GPU per rank (NCCL refuses two ranks of a communicator on one
// GPU); with shared GPUs the CUDA schedules stage through the host instead.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "common/store.h"

namespace smddp::transport {

// Throws kComm naming `what` if `r` is not ncclSuccess.
void ncclCheck(ncclResult_t r, const char* what);

class NcclRail {
 public:
  // Collective over the rail: `index` of `size` members.
  NcclRail(Store& store, const std::string& key, int index, int size, int device);
  ~NcclRail();
  NcclRail(const NcclRail&) = delete;
  NcclRail& operator=(const NcclRail&) = delete;

  ncclComm_t comm() const {
    return comm_;
  }
  int index() const {
    return index_;
  }
  int size() const {
    return size_;
  }
  // From any thread: NCCL operations in flight fail instead of hanging.
  void abort();

 private:
  ncclComm_t comm_ = nullptr;
  int index_;
  int size_;
  bool aborted_ = false;
};

} // namespace smddp::transport
