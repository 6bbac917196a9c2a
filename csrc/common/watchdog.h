// A thread that watches work whose completion no thread waits for (device
// collectives: the host enqueues them and returns) and reports the first one
// that fails or outlives its deadline.
//
// Each watched item says how to tell that it is done (polled; a CUDA event
// query, say) and by when it must be. A probe, polled with the items, reports
// asynchronous failures that belong to no item (an NCCL communicator's async
// error). The first failure, an expired deadline or a probe's report, is
// handed once to `on_failure` (which aborts whatever the work waits on, so
// that it ends), and then to every item still in flight; items watched after
// that fail at once with the same reason.
//
// Threading: watch() and stop() from any thread. The watchdog's own thread
// starts with the first item, polls every `period` while items are in flight
// and sleeps without a timeout while none is (no busy loop). Callbacks run
// on that thread, never under the watchdog's lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"

namespace smddp {

class Watchdog {
 public:
  struct Item {
    // "allreduce #12 on cuda:0", for the message.
    std::string label;
    Deadline deadline;
    // True once the work has finished; polled on the watchdog's thread.
    std::function<bool()> done;
    // Called at most once, with the reason, if the work fails.
    std::function<void(const std::string& why)> fail;
    // What the work waits on and what to look at, appended to the message
    // of a timeout (may be null); asked only then.
    std::function<std::string()> stuck;
  };

  // `probe` returns a non-empty reason when something failed on its own (may
  // be null); `on_failure` is called once with the first reason.
  Watchdog(
      std::chrono::milliseconds period,
      std::function<std::string()> probe,
      std::function<void(const std::string& why)> on_failure);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void watch(Item item);
  // Items not yet done (for tests and describe()).
  size_t inFlight();
  // The first failure's reason, "" if none.
  std::string failure();
  // Ends the thread; items still in flight are dropped unreported.
  void stop();

 private:
  struct Entry {
    uint64_t id;
    Item item;
  };
  void loop();

  const std::chrono::milliseconds period_;
  const std::function<std::string()> probe_;
  const std::function<void(const std::string&)> on_failure_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Entry> items_;
  uint64_t next_id_ = 0;
  std::string failure_;
  bool stop_ = false;
  bool started_ = false;
  std::thread thread_;
};

} // namespace smddp
