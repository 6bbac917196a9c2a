// Transparent huge pages for the user's large host buffers.
//
// Under virtualization a TLB miss costs a two-level page walk, and a copy
// between two 4 KiB-mapped buffers spends much of its time there; a
// cross-memory read (process_vm_readv, which also pins every source page)
// more so. The rule: a large copy is faster on 2 MiB pages, by what
// docs/design.md ("Where the time goes, as design rules", rule 9) measures.
// The collectives cannot choose where torch puts a tensor, but they can ask
// the kernel to back the 2 MiB-aligned interior of a large buffer with huge
// pages before they copy it:
//
//  advise    madvise(MADV_HUGEPAGE): pages not yet touched (a freshly
//            allocated output) fault in as huge pages. Cheap; does nothing
//            for pages already there.
//  collapse  madvise(MADV_COLLAPSE): turns the pages already there into huge
//            pages, now. It costs about one copy of the range, so it is done
//            only for a range seen again (a buffer reused from call to call,
//            as a benchmark's, DDP's buckets, or a training loop's that the
//            allocator hands back at the same address), only when the range
//            is not huge already (PAGEMAP_SCAN tells, exactly and cheaply),
//            and never again for a range that has lost its huge pages after
//            a collapse (its memory is replaced between calls, and each
//            collapse would be a copy thrown away).
//
// Contents and semantics of the memory are unchanged; only its page size
// differs. Errors of either madvise are ignored: the advice is an
// optimization, and a kernel without it runs the collectives as before.
// Nothing is done where the host ("never") or the process (prctl
// PR_SET_THP_DISABLE) disabled transparent huge pages. The advice does
// override a buffer's own MADV_NOHUGEPAGE (the kernel offers no cheap way to
// see it); SMDDP_HUGE_PAGES=off keeps such memory as it is.
//
// Threading: one object per process serves every group's executor threads;
// the bookkeeping is under a mutex, the system calls outside it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <sys/types.h>

#include "common/config.h"

namespace smddp {

class HugePages {
 public:
  enum Action { kNone, kAdvised, kCollapsed };

  HugePages();
  ~HugePages();
  HugePages(const HugePages&) = delete;
  HugePages& operator=(const HugePages&) = delete;

  // The instance the backend uses.
  static HugePages& process();

  // Before a collective reads or writes [p, p + bytes): what was done to the
  // range's 2 MiB-aligned interior (nothing when that is under min_bytes).
  Action prepare(const void* p, size_t bytes, HugePageMode mode, size_t min_bytes);

  // Whether this kernel can both collapse ranges and tell huge ones apart;
  // without either, kAuto acts as kAdvise.
  bool canCollapse();
  // False where the host disabled transparent huge pages ("never") or the
  // process did (prctl PR_SET_THP_DISABLE): then nothing is done.
  bool allowed();
  // Whether every page of [p, p + bytes) is a huge page; false if unknown.
  bool isHuge(const void* p, size_t bytes);

 private:
  struct Range {
    uintptr_t begin = 0;
    uintptr_t end = 0;
    uint64_t last_use = 0;
    bool collapsed = false;
    bool churns = false;
  };
  static constexpr int kRanges = 64;

  // Under mu_. The entry for [begin, end), and whether it was already there.
  Range& lookup(uintptr_t begin, uintptr_t end, bool* seen);
  // Under mu_: the pagemap of this process (reopened after a fork).
  int pagemapFd();
  // Whether every page of [begin, end) is huge (PAGEMAP_SCAN on `fd`).
  static bool allHuge(int fd, uintptr_t begin, uintptr_t end);

  std::mutex mu_;
  Range ranges_[kRanges];
  uint64_t clock_ = 0;
  int pagemap_fd_ = -1;
  pid_t pagemap_pid_ = 0;
  int can_collapse_ = -1; // -1: not probed yet
  int allowed_ = -1;
};

} // namespace smddp
