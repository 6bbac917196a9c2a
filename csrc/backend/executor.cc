#include "backend/executor.h"

#include <pthread.h>

#include "backend/work_smddp.h"
#include "common/error.h"
#include "common/log.h"

namespace smddp {

namespace {

// The executor whose work's future callbacks this thread is running.
thread_local Executor* tl_in_callbacks = nullptr;

class InCallbacks {
 public:
  explicit InCallbacks(Executor* e) : outer_(tl_in_callbacks) {
    tl_in_callbacks = e;
  }
  ~InCallbacks() {
    tl_in_callbacks = outer_;
  }

 private:
  Executor* const outer_;
};

} // namespace

Executor::Executor(std::string name) : name_(std::move(name)) {
  std::lock_guard<std::mutex> lock(mu_);
  spawnLocked();
}

void Executor::spawnLocked() {
  try {
    threads_.emplace_back([this] { loop(); });
    // Idle from now on: until it takes mu_, it must not be spawned again.
    ++idle_threads_;
  } catch (const std::exception& e) {
    SMDDP_LOG(kError, "cannot start an executor thread: ", e.what());
  }
}

Executor::~Executor() {
  shutdown(nullptr);
}

WorkSMDDP* Executor::nextLocked() const {
  if (busy_ || stop_) {
    return nullptr;
  }
  if (!from_callbacks_.empty()) {
    return from_callbacks_.front().get();
  }
  if (!queue_.empty() && in_callbacks_ == callbacks_waiting_) {
    return queue_.front().get();
  }
  return nullptr;
}

Executor::WorkPtr Executor::claimLocked(uint64_t* first_seq) {
  std::deque<WorkPtr>& q = from_callbacks_.empty() ? queue_ : from_callbacks_;
  WorkPtr work = std::move(q.front());
  q.pop_front();
  busy_ = true;
  *first_seq = next_seq_;
  next_seq_ += work->nseq();
  return work;
}

void Executor::wakeLocked() {
  if (nextLocked() == nullptr) {
    return;
  }
  if (idle_threads_ == 0) {
    // Every executor thread is inside a future callback.
    spawnLocked();
  } else {
    cv_.notify_one();
  }
}

void Executor::runClaimed(const WorkPtr& work, uint64_t first_seq, bool on_own_thread) {
  work->runBody(first_seq);
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    ++in_callbacks_;
    wakeLocked();
  }
  // shutdown() may be waiting for idleness.
  idle_cv_.notify_all();
  {
    InCallbacks scope(this);
    work->markFuture();
  }
  // Waiters wake while this work still holds the others back, so that
  // nothing issued after it completes before it.
  work->finishUp();
  {
    std::lock_guard<std::mutex> lock(mu_);
    --in_callbacks_;
    work->finished_ = true;
    // The callbacks that waited for it are running again.
    callbacks_waiting_ -= work->awaited_by_callbacks_;
    work->awaited_by_callbacks_ = 0;
    if (on_own_thread) {
      // It looks for the next work itself (loop()).
      ++idle_threads_;
    } else {
      // Waking an executor thread only when there is something to start:
      // a useless wake-up costs two context switches per synchronous call,
      // on cores the peers need.
      wakeLocked();
    }
  }
}

void Executor::submit(const WorkPtr& work, bool run_here_if_idle) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stop_) {
    SMDDP_THROW(kAborted, "the process group was shut down");
  }
  (tl_in_callbacks == this ? from_callbacks_ : queue_).push_back(work);
  if (run_here_if_idle && nextLocked() == work.get()) {
    uint64_t first = 0;
    WorkPtr claimed = claimLocked(&first);
    lock.unlock();
    runClaimed(claimed, first, false);
    return;
  }
  wakeLocked();
}

bool Executor::prepareWait(WorkSMDDP* work, bool may_run_here) {
  std::unique_lock<std::mutex> lock(mu_);
  if (work->finished_ || stop_) {
    return false;
  }
  const bool counted = tl_in_callbacks == this;
  if (counted) {
    // Until `work` has finished, this callback holds nothing up.
    ++work->awaited_by_callbacks_;
    ++callbacks_waiting_;
  }
  if (may_run_here && nextLocked() == work) {
    uint64_t first = 0;
    WorkPtr claimed = claimLocked(&first);
    lock.unlock();
    runClaimed(claimed, first, false);
    return false;
  }
  wakeLocked();
  return counted;
}

void Executor::cancelWait(WorkSMDDP* work) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!work->finished_ && work->awaited_by_callbacks_ > 0) {
    --work->awaited_by_callbacks_;
    --callbacks_waiting_;
  }
}

void Executor::loop() {
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || nextLocked() != nullptr; });
    --idle_threads_;
    if (stop_) {
      return;
    }
    uint64_t first = 0;
    WorkPtr work = claimLocked(&first);
    lock.unlock();
    runClaimed(work, first, true);  // counts this thread idle again
    // Not under mu_: the last reference may free tensors, or the executor.
    work.reset();
    lock.lock();
  }
}

bool Executor::isShutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_;
}

void Executor::shutdown(std::exception_ptr reason) {
  std::deque<WorkPtr> orphans;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!stop_) {
      stop_ = true;
      orphans.swap(from_callbacks_);
      for (auto& w : queue_) {
        orphans.push_back(std::move(w));
      }
      queue_.clear();
    }
  }
  cv_.notify_all();
  if (!reason) {
    try {
      SMDDP_THROW(kAborted, "the process group was shut down before this collective ran");
    } catch (...) {
      reason = std::current_exception();
    }
  }
  // Every orphan fails before any of their callbacks runs: a callback may
  // wait for a later orphan.
  for (auto& w : orphans) {
    w->abandon(reason);
  }
  for (auto& w : orphans) {
    w->markFuture();
  }
  {
    // A work running on another thread (inline) finishes by its deadline.
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return !busy_; });
  }
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) {
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();
    } else if (t.joinable()) {
      t.join();
    }
  }
}

} // namespace smddp
