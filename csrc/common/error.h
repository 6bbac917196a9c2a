// Errors of the torch-free core.
//
// Two families, kept apart the way gloo does (docs/errors.md there):
//   - kInvalidArgument / kConfig: the caller did something wrong; retrying the
//     same call fails the same way.
//   - kComm / kTimeout / kPeerLost / kMismatch / kAborted: the communication
//     failed; the group is unusable afterwards and every later call on it
//     fails fast with the first error.
//   - kInternal: a broken invariant inside smddp (a bug).
// The backend layer maps the communication family to c10::DistBackendError and
// the argument family to c10::Error (RuntimeError/ValueError in Python).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace smddp {

enum class ErrorKind {
  kInvalidArgument,
  kConfig,
  kComm,
  kTimeout,
  kPeerLost,
  kMismatch,
  kAborted,
  kInternal,
};

const char* errorKindName(ErrorKind kind);

// True for the kinds that leave a group unusable (communication failures).
bool isCommunicationError(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what)
      : std::runtime_error(what), kind_(kind) {}
  // Out of line: the type's vtable and typeinfo live in one library, which
  // both extension modules share, so that each catches the other's errors.
  ~Error() override;
  ErrorKind kind() const noexcept {
    return kind_;
  }

 private:
  ErrorKind kind_;
};

namespace detail {

inline void appendAll(std::ostringstream&) {}

template <typename T, typename... Rest>
void appendAll(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  appendAll(os, rest...);
}

std::string where(const char* file, int line);

} // namespace detail

template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  detail::appendAll(os, args...);
  return os.str();
}

// Message of the last errno, as "strerror (errno N)".
std::string errnoString(int err);

} // namespace smddp

#define SMDDP_THROW(kind, ...)                        \
  throw ::smddp::Error(                               \
      ::smddp::ErrorKind::kind,                       \
      ::smddp::str(__VA_ARGS__) +                     \
          ::smddp::detail::where(__FILE__, __LINE__))

// Argument checks of the core (the backend layer uses TORCH_CHECK instead).
#define SMDDP_CHECK_ARG(cond, ...)              \
  do {                                          \
    if (!(cond)) {                              \
      SMDDP_THROW(kInvalidArgument, __VA_ARGS__); \
    }                                           \
  } while (0)

// Invariants: failing one is a bug in smddp.
#define SMDDP_ASSERT(cond, ...)                                     \
  do {                                                              \
    if (!(cond)) {                                                  \
      SMDDP_THROW(kInternal, "internal error: " #cond " ", ##__VA_ARGS__); \
    }                                                               \
  } while (0)

// System calls: `expr` returns -1 and sets errno on failure.
#define SMDDP_SYSCHECK(expr, ...)                                       \
  do {                                                                  \
    if ((expr) == -1) {                                                 \
      int smddp_err_ = errno;                                           \
      SMDDP_THROW(kComm, __VA_ARGS__, ": ", ::smddp::errnoString(smddp_err_)); \
    }                                                                   \
  } while (0)
