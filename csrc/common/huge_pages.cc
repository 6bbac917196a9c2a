#include "common/huge_pages.h"

#include <cerrno>
#include <fstream>
#include <string>

#include <fcntl.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/log.h"

namespace smddp {

namespace {

constexpr uintptr_t kHuge = uintptr_t{2} << 20;

#ifndef MADV_COLLAPSE
constexpr int kMadvCollapse = 25; // Linux 6.1; older headers lack it
#else
constexpr int kMadvCollapse = MADV_COLLAPSE;
#endif

// PAGEMAP_SCAN (Linux 6.7), spelled out for headers that predate it.
struct PageRegion {
  uint64_t start;
  uint64_t end;
  uint64_t categories;
};
struct PmScanArg {
  uint64_t size;
  uint64_t flags;
  uint64_t start;
  uint64_t end;
  uint64_t walk_end;
  uint64_t vec;
  uint64_t vec_len;
  uint64_t max_pages;
  uint64_t category_inverted;
  uint64_t category_mask;
  uint64_t category_anyof_mask;
  uint64_t return_mask;
};
constexpr uint64_t kPageIsHuge = uint64_t{1} << 6;
constexpr unsigned long kPagemapScan = _IOWR('f', 16, PmScanArg);

// `cached` (-1: not yet) or probe() once; the probe runs outside `mu`, since
// the collapse probe takes it itself (isHuge).
template <typename F>
bool probeOnce(std::mutex& mu, int& cached, F probe) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (cached >= 0) {
      return cached == 1;
    }
  }
  const bool ok = probe();
  std::lock_guard<std::mutex> lock(mu);
  cached = ok ? 1 : 0;
  return ok;
}

} // namespace

HugePages::HugePages() = default;

HugePages::~HugePages() {
  if (pagemap_fd_ >= 0) {
    ::close(pagemap_fd_);
  }
}

HugePages& HugePages::process() {
  // Never destroyed: executor threads may still use it during exit.
  static HugePages* instance = [] {
    auto* hp = new HugePages();
    // A fork while another thread holds mu_ would leave it locked for good
    // in the child: hold it across the fork, then release it on both sides.
    ::pthread_atfork(
        [] { process().mu_.lock(); }, [] { process().mu_.unlock(); }, [] { process().mu_.unlock(); });
    return hp;
  }();
  return *instance;
}

bool HugePages::allowed() {
  return probeOnce(mu_, allowed_, [] {
    // The host's and the process's own choices come first: MADV_COLLAPSE
    // ignores THP's "never", and MADV_HUGEPAGE would lift the process's
    // PR_SET_THP_DISABLE.
    std::string setting;
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::getline(f, setting);
    const bool process_disabled = ::prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1;
    const bool ok = !setting.empty() && setting.find("[never]") == std::string::npos && !process_disabled;
    if (!ok) {
      SMDDP_LOG(kDebug, "huge pages: off (transparent huge pages '", setting, "', disabled for this process: ",
                process_disabled ? "yes" : "no", ")");
    }
    return ok;
  });
}

int HugePages::pagemapFd() {
  const pid_t pid = ::getpid();
  if (pagemap_fd_ >= 0 && pagemap_pid_ == pid) {
    return pagemap_fd_;
  }
  // After a fork the inherited descriptor still describes the parent.
  if (pagemap_fd_ >= 0) {
    ::close(pagemap_fd_);
  }
  pagemap_fd_ = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  pagemap_pid_ = pid;
  return pagemap_fd_;
}

bool HugePages::allHuge(int fd, uintptr_t begin, uintptr_t end) {
  if (fd < 0 || end <= begin) {
    return false;
  }
  // Asks for the first page that is not huge; none found means all are.
  // (A hole in the address space has no pages and passes: callers ask only
  // about buffers they were handed.)
  PageRegion found{};
  PmScanArg arg{};
  arg.size = sizeof(arg);
  arg.start = begin;
  arg.end = end;
  arg.vec = reinterpret_cast<uintptr_t>(&found);
  arg.vec_len = 1;
  arg.max_pages = 1;
  arg.category_inverted = kPageIsHuge;
  arg.category_mask = kPageIsHuge;
  arg.return_mask = kPageIsHuge;
  return ::ioctl(fd, kPagemapScan, &arg) == 0;
}

