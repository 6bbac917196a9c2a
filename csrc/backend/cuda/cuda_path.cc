#include "backend/cuda/cuda_path.h"

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdlib>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "algorithm/cuda/device_reduce.h"
#include "algorithm/cuda/device_sync.h"
#include "backend/conversions.h"
#include "backend/store_adapter.h"
#include "common/error.h"
#include "common/log.h"

namespace smddp {

namespace {

// A capture in torch's default (global) mode forbids, on every thread whose
// own mode is global, the calls that might synchronize: allocations, event
// queries. This backend's threads make such calls (a communicator's
// buffers, the watchdog's queries) only on memory and events outside any
// capture's stream order, so each of them takes the relaxed mode once.
void relaxCaptureMode() {
  thread_local bool relaxed = false;
  if (!relaxed) {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    C10_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    relaxed = true;
  }
}

// Once per device and process, on the calling thread before its first
// collective there is enqueued: smddp's kernels are loaded into the device's
// context (algorithm/cuda/device_reduce.h says why not at their first
// launch). That may wait for what the caller has queued on the device, as
// creating a NCCL communicator may. In the relaxed capture mode for the
// moment, so that a capture under way on this thread is not invalidated.
void loadKernelsOnce(int device) {
  static std::mutex mu;
  static std::set<int> loaded;
  std::lock_guard<std::mutex> lock(mu);
  if (loaded.count(device) != 0) {
    return;
  }
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  C10_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  try {
    algorithm::cuda::loadReduceKernels();
    algorithm::cuda::loadSyncKernel();
  } catch (...) {
    cudaThreadExchangeStreamCaptureMode(&mode);
    throw;
  }
  C10_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  loaded.insert(device);
}

// Torch reports a segment's free to its trace trackers before it frees it,
// so that zero-copy peers close their mappings first (CUDA IPC requires
// it). Attached once, for the process's life (torch has no detach), and
// only with zero-copy: a tracker makes every allocation record a trace
// entry. False where the allocator has no trackers (cudaMallocAsync, a
// pluggable allocator) or does not cache (PYTORCH_NO_CUDA_MEMORY_CACHING):
// its frees are not announced.
bool freesAnnounced() {
  static const bool attached = [] {
    if (std::getenv("PYTORCH_NO_CUDA_MEMORY_CACHING") != nullptr ||
        c10::cuda::CUDACachingAllocator::get()->name() != "native") {
      return false;
    }
    try {
      c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker(
          [](const c10::cuda::CUDACachingAllocator::TraceEntry& te) {
            if (te.action_ == c10::cuda::CUDACachingAllocator::TraceEntry::SEGMENT_FREE) {
              algorithm::cuda::CudaCommunicator::segmentFreed(te.device_, te.addr_, te.size_);
            }
          });
      return true;
    } catch (const std::exception& e) {
      SMDDP_LOG(kWarn, "SMDDP_CUDA_ZERO_COPY: torch's allocator takes no trace tracker (", e.what(),
                "): every CUDA collective goes through the staging buffers");
      return false;
    }
  }();
  return attached;
}

// Whether every tensor's memory is the caching allocator's, whose segment
// frees are announced (not from_blob, DLPack or a pluggable allocator).
bool tracedMemory(const std::vector<at::Tensor>& tensors) {
  if (!freesAnnounced()) {
    return false;
  }
  const c10::DeleterFnPtr cached = c10::cuda::CUDACachingAllocator::get()->raw_deleter();
  for (const auto& t : tensors) {
    if (t.storage().data_ptr().get_deleter() != cached) {
      return false;
    }
  }
  return true;
}

// How often the watchdog polls the collectives in flight: a stalled one is
// reported within this much of the group's timeout, for one event query per
// collective in flight per poll.
constexpr std::chrono::milliseconds kWatchdogPeriod{100};

// Torch's caching allocators: nothing on a collective's path synchronizes
// the device, and the memory is shared with the rest of the program.
class TorchMemory : public algorithm::cuda::DeviceMemory {
 public:
  void* allocDevice(size_t bytes, cudaStream_t stream) override {
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, stream);
  }
  void freeDevice(void* p) override {
    c10::cuda::CUDACachingAllocator::raw_delete(p);
  }
  void* allocHost(size_t bytes) override {
    at::DataPtr block = at::getHostAllocator(at::kCUDA)->allocate(bytes);
    void* p = block.get();
    std::lock_guard<std::mutex> lock(mu_);
    host_.emplace(p, std::move(block));
    return p;
  }
  void freeHost(void* p, cudaStream_t stream) override {
    at::DataPtr block;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = host_.find(p);
      if (it == host_.end()) {
        return;
      }
      block = std::move(it->second);
      host_.erase(it);
    }
    if (stream != nullptr) {
      const int device = c10::cuda::current_device();
      at::getHostAllocator(at::kCUDA)->record_event(
          p, block.get_context(), c10::cuda::getStreamFromExternal(stream, device).unwrap());
    }
  }

