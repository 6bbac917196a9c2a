#include "transport/shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "common/error.h"
#include "common/log.h"

namespace smddp::transport {

namespace {

constexpr const char* kShmDir = "/dev/shm";

std::string prefixForUser() {
  return str("smddp-", ::getuid(), "-");
}

void* mapFd(int fd, size_t bytes, const std::string& name) {
  void* p = ::mmap(
      nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    SMDDP_THROW(
        kComm,
        "mmap of shared-memory segment ",
        name,
        " (",
        bytes,
        " bytes) failed: ",
        errnoString(err),
        "; is /dev/shm large enough? (df -h /dev/shm)");
  }
  return p;
}

std::string mebibytes(unsigned long long bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

// ftruncate only sets a segment's size: tmpfs hands out its pages when they
// are first touched, and when /dev/shm is full that touch is a SIGBUS, in
// whichever collective first reaches the page. Reserving every page here
// turns a segment that does not fit into an error at set-up.
void reservePages(int fd, size_t bytes, const std::string& name) {
  int err = 0;
  do {
    err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  } while (err == EINTR);
  if (err != ENOSPC && err != ENOMEM && err != EFBIG && err != EDQUOT) {
    return; // reserved, or a file system that cannot reserve: mmap's populate still tries
  }
  std::string room;
  struct statvfs vfs;
  if (::statvfs(kShmDir, &vfs) == 0) {
    room = str("; ", kShmDir, " has ",
               mebibytes(static_cast<unsigned long long>(vfs.f_bavail) * vfs.f_frsize), " free of ",
               mebibytes(static_cast<unsigned long long>(vfs.f_blocks) * vfs.f_frsize));
  }
  throw ShmSpaceError(
      ErrorKind::kComm,
      str("cannot reserve ", mebibytes(bytes), " (", bytes, " bytes) of shared memory for segment ", name, ": ",
          errnoString(err), room));
}

// The pid namespace's inode (0 if unknown): a pid means something only in
// the namespace it was given in.
unsigned long long pidNamespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<unsigned long long>(st.st_ino) : 0;
}

int sweepOne(const std::string& entry) {
  // entry: smddp-<uid>-<pid>-<start>-<pid namespace>-<token>, or without
  // the namespace (named by an older smddp: judged in this one).
  int pid = 0;
  unsigned long long start = 0;
  unsigned long long ns = 0;
  unsigned uid = 0;
  char token[64] = {0};
  if (std::sscanf(entry.c_str(), "smddp-%u-%d-%llu-%llu-%63s", &uid, &pid, &start, &ns, token) != 5) {
    ns = 0;
    if (std::sscanf(entry.c_str(), "smddp-%u-%d-%llu-%63s", &uid, &pid, &start, token) != 4) {
      return 0;
    }
  }
  if (uid != ::getuid() || pid <= 0) {
    return 0;
  }
  // Made in another pid namespace (a container that shares /dev/shm but not
  // pids): its pid says nothing here, and the segment may be a live job's.
  if (ns != 0 && ns != pidNamespace()) {
    return 0;
  }
  unsigned long long now_start = processStartTime(pid);
  if (now_start != 0 && now_start == start) {
    return 0; // creator still running
  }
  if (::shm_unlink(("/" + entry).c_str()) == 0) {
    SMDDP_LOG(kInfo, "removed stale shared-memory segment ", kShmDir, "/", entry,
              " of a process that is gone (pid ", pid, ")");
    return 1;
  }
  return 0;
}

} // namespace

ShmSpaceError::~ShmSpaceError() = default;

std::string randomToken() {
  unsigned char buf[16];
  size_t got = 0;
  while (got < sizeof(buf)) {
    ssize_t n = ::getrandom(buf + got, sizeof(buf) - got, 0);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      SMDDP_SYSCHECK(-1, "getrandom");
    }
    got += static_cast<size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : buf) {
    out += hex[c >> 4];
    out += hex[c & 15];
  }
  return out;
}

namespace {

// /proc/<pid>/stat from field 3 on ("" if the process is gone): the command
// name (field 2) may contain spaces and parentheses, so it ends at the last ')'.
std::string statFieldsFromState(int pid) {
  std::ifstream f(str("/proc/", pid, "/stat"));
  std::string line;
  if (!f || !std::getline(f, line)) {
    return "";
  }
  const size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 > line.size() ? "" : line.substr(close + 2);
}

} // namespace

unsigned long long processStartTime(int pid) {
  const std::string fields = statFieldsFromState(pid);
  const char* p = fields.c_str();
  if (*p == '\0') {
    return 0;
  }
  // Fields from 3 on; start time is field 22, i.e. the 20th after ')'.
  for (int field = 3; field < 22 && *p; ++field) {
    p = std::strchr(p, ' ');
    if (p == nullptr) {
      return 0;
    }
    ++p;
  }
  return std::strtoull(p, nullptr, 10);
}

int parentPid(int pid) {
  char state = 0;
  int ppid = 0;
  return std::sscanf(statFieldsFromState(pid).c_str(), "%c %d", &state, &ppid) == 2 ? ppid : 0;
}

SharedSegment::SharedSegment(std::string name, void* data, size_t size, bool owner)
    : name_(std::move(name)), data_(data), size_(size), owner_(owner), linked_(owner) {}

std::unique_ptr<SharedSegment> SharedSegment::create(size_t bytes) {
  const int pid = static_cast<int>(::getpid());
  std::string name = str(
      "/", prefixForUser(), pid, "-", processStartTime(pid), "-", pidNamespace(), "-", randomToken());
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  SMDDP_SYSCHECK(fd, "shm_open(", name, ") for a new segment");
  // The mode given to shm_open is filtered by the umask; make sure.
  ::fchmod(fd, 0600);
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    SMDDP_THROW(
        kComm,
        "cannot size shared-memory segment ",
        name,
        " to ",
        bytes,
        " bytes: ",
        errnoString(err));
  }
  void* p = nullptr;
  try {
    reservePages(fd, bytes, name);
    p = mapFd(fd, bytes, name);
  } catch (...) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw;
  }
  ::close(fd);
  return std::unique_ptr<SharedSegment>(new SharedSegment(name, p, bytes, true));
}

std::unique_ptr<SharedSegment> SharedSegment::attach(const std::string& name, size_t bytes) {
  int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  SMDDP_SYSCHECK(fd, "shm_open(", name, ") of a peer's segment");
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    ::close(fd);
    SMDDP_THROW(
        kComm,
        "shared-memory segment ",
        name,
        " has ",
        static_cast<long long>(st.st_size),
        " bytes, expected ",
        bytes,
        "; do all ranks run the same smddp and configuration?");
  }
  void* p = nullptr;
  try {
    p = mapFd(fd, bytes, name);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return std::unique_ptr<SharedSegment>(new SharedSegment(name, p, bytes, false));
}

void SharedSegment::unlinkName() {
  if (owner_ && linked_) {
    ::shm_unlink(name_.c_str());
    linked_ = false;
  }
}

SharedSegment::~SharedSegment() {
  unlinkName();
  if (data_ != nullptr) {
    ::munmap(data_, size_);
  }
}

int sweepStaleSegments() {
  DIR* dir = ::opendir(kShmDir);
  if (dir == nullptr) {
    return 0;
  }
  const std::string prefix = prefixForUser();
  int removed = 0;
  while (struct dirent* e = ::readdir(dir)) {
    std::string entry = e->d_name;
    if (entry.compare(0, prefix.size(), prefix) == 0) {
      removed += sweepOne(entry);
    }
  }
  ::closedir(dir);
  return removed;
}

} // namespace smddp::transport
