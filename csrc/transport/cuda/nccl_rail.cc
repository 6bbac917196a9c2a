#include "transport/cuda/nccl_rail.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "topology/topology.h"
#include "transport/cuda/ipc_arena.h"

namespace smddp::transport {

namespace {

// How long a communicator's teardown may wait for its peers to finish
// theirs before it aborts instead: a destroy must end, also when a peer died.
constexpr std::chrono::seconds kTeardownBound{10};

} // namespace

void ncclCheck(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress) {
    SMDDP_THROW(kComm, what, " failed: ", ncclGetErrorString(r), " (", ncclGetLastError(nullptr), ")");
  }
}

std::string ncclHostPerProcess() {
  // Once per process, before any NCCL call reads it: NCCL takes its host
  // hash from the environment at its first use and keeps it.
  static const std::string id = [] {
    const char* set = std::getenv("NCCL_HOSTID");
    if (set != nullptr && *set != '\0') {
      return std::string(set);
    }
    // The memory domain too: processes of other pid namespaces may share a pid.
    std::string mine = str(
        topology::hostIdentity(), "/", topology::memoryDomain(), "/process-", static_cast<long>(getpid()));
    setenv("NCCL_HOSTID", mine.c_str(), 0);
    return mine;
  }();
  return id;
}

NcclRail::NcclRail(
    Store& store,
    const std::string& key,
    const std::string& name,
    int index,
    int size,
    int device,
    const Deadline& deadline)
    : name_(name), index_(index), size_(size), device_(device) {
  cudaCheck(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId id;
  if (index == 0) {
    ncclCheck(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::vector<uint8_t> bytes(sizeof(id));
    std::memcpy(bytes.data(), &id, sizeof(id));
    store.set(key, bytes);
  } else {
    std::vector<uint8_t> bytes = store.get(key);
    SMDDP_CHECK_ARG(bytes.size() == sizeof(id), "the NCCL id of ", name_, " in the store has ", bytes.size(),
                    " bytes, expected ", sizeof(id), " (different NCCL versions on the rail's ranks?)");
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ncclCheck(ncclCommInitRankConfig(&comm_, size, id, index, &config), "ncclCommInitRankConfig (rail)");
  }
  try {
    settle("creating the NCCL communicator", deadline);
  } catch (...) {
    abort();
    throw;
  }
}

NcclRail::~NcclRail() {
  std::lock_guard<std::mutex> lock(mu_);
  if (comm_ == nullptr || aborted_) {
    return;
  }
  cudaSetDevice(device_);
  // A clean teardown flushes what was issued; one that does not settle
  // within kTeardownBound (a peer is gone) is cut short.
  ncclResult_t state = ncclCommFinalize(comm_);
  const Deadline deadline = Deadline::after(kTeardownBound);
  while (state == ncclInProgress && !deadline.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) {
      break;
    }
  }
  if (state == ncclSuccess) {
    ncclCommDestroy(comm_);
  } else {
    ncclCommAbort(comm_);
  }
  comm_ = nullptr;
}

void NcclRail::settle(const char* what, const Deadline& deadline) {
  auto pause = std::chrono::microseconds(10);
  while (true) {
    ncclResult_t state = ncclSuccess;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) {
        SMDDP_THROW(kAborted, name_, ": ", what, ": the NCCL communicator was aborted");
      }
      ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) {
        state = r;
      }
    }
    if (state == ncclSuccess) {
      return;
    }
    if (state != ncclInProgress) {
      SMDDP_THROW(kComm, name_, ": ", what, " failed: ", ncclGetErrorString(state), " (", ncclGetLastError(nullptr),
                  ")");
    }
    if (deadline.expired()) {
      SMDDP_THROW(kTimeout, name_, ": ", what,
                  " did not complete within the group's timeout (a rail peer is missing or stalled)");
    }
    // Bounded back-off: NCCL progresses on its own threads meanwhile.
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

void NcclRail::run(
    const char* what,
    const Deadline& deadline,
    const std::function<ncclResult_t(ncclComm_t)>& enqueue) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) {
      SMDDP_THROW(kAborted, name_, ": ", what, ": the NCCL communicator was aborted");
    }
    cudaCheck(cudaSetDevice(device_), "cudaSetDevice");
    ncclResult_t r = enqueue(comm_);
    if (r != ncclSuccess && r != ncclInProgress) {
      SMDDP_THROW(kComm, name_, ": ", what, " failed: ", ncclGetErrorString(r), " (", ncclGetLastError(comm_), ")");
    }
  }
  settle(what, deadline);
}

std::string NcclRail::asyncError() {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_ || comm_ == nullptr) {
    return "";
  }
  ncclResult_t state = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
  if (r != ncclSuccess) {
    state = r;
  }
  if (state == ncclSuccess || state == ncclInProgress) {
    return "";
  }
  return str(name_, ": NCCL reported ", ncclGetErrorString(state), " (", ncclGetLastError(comm_), ")");
}

void NcclRail::abort() {
  std::lock_guard<std::mutex> lock(mu_);
  if (comm_ != nullptr && !aborted_) {
    aborted_ = true;
    cudaSetDevice(device_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

} // namespace smddp::transport
