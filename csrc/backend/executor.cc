#include "backend/executor.h"

#include <pthread.h>

#include "backend/work_smddp.h"
#include "common/error.h"

namespace smddp {

namespace {

// The executor whose work's future callbacks this thread is running.
thread_local Executor* tl_in_callbacks = nullptr;

} // namespace

Executor::Executor(std::string name) : name_(std::move(name)) {
  std::lock_guard<std::mutex> lock(mu_);
  threads_.emplace_back([this] { loop(); });
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
    threads_.emplace_back([this] { loop(); });
  } else {
    cv_.notify_one();
  }
}

void Executor::runClaimed(const WorkPtr& work, uint64_t first_seq, bool on_own_thread) {
  work->runBody(first_seq);
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    work->body_done_ = true;
    callbacks_waiting_ -= work->awaited_by_callbacks_;
    work->awaited_by_callbacks_ = 0;
    ++in_callbacks_;
    wakeLocked();
  }
  Executor* const outer = tl_in_callbacks;
  tl_in_callbacks = this;
  work->complete();
  tl_in_callbacks = outer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --in_callbacks_;
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
  // shutdown() may be waiting for idleness.
  idle_cv_.notify_all();
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

void Executor::prepareWait(WorkSMDDP* work, bool may_run_here) {
  std::unique_lock<std::mutex> lock(mu_);
  if (work->body_done_ || stop_) {
    return;
  }
  if (tl_in_callbacks == this) {
    // Until `work` has run, this callback holds nothing up.
    ++work->awaited_by_callbacks_;
    ++callbacks_waiting_;
  }
  if (may_run_here && nextLocked() == work) {
    uint64_t first = 0;
    WorkPtr claimed = claimLocked(&first);
    lock.unlock();
    runClaimed(claimed, first, false);
    return;
  }
  wakeLocked();
}

void Executor::loop() {
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  std::unique_lock<std::mutex> lock(mu_);
  ++idle_threads_;
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
  for (auto& w : orphans) {
    w->fail(reason);
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