 private:
  std::mutex mu_;
  std::unordered_map<void*, at::DataPtr> host_;
};

// What the watchdog found for one call.
struct CallState {
  std::mutex mu;
  std::string error;
  void set(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (error.empty()) {
      error = why;
    }
  }
  std::string get() {
    std::lock_guard<std::mutex> lock(mu);
    return error;
  }
};

} // namespace

CudaPath::CudaPath(const DevicePathArgs& args)
    : args_(args),
      dump_advice_(std::make_shared<const std::string>(
          args.config.debug_dump.empty()
              ? std::string("SMDDP_DEBUG_DUMP=PREFIX dumps every rank's last collectives, to compare them")
              : str("every rank's last collectives are dumped to ", args.config.debug_dump, ".<group>.<rank>.json"))),
      setup_(*args.topology, args.config),
      memory_(std::make_unique<TorchMemory>()),
      watchdog_(
          kWatchdogPeriod,
          [this] {
            for (const auto& comm : comms()) {
              std::string why = comm->asyncError();
              if (!why.empty()) {
                return why;
              }
            }
            return std::string();
          },
          [this](const std::string& why) {
            // The GPU work ends (with undefined results), then the group
            // learns that it is unusable.
            abort(why);
            if (args_.on_failure) {
              args_.on_failure(why);
            }
          }) {}

CudaPath::~CudaPath() {
  // The communicators' teardown sets their devices on this thread (the one
  // destroying the group): the caller's device is its own again after.
  int caller_device = -1;
  const bool known = cudaGetDevice(&caller_device) == cudaSuccess;
  // The streams' work first: it may use the communicators' buffers. A
  // stalled stream (a dead peer) is cut short by aborting the communicators.
  if (!aborted_.load() && !drain(Deadline::after(args_.timeout))) {
    SMDDP_LOG(kWarn, args_.who, ": device collectives still running at teardown after the group's timeout; aborting them");
    abort("the group is being destroyed while device collectives still run");
  }
  if (aborted_.load()) {
    // Aborted waits end (kernels read the abort word, stream waits are
    // released): the streams run out before the buffers they use go.
    drain(Deadline::after(std::chrono::seconds(10)));
  }
  watchdog_.stop();
  {
    std::lock_guard<std::mutex> lock(mu_);
    comms_.clear();
  }
  if (known) {
    cudaSetDevice(caller_device);
  }
}

bool CudaPath::supportsReduce(at::ScalarType dtype, ReduceOp op) const {
  bool ok = false;
  const DataType d = toDataType(dtype, &ok);
  return ok && setup_.reduceOnDevice() && algorithm::cuda::deviceReduceSupported(d, op);
}

c10::cuda::CUDAStream CudaPath::streamFor(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(device);
  if (it == streams_.end()) {
    it = streams_.emplace(device, c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device)).first;
  }
  return it->second;
}

std::vector<std::shared_ptr<algorithm::cuda::CudaCommunicator>> CudaPath::comms() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<algorithm::cuda::CudaCommunicator>> out;
  for (const auto& kv : comms_) {
    out.push_back(kv.second);
  }
  return out;
}

algorithm::cuda::CudaCommunicator& CudaPath::commFor(int device) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = comms_.find(device);
    if (it != comms_.end()) {
      return *it->second;
    }
  }
  // Outside the lock: creation meets the group through the store and NCCL,
  // and abort() must not wait for it.
  C10dStoreAdapter st(args_.store, args_.timeout);
  auto comm = std::make_shared<algorithm::cuda::CudaCommunicator>(
      st, setup_, *args_.topology, args_.config, args_.timeout, device, args_.host, *memory_);
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_.load()) {
    comm->abort(abort_reason_);
  }
  return *comms_.emplace(device, std::move(comm)).first->second;
}

