#include "transport/shm/node_arena.h"

#include <poll.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/error.h"
#include "common/log.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace smddp::transport {

namespace {

constexpr uint64_t kMagic = 0x736d646470617231ull; // "smddpar1"
constexpr uint32_t kVersion = 3;

size_t alignUp(size_t x, size_t a) {
  return (x + a - 1) / a * a;
}

size_t controlsOffset() {
  return alignUp(sizeof(ArenaHeader), 4096);
}

size_t pairsOffset(int local_size) {
  return alignUp(controlsOffset() + sizeof(RankControl) * static_cast<size_t>(local_size), 64);
}

size_t slotsOffset(int local_size) {
  return alignUp(
      pairsOffset(local_size) + sizeof(PairLine) * static_cast<size_t>(local_size) * static_cast<size_t>(local_size),
      4096);
}

size_t totalBytes(int local_size, size_t slot_bytes) {
  return slotsOffset(local_size) + static_cast<size_t>(local_size) * 2 * slot_bytes;
}

} // namespace

int nearestCommonAncestor(const std::vector<int>& pids) {
  if (pids.empty()) {
    return 0;
  }
  auto lineOf = [](int pid) {
    std::vector<int> line;
    // Bounded: a parent chain that loops (pids reused while it is walked)
    // must not hang set-up.
    for (int p = pid; p > 0 && line.size() < 4096; p = parentPid(p)) {
      line.push_back(p);
    }
    return line;
  };
  const std::vector<int> mine = lineOf(pids[0]);
  std::vector<std::vector<int>> others;
  for (size_t i = 1; i < pids.size(); ++i) {
    others.push_back(lineOf(pids[i]));
  }
  for (int candidate : mine) {
    bool shared = true;
    for (const auto& line : others) {
      shared = shared && std::find(line.begin(), line.end(), candidate) != line.end();
    }
    if (shared) {
      return candidate;
    }
  }
  return 0;
}

int yamaPtraceScope() {
  std::ifstream f("/proc/sys/kernel/yama/ptrace_scope");
  int scope = -1;
  if (!(f >> scope)) {
    return -1;
  }
  return scope;
}

