#include "transport/cuda/ipc_arena.h"

#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "topology/topology.h"

namespace smddp::transport {

void cudaCheck(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    SMDDP_THROW(kComm, what, " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  }
}

void zeroDeviceMemory(void* p, size_t bytes, const char* what) {
  cudaStream_t s = nullptr;
  cudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  cudaError_t err = cudaMemsetAsync(p, 0, bytes, s);
  if (err == cudaSuccess) {
    err = cudaStreamSynchronize(s);
  }
  cudaStreamDestroy(s);
  cudaCheck(err, what);
}

namespace {

struct Handles {
  cudaIpcMemHandle_t mem;
  cudaIpcEventHandle_t ready;
  cudaIpcEventHandle_t done;
};

} // namespace

CudaIpcArena::CudaIpcArena(int local_rank, int local_size, int device, size_t staging_bytes)
    : local_rank_(local_rank),
      local_size_(local_size),
      device_(device),
      staging_bytes_(staging_bytes),
      staging_(static_cast<size_t>(local_size), nullptr),
      ready_(static_cast<size_t>(local_size), nullptr),
      done_(static_cast<size_t>(local_size), nullptr) {}

std::string CudaIpcArena::identity() {
  char id[64] = {0};
  cudaCheck(cudaDeviceGetPCIBusId(id, sizeof(id), device_), "cudaDeviceGetPCIBusId");
  // The GPU as NCCL tells ranks apart: its host (NCCL_HOSTID where set, as
  // NCCL takes it) and its bus id.
  const char* host = std::getenv("NCCL_HOSTID");
  return str(host != nullptr && *host != '\0' ? std::string(host) : topology::hostIdentity(), "/", id);
}

std::vector<uint8_t> CudaIpcArena::exportLocal() {
  cudaCheck(cudaSetDevice(device_), "cudaSetDevice");
  const size_t me = static_cast<size_t>(local_rank_);
  try {
    cudaCheck(cudaMalloc(reinterpret_cast<void**>(&staging_[me]), kHeaderBytes + staging_bytes_),
              "cudaMalloc of the staging buffer");
    // The flags start at 0, as every rank's device counter does.
    zeroDeviceMemory(staging_[me], kHeaderBytes, "zeroing the staging header");
    const unsigned flags = cudaEventDisableTiming | cudaEventInterprocess;
    cudaCheck(cudaEventCreateWithFlags(&ready_[me], flags), "cudaEventCreate (interprocess)");
    cudaCheck(cudaEventCreateWithFlags(&done_[me], flags), "cudaEventCreate (interprocess)");
    Handles mine{};
    cudaCheck(cudaIpcGetMemHandle(&mine.mem, staging_[me]), "cudaIpcGetMemHandle");
    cudaCheck(cudaIpcGetEventHandle(&mine.ready, ready_[me]), "cudaIpcGetEventHandle");
    cudaCheck(cudaIpcGetEventHandle(&mine.done, done_[me]), "cudaIpcGetEventHandle");
    std::vector<uint8_t> bytes(sizeof(Handles));
    std::memcpy(bytes.data(), &mine, sizeof(Handles));
    return bytes;
  } catch (...) {
    releaseExports();
    throw;
  }
}

void CudaIpcArena::importPeer(int l, const std::vector<uint8_t>& exported) {
  SMDDP_CHECK_ARG(l >= 0 && l < local_size_ && l != local_rank_, "bad local rank ", l);
  SMDDP_CHECK_ARG(exported.size() == sizeof(Handles), "IPC handles of local rank ", l, " have ", exported.size(),
                  " bytes, expected ", sizeof(Handles), " (a different smddp or CUDA build on that rank?)");
  cudaCheck(cudaSetDevice(device_), "cudaSetDevice");
  Handles h{};
  std::memcpy(&h, exported.data(), sizeof(Handles));
  const size_t i = static_cast<size_t>(l);
  void* p = nullptr;
  cudaCheck(cudaIpcOpenMemHandle(&p, h.mem, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  staging_[i] = static_cast<uint8_t*>(p);
  cudaCheck(cudaIpcOpenEventHandle(&ready_[i], h.ready), "cudaIpcOpenEventHandle");
  cudaCheck(cudaIpcOpenEventHandle(&done_[i], h.done), "cudaIpcOpenEventHandle");
}

void CudaIpcArena::closeImports() {
  cudaSetDevice(device_);
  for (int l = 0; l < local_size_; ++l) {
    if (l == local_rank_) {
      continue;
    }
    const size_t i = static_cast<size_t>(l);
    if (staging_[i] != nullptr) {
      cudaIpcCloseMemHandle(staging_[i]);
      staging_[i] = nullptr;
    }
    if (ready_[i] != nullptr) {
      cudaEventDestroy(ready_[i]);
      ready_[i] = nullptr;
    }
    if (done_[i] != nullptr) {
      cudaEventDestroy(done_[i]);
      done_[i] = nullptr;
    }
  }
}

void CudaIpcArena::releaseExports() {
  cudaSetDevice(device_);
  const size_t me = static_cast<size_t>(local_rank_);
  if (staging_[me] != nullptr) {
    cudaFree(staging_[me]);
    staging_[me] = nullptr;
  }
  if (ready_[me] != nullptr) {
    cudaEventDestroy(ready_[me]);
    ready_[me] = nullptr;
  }
  if (done_[me] != nullptr) {
    cudaEventDestroy(done_[me]);
    done_[me] = nullptr;
  }
}

CudaIpcArena::~CudaIpcArena() {
  closeImports();
  releaseExports();
}

} // namespace smddp::transport
