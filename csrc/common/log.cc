#include "common/log.h"

#include <unistd.h>

namespace smddp {

namespace {
std::atomic<int> gLevel{static_cast<int>(LogLevel::kWarn)};

const char* levelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarn:
      return "WARN";
    case LogLevel::kError:
      return "ERROR";
    default:
      return "";
  }
}
} // namespace

void setLogLevel(LogLevel level) {
  gLevel.store(static_cast<int>(level), std::memory_order_relaxed);
}

LogLevel logLevel() {
  return static_cast<LogLevel>(gLevel.load(std::memory_order_relaxed));
}

bool logEnabled(LogLevel level) {
  return static_cast<int>(level) >= gLevel.load(std::memory_order_relaxed);
}

void logWrite(LogLevel level, const std::string& msg) {
  std::string line =
      str("[smddp ", ::getpid(), "] ", levelName(level), " ", msg, "\n");
  // One write() per line so that lines of concurrent ranks do not interleave.
  size_t off = 0;
  while (off < line.size()) {
    ssize_t n = ::write(STDERR_FILENO, line.data() + off, line.size() - off);
    if (n <= 0) {
      return;
    }
    off += static_cast<size_t>(n);
  }
}

} // namespace smddp
