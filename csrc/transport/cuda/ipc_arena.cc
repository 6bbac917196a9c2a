#include "transport/cuda/ipc_arena.h"

#include <cstring>

#include "common/error.h"

namespace smddp::transport {

void cudaCheck(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    SMDDP_THROW(kComm, what, " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  }
}

namespace {

struct Handles {
  cudaIpcMemHandle_t mem;
  cudaIpcEventHandle_t ready;
  cudaIpcEventHandle_t done;
};

} // namespace

CudaIpcArena::CudaIpcArena(
    Store& store,
    const std::string& key,
    int local_rank,
    int local_size,
    int device,
    size_t staging_bytes)
    : local_rank_(local_rank),
      local_size_(local_size),
      device_(device),
      staging_bytes_(staging_bytes),
      staging_(static_cast<size_t>(local_size), nullptr),
      ready_(static_cast<size_t>(local_size), nullptr),
      done_(static_cast<size_t>(local_size), nullptr) {
  cudaCheck(cudaSetDevice(device_), "cudaSetDevice");
  const size_t me = static_cast<size_t>(local_rank_);
  cudaCheck(cudaMalloc(reinterpret_cast<void**>(&staging_[me]), staging_bytes_), "cudaMalloc of the staging buffer");
  const unsigned flags = cudaEventDisableTiming | cudaEventInterprocess;
  cudaCheck(cudaEventCreateWithFlags(&ready_[me], flags), "cudaEventCreate");
  cudaCheck(cudaEventCreateWithFlags(&done_[me], flags), "cudaEventCreate");
  Handles mine{};
  cudaCheck(cudaIpcGetMemHandle(&mine.mem, staging_[me]), "cudaIpcGetMemHandle");
  cudaCheck(cudaIpcGetEventHandle(&mine.ready, ready_[me]), "cudaIpcGetEventHandle");
  cudaCheck(cudaIpcGetEventHandle(&mine.done, done_[me]), "cudaIpcGetEventHandle");
  std::vector<uint8_t> bytes(sizeof(Handles));
  std::memcpy(bytes.data(), &mine, sizeof(Handles));
  auto all = storeAllGather(store, key, local_rank_, local_size_, bytes);
  for (int l = 0; l < local_size_; ++l) {
    if (l == local_rank_) {
      continue;
    }
    Handles h{};
    SMDDP_ASSERT(all[static_cast<size_t>(l)].size() == sizeof(Handles), "bad IPC handles from a peer");
    std::memcpy(&h, all[static_cast<size_t>(l)].data(), sizeof(Handles));
    void* p = nullptr;
    cudaCheck(cudaIpcOpenMemHandle(&p, h.mem, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    staging_[static_cast<size_t>(l)] = static_cast<uint8_t*>(p);
    cudaCheck(cudaIpcOpenEventHandle(&ready_[static_cast<size_t>(l)], h.ready), "cudaIpcOpenEventHandle");
    cudaCheck(cudaIpcOpenEventHandle(&done_[static_cast<size_t>(l)], h.done), "cudaIpcOpenEventHandle");
  }
}

CudaIpcArena::~CudaIpcArena() {
  cudaSetDevice(device_);
  for (int l = 0; l < local_size_; ++l) {
    const size_t i = static_cast<size_t>(l);
    if (l == local_rank_) {
      if (staging_[i] != nullptr) {
        cudaFree(staging_[i]);
      }
    } else if (staging_[i] != nullptr) {
      cudaIpcCloseMemHandle(staging_[i]);
    }
    if (ready_[i] != nullptr) {
      cudaEventDestroy(ready_[i]);
    }
    if (done_[i] != nullptr) {
      cudaEventDestroy(done_[i]);
    }
  }
}

} // namespace smddp::transport
