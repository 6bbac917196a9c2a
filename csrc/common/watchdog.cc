#include "common/watchdog.h"

#include <algorithm>

#include "common/error.h"

namespace smddp {

Watchdog::Watchdog(
    std::chrono::milliseconds period,
    std::function<std::string()> probe,
    std::function<void(const std::string&)> on_failure)
    : period_(std::max(period, std::chrono::milliseconds(1))),
      probe_(std::move(probe)),
      on_failure_(std::move(on_failure)) {}

Watchdog::~Watchdog() {
  stop();
}

void Watchdog::watch(Item item) {
  std::string failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) {
      return;
    }
    if (failure_.empty()) {
      items_.push_back(Entry{next_id_++, std::move(item)});
      if (!started_) {
        started_ = true;
        thread_ = std::thread([this] { loop(); });
      }
      cv_.notify_all();
      return;
    }
    failed = failure_;
  }
  // After a failure nothing new can finish: the work fails at once.
  if (item.fail) {
    item.fail(failed);
  }
}

size_t Watchdog::inFlight() {
  std::lock_guard<std::mutex> lock(mu_);
  return items_.size();
}

std::string Watchdog::failure() {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void Watchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) {
    thread_.join();
  }
}

void Watchdog::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (items_.empty()) {
      cv_.wait(lock, [&] { return stop_ || !items_.empty(); });
      continue;
    }
    // Poll outside the lock: the callbacks query the device.
    std::vector<Entry> polled = items_;
    lock.unlock();
    std::string why;
    std::vector<uint64_t> done;
    for (const Entry& e : polled) {
      bool finished = false;
      try {
        finished = !e.item.done || e.item.done();
      } catch (const std::exception& ex) {
        why = str(e.item.label, " failed: ", ex.what());
        break;
      }
      if (finished) {
        done.push_back(e.id);
      } else if (e.item.deadline.expired()) {
        why = str(e.item.label, " did not finish within the group's timeout");
        const std::string stuck = e.item.stuck ? e.item.stuck() : std::string();
        if (!stuck.empty()) {
          why += str("; ", stuck);
        }
        break;
      }
    }
    if (why.empty() && probe_) {
      try {
        why = probe_();
      } catch (const std::exception& ex) {
        why = ex.what();
      }
    }
    lock.lock();
    items_.erase(
        std::remove_if(
            items_.begin(), items_.end(),
            [&](const Entry& e) { return std::find(done.begin(), done.end(), e.id) != done.end(); }),
        items_.end());
    if (!why.empty()) {
      failure_ = why;
      std::vector<Entry> failed;
      failed.swap(items_);
      lock.unlock();
      if (on_failure_) {
        on_failure_(why);
      }
      for (Entry& e : failed) {
        if (e.item.fail) {
          e.item.fail(why);
        }
      }
      lock.lock();
      // Later items fail in watch(); nothing is left to poll.
      cv_.wait(lock, [&] { return stop_; });
      break;
    }
    cv_.wait_for(lock, period_, [&] { return stop_; });
  }
}

} // namespace smddp