NodeArena::NodeArena(
    Store& store,
    const std::string& key,
    int local_rank,
    const std::vector<int>& group_ranks,
    const Options& options)
    : options_(options),
      local_rank_(local_rank),
      local_size_(static_cast<int>(group_ranks.size())),
      group_ranks_(group_ranks),
      slot_bytes_(options.slot_bytes) {
  const Deadline deadline = Deadline::after(options_.timeout);
  // A staged ReduceScatter round holds one element for each local rank in a
  // slot; every rank of the node computes this alike, so all fail together.
  constexpr size_t kWidestElement = 8;
  const size_t least = static_cast<size_t>(local_size_) * kWidestElement;
  if (slot_bytes_ < least) {
    SMDDP_THROW(
        kConfig,
        "a staging slot of ",
        slot_bytes_,
        " bytes cannot hold one 8-byte element for each of the node's ",
        local_size_,
        " ranks (local rank ",
        local_rank_,
        "); set SMDDP_SHM_SLOT_BYTES to at least ",
        std::max<size_t>(4096, (least + 63) / 64 * 64));
  }
  const size_t total = totalBytes(local_size_, slot_bytes_);
  // A rank that cannot map the segment says so here, for the others waiting
  // until every rank has.
  FailureBoard failures(store, key + "/failed", std::chrono::milliseconds(500));
  if (local_rank_ == 0) {
    sweepStaleSegments();
    // The node's other ranks wait for the segment's name: on a failure they
    // get the reason instead, and fail now rather than at the group's timeout.
    auto tellPeers = [&](const std::string& why) {
      try {
        store.set(key, taggedFailure(why));
      } catch (const std::exception&) {
        // The store failing too: this rank's own error is the one to raise.
      }
    };
    try {
      segment_ = SharedSegment::create(total);
    } catch (const ShmSpaceError& e) {
      std::string why = str(
          "the shared memory of this group's ", local_size_, " ranks on the node (",
          local_size_, " x 2 slots of ", slot_bytes_, " bytes, and a header) does not fit: ", e.what(),
          ". Give /dev/shm more room (Docker: --shm-size=1g or --ipc=host; Kubernetes: an emptyDir "
          "with medium Memory mounted at /dev/shm)");
      if (options_.slot_setting != nullptr) {
        why += str(", or lower ", options_.slot_setting, " (every group on a node takes 2 slots per local rank)");
      }
      tellPeers(why);
      SMDDP_THROW(kComm, why);
    } catch (const Error& e) {
      tellPeers(e.what());
      throw;
    }
    header_ = static_cast<ArenaHeader*>(segment_->data());
    new (header_) ArenaHeader();
    header_->magic = kMagic;
    header_->version = kVersion;
    header_->local_size = static_cast<uint32_t>(local_size_);
    header_->slot_bytes = slot_bytes_;
    header_->total_bytes = total;
    auto* controls = reinterpret_cast<RankControl*>(
        static_cast<uint8_t*>(segment_->data()) + controlsOffset());
    for (int l = 0; l < local_size_; ++l) {
      new (&controls[l]) RankControl();
    }
    auto* pairs = reinterpret_cast<PairLine*>(
        static_cast<uint8_t*>(segment_->data()) + pairsOffset(local_size_));
    for (int i = 0; i < local_size_ * local_size_; ++i) {
      new (&pairs[i]) PairLine();
    }
    store.set(key, taggedValue(toBytes(segment_->name())));
  } else {
    std::vector<uint8_t> published;
    std::string why;
    if (!untag(store.get(key), &published, &why)) {
      SMDDP_THROW(
          kComm, "local rank 0 of the node (rank ", group_ranks_[0], ") could not create the node's shared memory: ",
          why);
    }
    const std::string name = toString(published);
    try {
      segment_ = SharedSegment::attach(name, total);
    } catch (const Error& e) {
      // The node's other ranks wait for this one to map it: tell them why
      // it will not, so that they fail now rather than at the timeout.
      failures.publish(str("local rank ", local_rank_, " (rank ", group_ranks_[local_rank_],
                           ") could not map the node's shared memory: ", e.what()));
      throw;
    }
    header_ = static_cast<ArenaHeader*>(segment_->data());
    if (header_->magic != kMagic || header_->version != kVersion ||
        header_->local_size != static_cast<uint32_t>(local_size_) ||
        header_->slot_bytes != slot_bytes_) {
      SMDDP_THROW(
          kComm,
          "shared-memory segment ",
          name,
          " does not match this rank's layout (local size ",
          header_->local_size,
          " vs ",
          local_size_,
          ", slot bytes ",
          header_->slot_bytes,
          " vs ",
          slot_bytes_,
          "); do all ranks of the node run the same smddp with the same "
          "SMDDP_* settings?");
    }
  }
  controls_ = reinterpret_cast<RankControl*>(
      static_cast<uint8_t*>(segment_->data()) + controlsOffset());
  pairs_ = reinterpret_cast<PairLine*>(static_cast<uint8_t*>(segment_->data()) + pairsOffset(local_size_));
  slots_ = static_cast<uint8_t*>(segment_->data()) + slotsOffset(local_size_);
  initControl();
  waitAttached(deadline, [&] { failures.check(); });
  try {
    if (local_rank_ == 0) {
      // Everybody has mapped it: the name is no longer needed.
      segment_->unlinkName();
    }
    probeSingleCopy(deadline);
  } catch (...) {
    // No destructor runs for a constructor that throws.
    closePidfds();
    throw;
  }
}

NodeArena::~NodeArena() {
  closePidfds();
}

