// The CUDA communicator's schedules, one per mode (algorithm/device_setup.h),
// chosen once when the communicator is created. Private to
// algorithm/cuda/; cuda_communicator.h describes what each one does.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "algorithm/communicator.h"
#include "algorithm/cuda/device_memory.h"
#include "algorithm/cuda/device_sync.h"
#include "algorithm/cuda/memop_sync.h"
#include "algorithm/chunks.h"
#include "algorithm/device_plan.h"
#include "algorithm/node_collectives.h"
#include "algorithm/op.h"
#include "common/config.h"
#include "topology/topology.h"
#include "transport/cuda/ipc_arena.h"
#include "transport/cuda/ipc_buffers.h"
#include "transport/cuda/nccl_rail.h"
#include "transport/shm/revocations.h"

namespace smddp::algorithm::cuda {

// What every schedule works with; owned by the communicator.
struct DeviceContext {
  explicit DeviceContext(const topology::Topology& t) : topo(t) {}
  topology::Topology topo;
  Config config;
  int device = 0;
  // The largest pitch of a 2D copy on this device.
  size_t max_pitch = 0;
  transport::CudaIpcArena* ipc = nullptr;
  transport::NodeArena* arena = nullptr;
  NodeCollectives* node = nullptr;
  transport::NcclRail* rail = nullptr;
  std::vector<int> rail_ranks;
  Communicator* host = nullptr;
  DeviceMemory* memory = nullptr;
  // SMDDP_CUDA_SYNC=device: the node's ranks meet through flags on the GPU
  // (device_sync.h). Every exchange runs the same three steps (this rank's
  // counter, the node's flags, the device's view of the host words, how
  // long a wait may last), made once with the communicator.
  bool device_sync = false;
  ExchangeSteps sync_steps;
  // SMDDP_CUDA_SYNC=memops (device_sync is set too): the same three steps
  // as stream memory operations on each rank's inboxes (memop_sync.h).
  const MemOpStream* memops = nullptr;
  MemOpSteps memop_steps;
  // SMDDP_CUDA_ZERO_COPY: the node's peers' own buffers, mapped;
  // how many calls went through them and how many were staged (read by
  // describe() from any thread).
  transport::IpcBuffers* buffers = nullptr;
  std::atomic<uint64_t> mapped_calls{0};
  std::atomic<uint64_t> staged_calls{0};
  std::atomic<uint64_t> revoked_segments{0};
  bool told_staged = false;
};

class Schedule {
 public:
  virtual ~Schedule() = default;
  virtual void allGather(const OpArgs& args, cudaStream_t s) = 0;
  virtual void reduceScatter(const OpArgs& args, cudaStream_t s) = 0;
  virtual void allReduce(const OpArgs& args, cudaStream_t s) = 0;
  virtual void broadcast(const OpArgs& args, cudaStream_t s) = 0;
};

std::unique_ptr<Schedule> makeNodeSchedule(DeviceContext& ctx);
std::unique_ptr<Schedule> makeRailsSchedule(DeviceContext& ctx);
std::unique_ptr<Schedule> makeStagedSchedule(DeviceContext& ctx);

// ---- stages shared by the schedules (stages.cc)

void copyAsync(void* dst, const void* src, size_t bytes, cudaStream_t s);

// Several independent copies: one batch the copy engines may run side by
// side (SMDDP_CUDA_BATCH_COPIES), else one after another.
void copyBatch(
    const DeviceContext& ctx,
    const std::vector<void*>& dsts,
    const std::vector<const void*>& srcs,
    const std::vector<size_t>& sizes,
    cudaStream_t s);

// `rows` rows of `width` bytes from src (rows `spitch` apart) to dst (rows
// `dpitch` apart): one 2D copy, or a copy per row where a pitch exceeds
// what the device's 2D copies take (a flat gradient of several GiB).
void copyRows(
    const DeviceContext& ctx,
    void* dst,
    size_t dpitch,
    const void* src,
    size_t spitch,
    size_t width,
    size_t rows,
    cudaStream_t s);

// Work forked from a collective's stream `main` to `side` (the rail's
// stream of SMDDP_CUDA_PIPELINE) joins `main` by join(), or at the latest
// when this goes out of scope, also when an error ends the collective early:
// `main` never ends a call with forked work left unjoined, which would keep
// a capture from ending. A join on the way out of an error ignores its own
// errors: the error under way is the one to raise.
class StreamJoin {
 public:
  StreamJoin(cudaStream_t main, cudaStream_t side, cudaEvent_t event) : main_(main), side_(side), event_(event) {}
  StreamJoin(const StreamJoin&) = delete;
  StreamJoin& operator=(const StreamJoin&) = delete;
  ~StreamJoin() {
    if (!joined_ && cudaEventRecord(event_, side_) == cudaSuccess) {
      cudaStreamWaitEvent(main_, event_, 0);
    }
  }
  void join();

