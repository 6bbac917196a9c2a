// Logging to stderr, one line per message, prefixed with "[smddp <pid>]".
//
// The level comes from SMDDP_LOG_LEVEL (see config.h) and can be changed at
// run time with setLogLevel (the Python layer does so at import).
// Thread-safe: each message is formatted first and written with one call.
#pragma once

#include <atomic>
#include <string>

#include "common/error.h"

namespace smddp {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void setLogLevel(LogLevel level);
LogLevel logLevel();
bool logEnabled(LogLevel level);
void logWrite(LogLevel level, const std::string& msg);

} // namespace smddp

#define SMDDP_LOG(level, ...)                                      \
  do {                                                             \
    if (::smddp::logEnabled(::smddp::LogLevel::level)) {           \
      ::smddp::logWrite(::smddp::LogLevel::level, ::smddp::str(__VA_ARGS__)); \
    }                                                              \
  } while (0)
