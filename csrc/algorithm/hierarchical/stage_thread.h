// A thread that runs one job at a time for its owner: the rail stage of a
// pipelined hierarchical call, beside the node stage on the calling thread.
//
// Threading: start() and join() are called by the owner's thread, in turn;
// the job runs on the stage thread, and join() returns after it ended (its
// writes are then visible to the owner).
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace smddp::algorithm::hierarchical {

class StageThread {
 public:
  StageThread();
  ~StageThread();
  StageThread(const StageThread&) = delete;
  StageThread& operator=(const StageThread&) = delete;

  void start(std::function<void()> job);
  // Waits for the job; returns its exception, if any.
  std::exception_ptr join();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool has_job_ = false;
  bool busy_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

} // namespace smddp::algorithm::hierarchical