 private:
  cudaStream_t main_;
  cudaStream_t side_;
  cudaEvent_t event_;
  bool joined_ = false;
};

// Starts a call: its descriptor for the node's peers.
void openDeviceCall(DeviceContext& ctx, const OpArgs& args);

// One round trip through the staging buffers: wait until the peers have
// read this rank's stage, fill it, announce it, wait for the peers' stages,
// consume them, announce that. With host synchronization the host threads
// meet in the arena around interprocess events; with device
// synchronization the GPU waits on the peers' flags and the host only
// enqueues (after the call's first round, which checks the descriptors).
void exchange(
    DeviceContext& ctx,
    const OpArgs& args,
    cudaStream_t s,
    bool first,
    const std::function<void()>& fill,
    const std::function<void()>& consume);

// ---- zero-copy (SMDDP_CUDA_ZERO_COPY): the peers read each other's tensors

// A CUDA communicator's node arena slots (kArenaSlotBytes, two per rank):
// slot(l, parity) begins with l's BufferRecords of its call of that parity
// (openNodeCall); slot(l, 0) + kRevokeBoxOffset holds l's RevokeBox
// (transport/shm/revocations.h).
constexpr size_t kArenaSlotBytes = 4096;
constexpr size_t kRevokeBoxOffset = 2048;
static_assert(2 * sizeof(transport::BufferRecord) <= kRevokeBoxOffset, "a call's records fit before the box");
static_assert(kRevokeBoxOffset + sizeof(transport::RevokeBox) <= kArenaSlotBytes, "the box fits its slot");

// Every local rank's buffers of a mapped call as this rank addresses them
// (its own as they are).
struct MappedCall {
  std::vector<const uint8_t*> in;
  std::vector<uint8_t*> out;  // empty unless the call maps outputs
};

// How a one-node call was opened (openNodeCall).
enum class Opened {
  kMapped,   // zero-copy: every rank's buffers are in the MappedCall
  kStaged,   // through the staging buffers; its first exchange checks the call
  kChecked,  // through the staging buffers, the call already checked: its
             // first exchange passes first=false
};

// Opens a one-node call. Without zero-copy: writes its descriptor (kStaged).
// With it: publishes this rank's input (`in_bytes` at args.in) and, with
// `out_bytes` > 0, its output, meets the node once and checks the call;
// kMapped with every rank's buffers in `call` when every rank's can be
// mapped, kChecked when some rank's cannot (an empty call, a graph being
// captured, torch's expandable segments).
Opened openNodeCall(
    DeviceContext& ctx,
    const OpArgs& args,
    cudaStream_t s,
    size_t in_bytes,
    size_t out_bytes,
    MappedCall* call);

// One step of a mapped call: every rank's stream reaches it (the buffers it
// published hold what the step reads), each runs `consume` on the mapped
// buffers, and the step ends on every rank's stream only once every peer's
// consume is done, so that a rank's buffers may change again after its last
// step (the rule transport/peer_mappings.h relies on). `first`: the step
// right after openNodeCall.
void mappedStep(DeviceContext& ctx, const OpArgs& args, cudaStream_t s, bool first, const std::function<void()>& consume);

// The rail stage of a sliced AllReduce over the rails (its steps and their
// order: algorithm/device_plan.h, slicedAllReducePlan). `run(slices, count,
// stream)` all-reduces `count` elements of reduced slices across the nodes,
// in place, and applies what the node's reduction left (AVG's division), on
// `stream`. Each chunk's slice lies in a slot of `slot_bytes`
// (slicedAllReduceSliceBytes, rounded up) in this rank's own memory at
// `slots`: `steps` kWhole, slot c of `chunks` (one rail step over them all,
// on the collective's stream); kPerChunk (SMDDP_CUDA_PIPELINE), slot c % 2
// of two, its rail step on `stream`, `reduced[k]` and `railed[k]` marking the
// end of slot k's reduction and rail step, `joined` for the StreamJoin.
struct SliceRail {
  RailSteps steps = RailSteps::kWhole;
  cudaStream_t stream = nullptr;
  uint8_t* slots = nullptr;
  size_t slot_bytes = 0;
  cudaEvent_t reduced[2] = {};
  cudaEvent_t railed[2] = {};
  cudaEvent_t joined = nullptr;
  std::function<void(uint8_t* slices, size_t count, cudaStream_t stream)> run;
};

// AllReduce of a mapped call on one node: each rank reduces its slice of
// every peer's input into its own output with `reduceSlice(srcs, result,
// count)` (the slices 16-byte aligned), then copies every peer's slice from
// the peer's output. Each element is reduced in local rank order, as on the
// staged path.
void mappedAllReduce(
    DeviceContext& ctx,
    const OpArgs& args,
    cudaStream_t s,
    const MappedCall& call,
    const std::function<void(const void* const* srcs, uint8_t* result, size_t count)>& reduceSlice);

// AllReduce through the staging buffers, chunk by chunk: each rank reduces
// its slice of the chunk (16-byte aligned, so that the kernel reads vectors)
// from every peer's stage with `reduceSlice(srcs, result, count)` (the
// node's kernel) into the result half of its own staging buffer, or with
// `rail` into a slot that the rail stage then all-reduces; then every rank
// gathers every peer's result slice. The caller has opened the call, `how`
// (kStaged or kChecked). A mapped call (`how` kMapped, its buffers in
// `call`: the rails' zero-copy AllReduce) takes the same chunks, slices,
// slots and rail steps, so that its rail's calls and bits are the staged
// path's on every node, but reads every rank's input instead of its stage
// and gathers from every rank's output: no staging copies.
void slicedAllReduce(
    DeviceContext& ctx,
    const OpArgs& args,
    cudaStream_t s,
    const std::function<void(const void* const* srcs, uint8_t* result, size_t count)>& reduceSlice,
    Opened how,
    const SliceRail* rail = nullptr,
    const MappedCall* call = nullptr);

// How many chunks slicedAllReduce cuts a call into, and the largest slice it
// gives this rank, in bytes.
size_t slicedAllReduceChunks(const DeviceContext& ctx, const OpArgs& args);
size_t slicedAllReduceSliceBytes(const DeviceContext& ctx, const OpArgs& args);

// AllReduce of a message that fits one staging buffer, in one exchange: each
// rank stages its input and reduces every peer's whole stage into its output
// with `reduceAll(srcs, out, count)`, in local rank order, so the bits are
// slicedAllReduce's.
void oneShotAllReduce(
    DeviceContext& ctx,
    const OpArgs& args,
    cudaStream_t s,
    const std::function<void(const void* const* srcs, uint8_t* result, size_t count)>& reduceAll);

// Broadcast from local rank args.root through the staging buffers.
void nodeBroadcast(DeviceContext& ctx, const OpArgs& args, cudaStream_t s);

} // namespace smddp::algorithm::cuda
