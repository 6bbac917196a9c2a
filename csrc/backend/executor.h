// Runs a group's collectives one at a time, in the order they were issued
// (every rank issues them in the same order; that order is the contract that
// lets them match up without negotiation).
//
// A work runs on whichever thread claims it first:
//   - the calling thread, at submit(), for a synchronous call (async_op
//     False) when nothing is queued or running: no hand-off at all;
//   - the calling thread of wait(), when the work is next in line and
//     nothing runs;
//   - otherwise the executor's own thread, so that async_op=True overlaps
//     with the caller's computation.
// At most one work runs at any time (busy_), whatever thread runs it.
//
// shutdown(): no new work starts; queued works fail with `reason`; the running
// one (bounded by its deadline, or cut short by an abort of the group's
// communicator) is waited for; the thread is joined.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

namespace smddp {

class WorkSMDDP;

class Executor {
 public:
  explicit Executor(std::string name);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Throws if the executor is shut down (the caller fails the work instead).
  void submit(const c10::intrusive_ptr<WorkSMDDP>& work, bool run_here_if_idle);
  // Runs `work` on the calling thread if it is next and nothing runs.
  bool runIfNext(WorkSMDDP* work);
  void shutdown(std::exception_ptr reason);
  bool isShutdown();

 private:
  void loop();
  void runClaimed(const c10::intrusive_ptr<WorkSMDDP>& work);

  const std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<c10::intrusive_ptr<WorkSMDDP>> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

} // namespace smddp
