#include "transport/cuda/nccl_rail.h"

#include <cstring>

#include "common/error.h"
#include "transport/cuda/ipc_arena.h"

namespace smddp::transport {

void ncclCheck(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) {
    SMDDP_THROW(kComm, what, " failed: ", ncclGetErrorString(r), " (", ncclGetLastError(nullptr), ")");
  }
}

NcclRail::NcclRail(Store& store, const std::string& key, int index, int size, int device)
    : index_(index), size_(size) {
  cudaCheck(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId id;
  if (index == 0) {
    ncclCheck(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::vector<uint8_t> bytes(sizeof(id));
    std::memcpy(bytes.data(), &id, sizeof(id));
    store.set(key, bytes);
  } else {
    std::vector<uint8_t> bytes = store.get(key);
    SMDDP_ASSERT(bytes.size() == sizeof(id), "bad NCCL id in the store");
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  ncclCheck(ncclCommInitRank(&comm_, size, id, index), "ncclCommInitRank (rail)");
}

NcclRail::~NcclRail() {
  if (comm_ != nullptr) {
    if (aborted_) {
      return;
    }
    ncclCommDestroy(comm_);
  }
}

void NcclRail::abort() {
  if (comm_ != nullptr && !aborted_) {
    aborted_ = true;
    ncclCommAbort(comm_);
  }
}

} // namespace smddp::transport
