#include "transport/cuda/ipc_buffers.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstring>
#include <mutex>

#include "common/error.h"
#include "transport/cuda/ipc_arena.h"

namespace smddp::transport {

namespace {

// The driver's cuPointerGetAttributes, through the runtime (the extension
// does not link libcuda).
PFN_cuPointerGetAttributes_v7000 pointerGetAttributes() {
  static PFN_cuPointerGetAttributes_v7000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &p, 7000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<PFN_cuPointerGetAttributes_v7000>(p);
    }
  });
  if (fn == nullptr) {
    SMDDP_THROW(kComm, "the CUDA driver has no cuPointerGetAttributes; unset SMDDP_CUDA_ZERO_COPY");
  }
  return fn;
}

} // namespace

IpcBuffers::IpcBuffers(int device, int peers)
    : device_(device),
      mappings_(peers,
                PeerMappings::Ops{
                    [](const BufferRecord& rec) -> void* {
                      cudaIpcMemHandle_t h;
                      std::memcpy(&h, rec.handle, sizeof(h));
                      void* p = nullptr;
                      cudaCheck(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
                                "cudaIpcOpenMemHandle of a peer's buffer");
                      return p;
                    },
                    [](void* p) { cudaIpcCloseMemHandle(p); }}) {
  static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(BufferRecord::handle), "an IPC handle fills the record's");
}

IpcBuffers::~IpcBuffers() {
  cudaSetDevice(device_);
  closeAll();
}

void IpcBuffers::closeAll() {
  std::lock_guard<std::mutex> lock(mappings_mu_);
  mappings_.closeAll();
}

void IpcBuffers::close(int l, uint64_t id) {
  std::lock_guard<std::mutex> lock(mappings_mu_);
  cudaSetDevice(device_);
  mappings_.close(l, id);
}

std::vector<uint64_t> IpcBuffers::forget(uint64_t base, uint64_t size) {
  std::lock_guard<std::mutex> lock(exported_mu_);
  std::vector<uint64_t> ids;
  for (size_t i = exported_.size(); i-- > 0;) {
    const Exported& e = exported_[i];
    if (e.base < base + size && base < e.base + e.size) {
      ids.push_back(e.id);
      exported_.erase(exported_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  return ids;
}

BufferRecord IpcBuffers::describe(const void* p, size_t bytes, cudaStream_t stream) {
  BufferRecord rec;
  if (bytes == 0 || p == nullptr) {
    rec.why = Unmappable::kEmpty;
    return rec;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaCheck(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) {
    rec.why = Unmappable::kCapturing;
    return rec;
  }
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                 CU_POINTER_ATTRIBUTE_IS_MANAGED};
  unsigned int type = 0;
  int ordinal = -1;
  unsigned long long id = 0;
  CUdeviceptr start = 0;
  size_t size = 0;
  int ipc_capable = 0;
  int managed = 0;
  void* data[] = {&type, &ordinal, &id, &start, &size, &ipc_capable, &managed};
  const CUresult r = pointerGetAttributes()(
      static_cast<unsigned>(sizeof(attrs) / sizeof(attrs[0])), attrs, data, reinterpret_cast<CUdeviceptr>(p));
  const auto at = reinterpret_cast<uintptr_t>(p);
  if (r != CUDA_SUCCESS || type != CU_MEMORYTYPE_DEVICE || managed != 0 || ordinal != device_ || at < start ||
      at + bytes > start + size) {
    rec.why = Unmappable::kNotDevice;
    return rec;
  }
  if (ipc_capable == 0) {
    rec.why = Unmappable::kNotIpc;
    return rec;
  }
  rec.id = id;
  rec.base = static_cast<uint64_t>(start);
  rec.size = size;
  rec.offset = at - static_cast<uintptr_t>(start);
  std::lock_guard<std::mutex> lock(exported_mu_);
  for (const Exported& e : exported_) {
    if (e.id == id) {
      std::memcpy(rec.handle, &e.handle, sizeof(e.handle));
      return rec;
    }
  }
  Exported e{id, rec.base, rec.size, {}};
  cudaCheck(cudaIpcGetMemHandle(&e.handle, reinterpret_cast<void*>(start)), "cudaIpcGetMemHandle of a buffer");
  exported_.push_back(e);
  std::memcpy(rec.handle, &e.handle, sizeof(e.handle));
  return rec;
}

uint8_t* IpcBuffers::map(int l, const BufferRecord& rec, size_t bytes) {
  if (rec.offset > rec.size || bytes > rec.size - rec.offset) {
    SMDDP_THROW(kInternal, "local rank ", l, " published a buffer of ", bytes, " bytes at offset ", rec.offset,
                " of an allocation of ", rec.size, " bytes");
  }
  std::lock_guard<std::mutex> lock(mappings_mu_);
  return mappings_.map(l, rec);
}

} // namespace smddp::transport