DevicePath::Call CudaPath::prepare(
    CollectiveKind kind,
    const algorithm::OpArgs& args,
    const std::vector<at::Tensor>& inputs,
    const std::vector<at::Tensor>& outputs,
    uint64_t record) {
  const at::Tensor& first = outputs.empty() ? inputs.at(0) : outputs.at(0);
  const int device = first.device().index();
  c10::cuda::CUDAGuard guard(device);
  loadKernelsOnce(device);
  c10::cuda::CUDAStream comm = streamFor(device);
  // The communication stream starts after what the caller enqueued so far.
  auto ready = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(device);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(caller.stream(), &capture));
  const bool captured = capture != cudaStreamCaptureStatusNone;
  ready->record(caller);
  // The allocator must not reuse these tensors' memory before the
  // communication stream is done with them.
  for (const auto& t : inputs) {
    c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), comm);
  }
  for (const auto& t : outputs) {
    c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), comm);
  }
  algorithm::OpArgs traced_args = args;
  if (args_.config.cuda_zero_copy) {
    traced_args.traced_memory = tracedMemory(inputs) && tracedMemory(outputs);
  }
  auto end = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
  auto state = std::make_shared<CallState>();
  CudaPath* self = this;
  FlightRecorder* recorder = args_.recorder;
  const std::string who = args_.who;
  Call call;
  call.body = [self, kind, args = traced_args, inputs, outputs, device, comm, ready, end, state, recorder, record, who,
               captured](uint64_t seq, const Deadline& deadline) {
    relaxCaptureMode();
    c10::cuda::CUDAGuard g(device);
    algorithm::OpArgs a = args;
    a.seq = seq;
    a.deadline = deadline;
    auto& cc = self->commFor(device);
    if (captured) {
      // Refused before the communication stream joins the capture.
      cc.checkCapture(a);
    }
    ready->block(comm);
    switch (kind) {
      case CollectiveKind::kAllGather:
        cc.allGather(a, comm.stream());
        break;
      case CollectiveKind::kReduceScatter:
        cc.reduceScatter(a, comm.stream());
        break;
      case CollectiveKind::kAllReduce:
        cc.allReduce(a, comm.stream());
        break;
      case CollectiveKind::kBroadcast:
        cc.broadcast(a, comm.stream());
        break;
      case CollectiveKind::kBarrier:
        SMDDP_THROW(kInternal, "no CUDA path for ", collectiveName(kind));
    }
    end->record(comm);
    // Being captured into a CUDA graph: nothing runs now, so there is
    // nothing to watch (and an event of a capture cannot be queried).
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(comm.stream(), &capture);
    if (capture != cudaStreamCaptureStatusNone) {
      return;
    }
    Watchdog::Item item;
    item.label = str(collectiveName(kind), " #", seq, " on cuda:", device);
    item.deadline = deadline;
    item.stuck = [waits = cc.waitsOn(), dump = self->dump_advice_] {
      return waits->empty() ? *dump : str(*waits, "; ", *dump);
    };
    // The end event also fires after a device-side wait gave up (its peer
    // never came, and the steps after it ran on what was there): the call
    // completes only if no wait did. The watchdog is stopped before the
    // communicators are destroyed.
    item.done = [end, recorder, record, comm_of_call = &cc] {
      relaxCaptureMode();
      if (!end->query()) {
        return false;
      }
      const std::string why = comm_of_call->asyncError();
      if (!why.empty()) {
        throw std::runtime_error(why);
      }
      if (recorder != nullptr) {
        recorder->completed(record);
      }
      return true;
    };
    item.fail = [state, recorder, record, who](const std::string& why) {
      const std::string msg = str("ProcessGroupSMDDP (", who, "): ", why);
      state->set(msg);
      if (recorder != nullptr) {
        recorder->failed(record, msg);
      }
    };
    self->watchdog_.watch(std::move(item));
  };
  call.on_wait = [end, device] {
    c10::cuda::CUDAGuard g(device);
    end->block(c10::cuda::getCurrentCUDAStream(device));
  };
  call.gpu_done = [end] { return end->query(); };
  call.device_error = [state] { return state->get(); };
  call.completion_context = [comm, device](const std::function<void()>& fn) {
    c10::cuda::CUDAGuard g(device);
    c10::cuda::CUDAStreamGuard sg(comm);
    fn();
  };
  return call;
}

bool CudaPath::drain(const Deadline& deadline) {
  std::vector<std::pair<int, c10::cuda::CUDAStream>> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& kv : streams_) {
      streams.emplace_back(kv.first, kv.second);
    }
  }
  for (auto& [device, stream] : streams) {
    c10::cuda::CUDAGuard g(device);
    at::cuda::CUDAEvent done(cudaEventDisableTiming);
    done.record(stream);
    // Polled, so that a stalled stream costs the deadline, not the process.
    auto pause = std::chrono::microseconds(20);
    while (!done.query()) {
      if (deadline.expired()) {
        return false;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(2000));
    }
  }
  return true;
}

void CudaPath::synchronize(const Deadline& deadline) {
  if (!drain(deadline)) {
    SMDDP_THROW(kTimeout, "the device collectives enqueued before this barrier did not finish within the group's "
                          "timeout");
  }
  const std::string failure = watchdog_.failure();
  if (!failure.empty()) {
    SMDDP_THROW(kComm, "a device collective before this barrier failed: ", failure);
  }
}

void CudaPath::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_reason_.empty()) {
      abort_reason_ = why;
    }
  }
  aborted_.store(true);
  for (const auto& comm : comms()) {
    comm->abort(why);
  }
}

std::string CudaPath::describe() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [device, comm] : comms_) {
    out += str(out.empty() ? "" : "; ", "cuda:", device, " ", comm->describe());
  }
  return out.empty() ? "cuda: not used yet" : out;
}

} // namespace smddp
