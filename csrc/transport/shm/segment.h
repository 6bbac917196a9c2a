// A POSIX shared-memory segment private to this user and this job.
//
// Names are /smddp-<uid>-<creator pid>-<creator start time>-<creator pid
// namespace>-<128-bit random token>: nobody can guess them, and the mode is
// 0600. The creator removes the name as soon as every rank has mapped the
// segment, so after set-up nothing is left in /dev/shm even if the job is
// killed; the memory lives as long as a mapping does. Names left by a job
// that died during set-up are removed by sweepStaleSegments(), which every
// new group runs first: a name of this pid namespace whose creator process
// no longer exists (pid and start time) goes.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "common/error.h"

namespace smddp::transport {

// /dev/shm has no room for a new segment.
class ShmSpaceError : public Error {
 public:
  using Error::Error;
  ~ShmSpaceError() override; // out of line: one vtable, as Error's
};

class SharedSegment {
 public:
  // Creates a new segment of `bytes` (zeroed, every page reserved and
  // populated): one that /dev/shm cannot hold is an error here, never a
  // SIGBUS at a later first touch.
  static std::unique_ptr<SharedSegment> create(size_t bytes);
  // Maps the segment created under `name`; its size must be `bytes`.
  static std::unique_ptr<SharedSegment> attach(const std::string& name, size_t bytes);

  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  // Removes the name (idempotent); mappings stay valid.
  void unlinkName();

  void* data() const {
    return data_;
  }
  size_t size() const {
    return size_;
  }
  const std::string& name() const {
    return name_;
  }

 private:
  SharedSegment(std::string name, void* data, size_t size, bool owner);
  std::string name_;
  void* data_;
  size_t size_;
  bool owner_;
  bool linked_;
};

// Removes this user's segments whose creator is gone. Returns how many.
int sweepStaleSegments();

// Start time of a process in clock ticks since boot (/proc/<pid>/stat field
// 22), or 0 if it does not exist. With the pid it names a process uniquely.
unsigned long long processStartTime(int pid);

// The parent of process `pid`, or 0 if it is gone.
int parentPid(int pid);

// 16 random bytes, hex-encoded (getrandom).
std::string randomToken();

} // namespace smddp::transport
