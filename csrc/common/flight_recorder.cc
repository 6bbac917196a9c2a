#include "common/flight_recorder.h"

#include <unistd.h>

#include <cstdio>
#include <sstream>

#include "common/clock.h"
#include "common/error.h"

namespace smddp {

namespace {

std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string seconds(uint64_t ns) {
  if (ns == 0) {
    return "null";
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6f", static_cast<double>(ns) / 1e9);
  return buf;
}

} // namespace

FlightRecorder::FlightRecorder(size_t capacity) : ring_(capacity == 0 ? 1 : capacity) {}

const char* FlightRecorder::stateName(State s) {
  switch (s) {
    case State::kIssued:
      return "issued";
    case State::kStarted:
      return "started";
    case State::kEnqueued:
      return "enqueued";
    case State::kCompleted:
      return "completed";
    case State::kFailed:
      return "failed";
  }
  return "unknown";
}

FlightRecorder::Entry* FlightRecorder::find(uint64_t id) {
  Entry& e = ring_[id % ring_.size()];
  // An id older than the ring was overwritten: nothing to update.
  return e.id == id && e.issued_ns != 0 ? &e : nullptr;
}

uint64_t FlightRecorder::issued(const std::string& op, const std::string& detail) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_++;
  Entry& e = ring_[id % ring_.size()];
  e = Entry{};
  e.id = id;
  e.op = op;
  e.detail = detail;
  e.issued_ns = nowNs();
  return id;
}

void FlightRecorder::started(uint64_t id, uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = find(id)) {
    e->seq = seq;
    e->has_seq = true;
    e->state = State::kStarted;
    e->started_ns = nowNs();
  }
}

void FlightRecorder::enqueued(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = find(id)) {
    if (e->state == State::kStarted || e->state == State::kIssued) {
      e->state = State::kEnqueued;
    }
  }
}

void FlightRecorder::completed(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = find(id)) {
    if (e->state != State::kFailed) {
      e->state = State::kCompleted;
      e->ended_ns = nowNs();
    }
  }
}

void FlightRecorder::failed(uint64_t id, const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = find(id)) {
    e->state = State::kFailed;
    e->ended_ns = nowNs();
    e->error = error;
  }
}

std::vector<FlightRecorder::Entry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Entry> out;
  const uint64_t n = ring_.size();
  const uint64_t first = next_ > n ? next_ - n : 0;
  for (uint64_t id = first; id < next_; ++id) {
    out.push_back(ring_[id % n]);
  }
  return out;
}

std::string FlightRecorder::toJson(const std::string& group, int rank, int size, const std::string& reason) const {
  std::ostringstream os;
  os << "{\n  \"group\": " << jsonString(group) << ",\n  \"rank\": " << rank << ",\n  \"size\": " << size
     << ",\n  \"pid\": " << ::getpid() << ",\n  \"reason\": " << jsonString(reason) << ",\n  \"now\": " << seconds(nowNs())
     << ",\n  \"collectives\": [";
  const auto all = entries();
  for (size_t i = 0; i < all.size(); ++i) {
    const Entry& e = all[i];
    os << (i == 0 ? "\n" : ",\n") << "    {\"seq\": " << (e.has_seq ? std::to_string(e.seq) : "null")
       << ", \"op\": " << jsonString(e.op) << ", \"detail\": " << jsonString(e.detail) << ", \"state\": \""
       << stateName(e.state) << "\", \"issued\": " << seconds(e.issued_ns) << ", \"started\": " << seconds(e.started_ns)
       << ", \"ended\": " << seconds(e.ended_ns) << ", \"error\": " << jsonString(e.error) << "}";
  }
  os << (all.empty() ? "]\n}\n" : "\n  ]\n}\n");
  return os.str();
}

bool FlightRecorder::dump(
    const std::string& path,
    const std::string& group,
    int rank,
    int size,
    const std::string& reason) const {
  const std::string text = toJson(group, rank, size, reason);
  const std::string tmp = str(path, ".tmp", ::getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    return false;
  }
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  if (!wrote || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

std::string flightDumpPath(const std::string& prefix, const std::string& group, int rank) {
  std::string g = group.empty() ? "default" : group;
  for (char& c : g) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '_' || c == '.';
    if (!ok) {
      c = '_';
    }
  }
  return str(prefix, ".", g, ".", rank, ".json");
}

} // namespace smddp
