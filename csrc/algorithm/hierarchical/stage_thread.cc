#include "algorithm/hierarchical/stage_thread.h"

#include "common/error.h"

namespace smddp::algorithm::hierarchical {

StageThread::StageThread() {
  thread_ = std::thread([this] { loop(); });
}

StageThread::~StageThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StageThread::start(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mu_);
  SMDDP_ASSERT(!has_job_ && !busy_, "stage thread already busy");
  job_ = std::move(job);
  has_job_ = true;
  busy_ = true;
  error_ = nullptr;
  cv_.notify_all();
}

std::exception_ptr StageThread::join() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
  return error_;
}

void StageThread::loop() {
  while (true) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || has_job_; });
      if (stop_ && !has_job_) {
        return;
      }
      job = std::move(job_);
      has_job_ = false;
    }
    std::exception_ptr err;
    try {
      job();
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = err;
      busy_ = false;
    }
    cv_.notify_all();
  }
}

} // namespace smddp::algorithm::hierarchical
