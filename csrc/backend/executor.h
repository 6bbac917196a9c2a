// Runs a group's collectives one at a time, in the order they were issued
// (every rank issues them in the same order; that order is the contract that
// lets them match up without negotiation). A work takes its sequence numbers
// when it starts.
//
// A work runs on whichever thread claims it first:
//   - the calling thread, at submit(), for a synchronous call (async_op
//     False) when nothing is queued or running: no hand-off at all;
//   - the calling thread of wait(), when the work is next in line and
//     nothing runs;
//   - otherwise one of the executor's own threads, so that async_op=True
//     overlaps with the caller's computation.
// At most one work runs at any time (busy_), whatever thread runs it.
//
// Future callbacks. Completing a work runs its future's callbacks on the
// thread that ran it. A callback may issue collectives itself and wait for
// them (DDP's PowerSGD hook issues two all-reduces from its callbacks and
// waits for each). The ranks must agree on where those come in the order,
// so the rule is the one that nccl's early-completed futures give: a
// collective issued from a callback of work W runs before every collective
// issued elsewhere that has not started when W finished. So, while any
// work's callbacks run, only collectives issued from callbacks start (they
// have a queue of their own, ahead of the other); the others wait, unless
// every running callback is itself waiting (through Work.wait()) for one of
// them. When every executor thread is busy in callbacks and a work can
// start, another thread is started to run it.
//
// Two things the order cannot know, and so asks of the caller (DDP's hooks
// do both): chain then() on a work's future before issuing the next
// collective (a callback added later may run on either thread, depending on
// timing); and from a callback, wait for a collective issued elsewhere
// through its Work, not its Future (the executor sees only the former).
//
// shutdown(): no new work starts; queued works fail with `reason`; the running
// one (bounded by its deadline, or cut short by an abort of the group's
// communicator) is waited for; the threads are joined.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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
  // Before a thread blocks in wait() on `work`: runs it here if
  // `may_run_here` and it can start now; from inside a future callback,
  // lets the works queued before it start (true: cancelWait() undoes that
  // for a wait that gives up early).
  bool prepareWait(WorkSMDDP* work, bool may_run_here);
  void cancelWait(WorkSMDDP* work);
  void shutdown(std::exception_ptr reason);
  bool isShutdown();

 private:
  using WorkPtr = c10::intrusive_ptr<WorkSMDDP>;

  void loop();
  // The work that may start now, if any.
  WorkSMDDP* nextLocked() const;
  // Takes the work nextLocked() named: busy_, sequence numbers.
  WorkPtr claimLocked(uint64_t* first_seq);
  // If a work may start, has a thread start it.
  void wakeLocked();
  void spawnLocked();
  void runClaimed(const WorkPtr& work, uint64_t first_seq, bool on_own_thread);

  const std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<WorkPtr> queue_;
  std::deque<WorkPtr> from_callbacks_;
  bool busy_ = false;
  bool stop_ = false;
  uint64_t next_seq_ = 0;
  int in_callbacks_ = 0;  // works whose callbacks run
  int callbacks_waiting_ = 0;  // of those, blocked in wait() on a queued work
  int idle_threads_ = 0;
  std::vector<std::thread> threads_;
};

} // namespace smddp