void NodeArena::closePidfds() {
  for (int& fd : pidfds_) {
    if (fd >= 0) {
      ::close(fd);
      fd = -1;
    }
  }
}

void NodeArena::initControl() {
  RankControl& me = controls_[local_rank_];
  me.pid = static_cast<int32_t>(::getpid());
  me.start_time = processStartTime(me.pid);
  me.attached = 1;
  header_->attached.fetch_add(1, std::memory_order_seq_cst);
  for (int l = 0; l < local_size_; ++l) {
    controls_[l].bell.ring();
  }
}

void NodeArena::waitAttached(const Deadline& deadline, const WaitCheck& check) {
  // Each rank rings every bell after attaching, so waiting on ours works.
  waitUntil(
      controls_[local_rank_].bell,
      [&] {
        return header_->attached.load(std::memory_order_seq_cst) ==
            static_cast<uint32_t>(local_size_);
      },
      options_.wait,
      deadline,
      check,
      [&] {
        return str(
            "the ranks of this node to map the shared-memory segment (",
            header_->attached.load(),
            " of ",
            local_size_,
            " have)");
      });
  pids_.assign(static_cast<size_t>(local_size_), 0);
  pidfds_.assign(static_cast<size_t>(local_size_), -1);
  for (int l = 0; l < local_size_; ++l) {
    pids_[l] = controls_[l].pid;
    if (l != local_rank_) {
      long fd = ::syscall(SYS_pidfd_open, pids_[l], 0);
      pidfds_[l] = fd >= 0 ? static_cast<int>(fd) : -1;
    }
  }
}

void NodeArena::allowNodePeersToRead() {
  // Under Yama's ptrace_scope 1 (Ubuntu's default) a process may read
  // another's memory only if it descends from it, or from the tracer that
  // the other declared (PR_SET_PTRACER). The node's ranks are siblings
  // under their launcher, so each declares the nearest ancestor they all
  // share: exactly that launcher's descendants may then read it, where
  // scope 0 lets every process of the user. Init is never declared (that
  // would be scope 0 for this process); the probe then finds single-copy
  // unavailable, as it does under scopes 2 and 3.
  if (local_size_ < 2 || yamaPtraceScope() != 1) {
    return;
  }
  const int ancestor = nearestCommonAncestor(pids_);
  if (ancestor <= 1) {
    SMDDP_LOG(kInfo, "kernel.yama.ptrace_scope is 1 and the node's ranks share no launcher below init: "
              "single-copy transfers need it to be 0 (sysctl kernel.yama.ptrace_scope=0)");
    return;
  }
  if (::prctl(PR_SET_PTRACER, static_cast<unsigned long>(ancestor), 0, 0, 0) != 0) {
    SMDDP_LOG(kInfo, "prctl(PR_SET_PTRACER, ", ancestor, ") failed: ", errnoString(errno));
    return;
  }
  SMDDP_LOG(kDebug, "kernel.yama.ptrace_scope is 1: declared the ranks' launcher (pid ", ancestor,
            ") as this process's tracer, so that the node's ranks may read its memory");
}

