// Synchronization of a node's ranks by the streams themselves
// (SMDDP_CUDA_SYNC=memops): the operations of algorithm/memop_sync_protocol.h
// enqueued as CUDA stream memory operations on words in each rank's
// IPC-mapped staging header. The driver's entry points are looked up through
// the runtime, so nothing links libcuda.
#pragma once

#include <cuda_runtime.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "algorithm/memop_sync_protocol.h"

namespace smddp::algorithm::cuda {

class MemOpStream {
 public:
  // Looks up cuStreamWriteValue32 and cuStreamWaitValue32 (with `batch`,
  // cuStreamBatchMemOp) on the current device. Throws kComm naming what is
  // missing.
  explicit MemOpStream(bool batch);
  ~MemOpStream();
  MemOpStream(const MemOpStream&) = delete;
  MemOpStream& operator=(const MemOpStream&) = delete;

  // Enqueues `ops` on `stream` in order (each write fenced after the
  // stream's earlier work): one driver call per operation, or per batch.
  // Works while `stream` is being captured.
  void enqueue(const std::vector<MemOp>& ops, cudaStream_t stream) const;

  bool batched() const {
    return batch_ != nullptr;
  }

  // From now until destruction, writes `release` every millisecond on a
  // stream of its own that does not wait for the legacy stream, so that
  // every wait of this rank already enqueued, and every one enqueued later,
  // passes. Returns at once; idempotent.
  void releaseForever(const std::vector<MemOp>& release, int device);

 private:
  using MemOpFn = int (*)(void*, unsigned long long, unsigned int, unsigned int);
  using BatchFn = int (*)(void*, unsigned int, void*, unsigned int);
  MemOpFn write_ = nullptr;
  MemOpFn wait_ = nullptr;
  BatchFn batch_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread releaser_;
};

} // namespace smddp::algorithm::cuda
