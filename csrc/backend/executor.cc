#include "backend/executor.h"

#include <pthread.h>

#include "backend/work_smddp.h"
#include "common/error.h"

namespace smddp {

Executor::Executor(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([this] { loop(); });
}

Executor::~Executor() {
  shutdown(nullptr);
}

void Executor::runClaimed(const c10::intrusive_ptr<WorkSMDDP>& work) {
  work->run();
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    queued = !queue_.empty();
  }
  // Waking the executor's thread when it has nothing to start costs two
  // context switches per synchronous call, on cores the peers need.
  if (queued) {
    cv_.notify_all();
  }
  // shutdown() may be waiting for idleness.
  idle_cv_.notify_all();
}

void Executor::submit(const c10::intrusive_ptr<WorkSMDDP>& work, bool run_here_if_idle) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stop_) {
    SMDDP_THROW(kAborted, "the process group was shut down");
  }
  if (run_here_if_idle && !busy_ && queue_.empty()) {
    busy_ = true;
    lock.unlock();
    runClaimed(work);
    return;
  }
  queue_.push_back(work);
  lock.unlock();
  cv_.notify_all();
}

bool Executor::runIfNext(WorkSMDDP* work) {
  std::unique_lock<std::mutex> lock(mu_);
  if (busy_ || queue_.empty() || queue_.front().get() != work) {
    return false;
  }
  c10::intrusive_ptr<WorkSMDDP> claimed = std::move(queue_.front());
  queue_.pop_front();
  busy_ = true;
  lock.unlock();
  runClaimed(claimed);
  return true;
}

void Executor::loop() {
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  while (true) {
    c10::intrusive_ptr<WorkSMDDP> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || (!busy_ && !queue_.empty()); });
      if (stop_) {
        return;
      }
      work = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    runClaimed(work);
  }
}

bool Executor::isShutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_;
}

void Executor::shutdown(std::exception_ptr reason) {
  std::deque<c10::intrusive_ptr<WorkSMDDP>> orphans;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!stop_) {
      stop_ = true;
      orphans.swap(queue_);
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
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) {
    thread_.join();
  } else if (thread_.joinable()) {
    thread_.detach();
  }
}

} // namespace smddp
