// The last collectives of a process group, for a dump after a failure (in
// the spirit of torch's flight recorder): what each rank was doing when the
// job broke, so that a hang or a mismatch can be traced to the rank and the
// call that caused it.
//
// Each collective is recorded when it is issued and updated as it starts
// (with its sequence number), is enqueued on a device, and completes or
// fails. Only the last `capacity` calls are kept. SMDDP_DEBUG_DUMP names
// where a group writes them (config.h).
//
// Threading: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace smddp {

class FlightRecorder {
 public:
  enum class State : uint8_t { kIssued, kStarted, kEnqueued, kCompleted, kFailed };

  struct Entry {
    uint64_t id = 0;
    // The group's sequence number, once started (the same call on every rank).
    uint64_t seq = 0;
    bool has_seq = false;
    std::string op;      // "allreduce"
    std::string detail;  // "float32, 1024 elements, SUM, cuda:0"
    State state = State::kIssued;
    uint64_t issued_ns = 0;
    uint64_t started_ns = 0;
    uint64_t ended_ns = 0;
    std::string error;
  };

  explicit FlightRecorder(size_t capacity = 64);

  // Returns the id the other calls take.
  uint64_t issued(const std::string& op, const std::string& detail);
  void started(uint64_t id, uint64_t seq);
  void enqueued(uint64_t id);
  void completed(uint64_t id);
  void failed(uint64_t id, const std::string& error);

  // Oldest first.
  std::vector<Entry> entries() const;

  // The dump: one JSON object with the group, the rank, the reason and the
  // entries (times in seconds since the steady clock's epoch).
  std::string toJson(const std::string& group, int rank, int size, const std::string& reason) const;
  // Writes toJson() to `path` (through a temporary file and a rename, so a
  // reader never sees half of it); returns false if it could not.
  bool dump(const std::string& path, const std::string& group, int rank, int size, const std::string& reason) const;

  static const char* stateName(State s);

 private:
  Entry* find(uint64_t id);

  mutable std::mutex mu_;
  std::vector<Entry> ring_;
  uint64_t next_ = 0;
};

// Where a group's dump goes for SMDDP_DEBUG_DUMP=prefix:
// "<prefix>.<group>.<rank>.json", with characters that cannot be in a file
// name of the group replaced by '_'.
std::string flightDumpPath(const std::string& prefix, const std::string& group, int rank);

} // namespace smddp
