#include "common/error.h"

#include <cstring>

namespace smddp {

Error::~Error() = default;

const char* errorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return "invalid argument";
    case ErrorKind::kConfig:
      return "invalid configuration";
    case ErrorKind::kComm:
      return "communication error";
    case ErrorKind::kTimeout:
      return "timeout";
    case ErrorKind::kPeerLost:
      return "peer lost";
    case ErrorKind::kMismatch:
      return "ranks disagree";
    case ErrorKind::kAborted:
      return "aborted";
    case ErrorKind::kInternal:
      return "internal error";
  }
  return "unknown error";
}

bool isCommunicationError(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kComm:
    case ErrorKind::kTimeout:
    case ErrorKind::kPeerLost:
    case ErrorKind::kMismatch:
    case ErrorKind::kAborted:
      return true;
    default:
      return false;
  }
}

namespace detail {

std::string where(const char* file, int line) {
  // Keep the path from csrc/ on: enough to find the line, short in a log.
  const char* p = std::strstr(file, "csrc/");
  return str(" [", p ? p + 5 : file, ":", line, "]");
}

} // namespace detail

std::string errnoString(int err) {
  char buf[256];
  // GNU strerror_r may return a static string instead of filling buf.
  const char* msg = strerror_r(err, buf, sizeof(buf));
  return str(msg, " (errno ", err, ")");
}

} // namespace smddp