bool HugePages::isHuge(const void* p, size_t bytes) {
  int fd = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fd = pagemapFd();
  }
  const auto begin = reinterpret_cast<uintptr_t>(p);
  return allHuge(fd, begin, begin + bytes);
}

bool HugePages::canCollapse() {
  return probeOnce(mu_, can_collapse_, [this] {
    bool ok = false;
    // One aligned huge page of a scratch mapping: does the kernel collapse
    // it, and does PAGEMAP_SCAN then see it?
    void* map = ::mmap(nullptr, 2 * kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map != MAP_FAILED) {
      auto* page = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(map) + kHuge - 1) & ~(kHuge - 1));
      page[0] = 1;
      ok = ::madvise(page, kHuge, kMadvCollapse) == 0 && isHuge(page, kHuge);
      ::munmap(map, 2 * kHuge);
    }
    SMDDP_LOG(kDebug, "huge pages: ", ok ? "collapse and PAGEMAP_SCAN available"
                                         : "no MADV_COLLAPSE or PAGEMAP_SCAN here; advice only");
    return ok;
  });
}

HugePages::Range& HugePages::lookup(uintptr_t begin, uintptr_t end, bool* seen) {
  // Evicts the least recently used range, sparing ranges marked as replaced
  // between calls: forgetting one would cost it another collapse.
  Range* victim = nullptr;
  Range* oldest = &ranges_[0];
  for (Range& r : ranges_) {
    if (r.begin == begin && r.end == end) {
      *seen = true;
      r.last_use = ++clock_;
      return r;
    }
    if (r.last_use < oldest->last_use) {
      oldest = &r;
    }
    if (!r.churns && (victim == nullptr || r.last_use < victim->last_use)) {
      victim = &r;
    }
  }
  if (victim == nullptr) {
    victim = oldest;
  }
  *seen = false;
  *victim = Range{begin, end, ++clock_, false, false};
  return *victim;
}

HugePages::Action HugePages::prepare(const void* p, size_t bytes, HugePageMode mode, size_t min_bytes) {
  if (mode == HugePageMode::kOff || p == nullptr) {
    return kNone;
  }
  const auto addr = reinterpret_cast<uintptr_t>(p);
  const uintptr_t begin = (addr + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (addr + bytes) & ~(kHuge - 1);
  if (end <= begin || end - begin < min_bytes || !allowed()) {
    return kNone;
  }
  void* range = reinterpret_cast<void*>(begin);
  const size_t len = end - begin;
  const bool collapse_here = mode == HugePageMode::kAuto && canCollapse();
  bool consider = false;
  int fd = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    bool seen = false;
    const Range& r = lookup(begin, end, &seen);
    consider = seen && collapse_here && !r.churns;
    fd = consider ? pagemapFd() : -1;
  }
  bool collapse = false;
  if (consider) {
    // Huge already (collapsed before, or faulted in after the advice):
    // nothing to do, and the common case of a reused buffer. The scan
    // takes the address space's lock: not under mu_.
    if (allHuge(fd, begin, end)) {
      return kNone;
    }
    std::lock_guard<std::mutex> lock(mu_);
    bool seen = false;
    Range& r = lookup(begin, end, &seen);
    if (r.collapsed) {
      r.churns = true;
    } else {
      r.collapsed = collapse = true;
    }
  }
  if (consider && !collapse) {
    SMDDP_LOG(kDebug, "huge pages: the buffer at ", range, " (", len,
              " bytes) lost its huge pages since its collapse; not collapsing it again");
  }
  // Every call: a buffer mapped anew at the same address has lost the
  // advice, and pages it has not written yet still benefit from it.
  ::madvise(range, len, MADV_HUGEPAGE);
  if (!collapse) {
    return kAdvised;
  }
  int rc = ::madvise(range, len, kMadvCollapse);
  if (rc != 0 && (errno == EAGAIN || errno == ENOMEM)) {
    // Transient (a page locked while khugepaged works on the same range, a
    // huge page not found at once): the collapse keeps what it did, and one
    // more pass takes the rest while the buffer is known to be reused.
    rc = ::madvise(range, len, kMadvCollapse);
  }
  if (rc != 0) {
    SMDDP_LOG(kDebug, "huge pages: collapsing ", len, " bytes failed (errno ", errno, ")");
    return kAdvised;
  }
  return kCollapsed;
}

} // namespace smddp