void NodeArena::probeSingleCopy(const Deadline& deadline) {
  // Each rank publishes the address and value of a private cookie, and the
  // address of a private word; the others try to read the cookie with
  // process_vm_readv and to write it back into the word with
  // process_vm_writev (a sandbox may allow one and not the other). Only if
  // every rank reads and writes every other does the node use single-copy
  // paths.
  RankControl& me = controls_[local_rank_];
  probe_cookie_ = (static_cast<uint64_t>(me.pid) << 20) ^ 0x5a5a5a5a12345678ull ^
      reinterpret_cast<uint64_t>(this);
  me.cookie = probe_cookie_;
  me.cookie_addr = reinterpret_cast<uint64_t>(&probe_cookie_);
  me.echo_addr = reinterpret_cast<uint64_t>(&probe_echo_);
  allowNodePeersToRead();
  post();
  waitAllPhase(my_phase_, deadline);
  bool ok = true;
  for (int l = 0; l < local_size_ && ok; ++l) {
    if (l == local_rank_) {
      continue;
    }
    uint64_t got = 0;
    struct iovec local = {&got, sizeof(got)};
    struct iovec remote = {reinterpret_cast<void*>(controls_[l].cookie_addr), sizeof(got)};
    ssize_t n = ::process_vm_readv(pids_[l], &local, 1, &remote, 1, 0);
    const char* what = "reading";
    if (n == static_cast<ssize_t>(sizeof(got)) && got == controls_[l].cookie) {
      struct iovec echo = {reinterpret_cast<void*>(controls_[l].echo_addr), sizeof(got)};
      n = ::process_vm_writev(pids_[l], &local, 1, &echo, 1, 0);
      what = "writing";
      if (n == static_cast<ssize_t>(sizeof(got))) {
        continue;
      }
    }
    int err = errno;
    const int scope = yamaPtraceScope();
    SMDDP_LOG(
        kInfo,
        "single-copy transfers between ranks of this node are unavailable (rank ",
        group_ranks_[local_rank_],
        " ",
        what,
        " rank ",
        group_ranks_[l],
        ": ",
        n < 0 ? errnoString(err) : std::string("wrong data"),
        scope > 0 ? str("; kernel.yama.ptrace_scope is ", scope) : std::string(),
        "); staging through shared memory");
    ok = false;
  }
  me.single_copy_ok = ok ? 1 : 0;
  post();
  waitAllPhase(my_phase_, deadline);
  single_copy_ok_ = true;
  for (int l = 0; l < local_size_; ++l) {
    single_copy_ok_ = single_copy_ok_ && controls_[l].single_copy_ok == 1;
  }
}

void NodeArena::post() {
  RankControl& me = controls_[local_rank_];
  ++my_phase_;
  me.phase.store(my_phase_, std::memory_order_seq_cst);
  me.bell.ring();
}

void NodeArena::postProgress(uint32_t value) {
  RankControl& me = controls_[local_rank_];
  my_progress_ = value;
  me.progress.store(value, std::memory_order_seq_cst);
  me.bell.ring();
}

// How long a waiter whose deadline passed still listens for the awaited
// peer's own failure (waitCounter). Short against any group timeout a user
// sets, long against the skew between two ranks' deadlines in one call.
constexpr std::chrono::milliseconds kPeerCauseGrace{1000};

static inline bool reached(uint32_t value, uint32_t target) {
  // Wrap-around safe: counters are compared by distance.
  return static_cast<int32_t>(value - target) >= 0;
}

void NodeArena::waitCounter(
    int l,
    std::atomic<uint32_t> RankControl::*counter,
    uint32_t target,
    const Deadline& deadline) {
  RankControl& peer = controls_[l];
  std::atomic<uint32_t>& value = peer.*counter;
  // The awaited peer is usually in the same call, stuck on something of its
  // own (a cut link, a rank of another node) with a deadline a moment later
  // than ours. Its abort names that cause, which is what the user needs; our
  // timeout would name only the peer. So the wait lasts a short grace past
  // the deadline, in which the peer may post it.
  waitUntil(
      peer.bell,
      [&] {
        return reached(value.load(std::memory_order_acquire), target) ||
            header_->aborted.load(std::memory_order_relaxed) != 0;
      },
      options_.wait,
      deadline.later(kPeerCauseGrace),
      [&] {
        checkAborted();
        // A peer that reached the target and then exited is no failure: look
        // at the counter again once the exit is seen.
        if (peerExited(l) && !reached(value.load(std::memory_order_acquire), target)) {
          checkAlive(l);
        }
      },
      [&] { return describePeer(l); });
  checkAborted();
}

void NodeArena::waitPhase(int l, uint32_t target, const Deadline& deadline) {
  waitCounter(l, &RankControl::phase, target, deadline);
}

