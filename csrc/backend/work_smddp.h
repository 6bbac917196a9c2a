// The Work of a natively executed collective.
//
// Lifecycle: created by a collective call with its body (a closure that owns
// the tensors), submitted to the group's Executor, run once (on an
// executor's thread or on a thread that waits for it) with the sequence
// number the executor gives it when it starts, then completed with success
// or an exception. Completion marks the future, if one was asked for (DDP's
// comm hooks chain on it), and then wakes wait(); a future asked for later
// is born completed.
//
// With a torch profiler recording on the calling thread, the work's run
// shows in the trace as a span "smddp:<op>" with the inputs' shapes, on the
// thread that ran it: from the body's start to its end (for a CUDA call, the
// host's part: enqueueing and any host rounds), as gloo shows its own.
//
// wait(timeout) first offers to run the work on the calling thread when it is
// next in line and nothing else runs (a synchronous call then costs no thread
// hand-off); otherwise it blocks. The operation's own deadline (the group's
// timeout) always applies; a shorter `timeout` given to wait() ends the wait
// with DistBackendError while the operation keeps running.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <mutex>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace smddp {

class Executor;

class WorkSMDDP : public ::c10d::Work {
 public:
  WorkSMDDP(
      int rank,
      ::c10d::OpType op_type,
      uint64_t nseq,
      const char* name,
      std::vector<at::Tensor> outputs,
      std::function<void(uint64_t first_seq)> body,
      std::shared_ptr<Executor> executor,
      std::chrono::milliseconds timeout,
      const char* profiling_title = nullptr,
      const std::optional<std::vector<at::Tensor>>& inputs = std::nullopt);
  // "smddp:<op>", interned for the process's lifetime (a profiler keeps the
  // name's pointer); nullptr when no profiler callback is registered on the
  // calling thread or globally, so that a call pays nothing else then.
  static const char* profilingTitle(const char* op);
  ~WorkSMDDP() override;

  bool isCompleted() override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  uint64_t getSequencenumber() const override {
    const uint64_t s = seq_.load(std::memory_order_acquire);
    return s == kNotStarted ? 0 : s;
  }
  std::chrono::milliseconds getTimeout() const;

  // Executor side: runs the body once, with sequence numbers from `first`
  // (the work takes nseq() of them); then markFuture() completes the future
  // (its callbacks run on this thread) and finishUp() wakes wait(). The
  // body's exception (already translated by the group) becomes the work's.
  // Neither of the last two throws.
  uint64_t nseq() const {
    return nseq_;
  }
  void runBody(uint64_t first);
  void markFuture();
  void finishUp();
  // Completes the work without running it: abandon(), then markFuture().
  void fail(std::exception_ptr error);
  // Finishes the work without running it; its future is left to
  // markFuture().
  void abandon(std::exception_ptr error);

  // CUDA collectives: after the body ran, wait()/synchronize() make the
  // caller's stream wait (on_wait), is_completed() asks the GPU (gpu_done),
  // and the future completes inside `context` (with the communication
  // stream current, so that CUDA futures record their events on it).
  // `device_error` is the failure the watchdog found after the host part
  // completed ("" while none): wait() and exception() report it.
  void setDeviceHooks(
      std::function<void()> on_wait,
      std::function<bool()> gpu_done,
      std::function<std::string()> device_error,
      std::function<void(const std::function<void()>&)> context);
  std::exception_ptr exception() const override;
  bool isSuccess() const override;

  // "allreduce #12", for messages.
  std::string label() const;

 private:
  friend class Executor;
  static constexpr uint64_t kNotStarted = ~uint64_t{0};

  // Blocks until the host part has completed; returns holding mutex_.
  std::unique_lock<std::mutex> waitHost();
  void markFuture(const c10::intrusive_ptr<c10::ivalue::Future>& future);
  // Releases the body and the profiler span's closures (and what they hold).
  void dropClosures();

  const uint64_t nseq_;
  std::atomic<uint64_t> seq_{kNotStarted};
  std::exception_ptr error_;  // the body's (or the one fail() was given)
  // Guarded by the executor's mutex: the work has finished (callbacks
  // included); how many future callbacks wait for it (executor.h).
  bool finished_ = false;
  int awaited_by_callbacks_ = 0;
  const char* const name_;
  std::vector<at::Tensor> outputs_;
  std::function<void(uint64_t)> body_;
  // The profiler span's start and end (the caller's thread-local state
  // carried to the thread that runs the body); empty when not profiled.
  std::function<void()> span_begin_;
  std::function<void()> span_end_;
  std::shared_ptr<Executor> executor_;
  std::chrono::milliseconds timeout_;
  // Made on the first getFuture() (most calls never ask for it).
  std::mutex future_mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool future_done_ = false;
  std::atomic<bool> done_{false};
  std::function<void()> on_wait_;
  std::function<bool()> gpu_done_;
  std::function<std::string()> device_error_;
  // The DistBackendError made from device_error_, once it is reported.
  mutable std::mutex device_mu_;
  mutable std::exception_ptr device_exception_;
  std::exception_ptr deviceException() const;
  std::function<void(const std::function<void()>&)> context_;
};

// An already-finished work, for calls that need no communication (a group
// of one, empty lists) or that fail before they start.
c10::intrusive_ptr<::c10d::Work> makeCompletedWork(
    int rank,
    ::c10d::OpType op_type,
    std::vector<at::Tensor> outputs,
    std::exception_ptr error = nullptr);

} // namespace smddp