void NodeArena::waitAllPhase(uint32_t target, const Deadline& deadline) {
  for (int l = 0; l < local_size_; ++l) {
    if (l != local_rank_) {
      waitPhase(l, target, deadline);
    }
  }
}

void NodeArena::waitProgress(int l, uint32_t target, const Deadline& deadline) {
  waitCounter(l, &RankControl::progress, target, deadline);
}

void NodeArena::readFrom(int l, void* dst, uint64_t src, size_t bytes) {
  crossMemory(l, static_cast<uint8_t*>(dst), src, bytes, false);
}

void NodeArena::writeTo(int l, uint64_t dst, const void* src, size_t bytes) {
  crossMemory(l, static_cast<uint8_t*>(const_cast<void*>(src)), dst, bytes, true);
}

void NodeArena::crossMemory(int l, uint8_t* local, uint64_t remote, size_t bytes, bool write) {
  while (bytes > 0) {
    struct iovec mine = {local, bytes};
    struct iovec theirs = {reinterpret_cast<void*>(remote), bytes};
    ssize_t n = write ? ::process_vm_writev(pids_[l], &mine, 1, &theirs, 1, 0)
                      : ::process_vm_readv(pids_[l], &mine, 1, &theirs, 1, 0);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      int err = errno;
      checkAborted();
      checkAlive(l);
      SMDDP_THROW(
          kComm,
          "single-copy ",
          write ? "write of " : "read of ",
          bytes,
          write ? " bytes to " : " bytes from ",
          describePeer(l),
          " failed: ",
          errnoString(err));
    }
    if (n == 0) {
      checkAlive(l);
      SMDDP_THROW(kComm, "single-copy ", write ? "write to " : "read from ", describePeer(l), " moved no data");
    }
    local += n;
    remote += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

void NodeArena::abort(const std::string& msg) {
  uint32_t expected = 0;
  if (header_->aborted.compare_exchange_strong(expected, 1, std::memory_order_seq_cst)) {
    std::string m = str("rank ", group_ranks_[local_rank_], " failed: ", msg);
    size_t n = std::min(m.size(), sizeof(header_->abort_msg) - 1);
    std::memcpy(header_->abort_msg, m.data(), n);
    header_->abort_msg[n] = '\0';
    header_->aborted.store(2, std::memory_order_seq_cst);
  }
  for (int l = 0; l < local_size_; ++l) {
    controls_[l].bell.ring();
    controls_[l].inbox.ring();
  }
}

uint32_t NodeArena::abortState() const {
  uint32_t a = header_->aborted.load(std::memory_order_acquire);
  // 1: another rank is writing its message right now.
  for (int i = 0; i < 1000 && a == 1; ++i) {
    yieldThread();
    a = header_->aborted.load(std::memory_order_acquire);
  }
  return a;
}

void NodeArena::checkAborted() {
  if (abortState() != 0) {
    SMDDP_THROW(kAborted, header_->abort_msg);
  }
}

std::string NodeArena::abortMessage() const {
  return abortState() == 0 ? std::string() : std::string(header_->abort_msg);
}

bool NodeArena::peerExited(int l) const {
  if (l == local_rank_) {
    return false;
  }
  if (pidfds_[l] >= 0) {
    struct pollfd p = {pidfds_[l], POLLIN, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
  }
  return ::kill(pids_[l], 0) != 0 && errno == ESRCH;
}

void NodeArena::checkAlive(int l) {
  if (peerExited(l)) {
    std::string msg = str(describePeer(l), " exited");
    abort(msg);
    SMDDP_THROW(kPeerLost, msg);
  }
}

std::string NodeArena::describePeer(int l) const {
  return str("rank ", group_ranks_[l], " (pid ", pids_.empty() ? 0 : pids_[l], ", same node)");
}

} // namespace smddp::transport
