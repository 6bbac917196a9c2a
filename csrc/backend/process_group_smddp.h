// ProcessGroupSMDDP: the c10d backend.
//
// What runs where:
//   - AllGather, ReduceScatter, AllReduce (and their list, single and
//     coalesced forms), Broadcast and Barrier on CPU tensors run natively on
//     the group's Communicator (algorithm/communicator.h).
//   - All_gather_into_tensor, reduce_scatter_tensor, all_reduce and
//     broadcast on CUDA tensors run natively on the device path
//     (device_path.h, in the CUDA module loaded on first use).
//   - Everything else (all_to_all, send/recv, gather, scatter, reduce,
//     monitored barrier, sparse, bitwise reduce ops, dtypes smddp does not
//     reduce, CUDA tensors when the CUDA module is unavailable) is delegated
//     to the fallback backend of the tensors' device (gloo for CPU, nccl for
//     CUDA), created by the Python layer on the same store.
//
// Argument errors are thrown by the collective call itself (TORCH_CHECK,
// naming the op and the rank). Communication errors surface in wait() and the
// future as c10::DistBackendError naming the op, its sequence number, the
// rank, the peer and the cause; after one, the group is unusable and every
// later native call fails fast with that first error (and the peers are told,
// so that they fail promptly too). With SMDDP_DEBUG_DUMP set, such a failure
// also writes the group's last collectives (common/flight_recorder.h).
//
// Store keys: a group counts the creations of a group of its members on its
// store and keeps every key under that generation
// ("smddp/<members>/<generation>/..."), so that a group created again on the
// same store (same name, say, after destroy_process_group, of the same or
// other members) never reads the keys of another.
//
// Threading: collective calls may come from any thread but are expected in the
// same order on every rank; native work runs on the Executor (one at a time).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "algorithm/communicator.h"
#include "backend/device_path.h"
#include "backend/executor.h"
#include "backend/host_layout.h"
#include "backend/torch_compat.h"
#include "backend/work_smddp.h"
#include "common/config.h"
#include "common/flight_recorder.h"
#include "topology/topology.h"

namespace smddp {

class ProcessGroupSMDDP : public ::c10d::Backend {
 public:
  using Work = ::c10d::Work;
  template <typename T>
  using Ptr = c10::intrusive_ptr<T>;

  // Collective over the group: discovers the topology through `store`,
  // checks that every rank has the same SMDDP_* settings, and builds the
  // transports. `global_ranks` are the default group's ranks of this group's
  // members (empty for the default group itself).
  ProcessGroupSMDDP(
      const Ptr<::c10d::Store>& store,
      int rank,
      int size,
      std::chrono::milliseconds timeout,
      std::vector<int64_t> global_ranks,
      std::string group_name);
  ~ProcessGroupSMDDP() override;

  const std::string getBackendName() const override {
    return "smddp";
  }
  Ptr<::c10d::Backend::Options> getBackendOptions() override {
    return options_;
  }

  // The backend that serves delegated calls on tensors of `device` (set by
  // the Python layer right after construction; may be null: then such calls
  // raise).
  void setFallback(c10::DeviceType device, Ptr<::c10d::Backend> backend);
  Ptr<::c10d::Backend> fallback(c10::DeviceType device) const;

  // ---- native collectives
  Ptr<Work> broadcast(std::vector<at::Tensor>& tensors, const ::c10d::BroadcastOptions& opts) override;
  Ptr<Work> allreduce(std::vector<at::Tensor>& tensors, const ::c10d::AllreduceOptions& opts) override;
  Ptr<Work> allreduce_coalesced(std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) override;
  Ptr<Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const ::c10d::AllgatherOptions& opts) override;
  Ptr<Work> _allgather_base(at::Tensor& output, at::Tensor& input, const ::c10d::AllgatherOptions& opts) override;
  Ptr<Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const ::c10d::AllgatherOptions& opts) override;
  Ptr<Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const ::c10d::AllgatherOptions& opts) override;
  Ptr<Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const ::c10d::ReduceScatterOptions& opts) override;
  Ptr<Work> _reduce_scatter_base(
      at::Tensor& output,
      at::Tensor& input,
      const ::c10d::ReduceScatterOptions& opts) override;
  Ptr<Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const ::c10d::ReduceScatterOptions& opts) override;
  Ptr<Work> barrier(const ::c10d::BarrierOptions& opts) override;

  // ---- delegated to the fallback
  Ptr<Work> allreduce_sparse(std::vector<at::Tensor>& tensors, const ::c10d::AllreduceOptions& opts) override;
  Ptr<Work> reduce(std::vector<at::Tensor>& tensors, const ::c10d::ReduceOptions& opts) override;
  Ptr<Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const ::c10d::GatherOptions& opts) override;
  Ptr<Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const ::c10d::ScatterOptions& opts) override;
  Ptr<Work> alltoall_base(
      at::Tensor& output,
      at::Tensor& input,
      std::vector<int64_t>& output_split_sizes,
      std::vector<int64_t>& input_split_sizes,
      const ::c10d::AllToAllOptions& opts) override;
  Ptr<Work> alltoall(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const ::c10d::AllToAllOptions& opts) override;
  Ptr<Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  Ptr<Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  Ptr<Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  void monitoredBarrier(const ::c10d::BarrierOptions& opts, bool wait_all_ranks) override;

  // ---- lifecycle and properties
  void abort() override;
  void shutdown() override;
  bool supportsSplitting() const override {
    return true;
  }
  Ptr<::c10d::Backend> split(
      const Ptr<::c10d::Store>& store,
      const std::vector<int>& ranks,
      const Ptr<::c10d::Backend::Options>& opts) override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  uint64_t getSequenceNumberForGroup() override;
  ::c10d::ErrorType getError() override;

  // For Python and logs.
  std::string describe() const;
  const topology::Topology& topology() const {
    return *topology_;
  }
  const Config& config() const {
    return config_;
  }
  // The NIC this rank's inter-node connections use (SMDDP_SOCKET_IFNAME).
  const transport::Nic& nic() const {
    return nic_;
  }

 private:
  // Where a call runs: natively on host memory, natively on the GPU, or on
  // the fallback backend. Throws for tensors on different devices.
  enum class Route { kHost, kDevice, kFallback };
  Route route(const char* op, const std::vector<at::Tensor>& tensors, const ::c10d::ReduceOp* reduce_op) const;
  // Runs the single collective described by `args` on the given route.
  Ptr<Work> submit(
      Route route,
      ::c10d::OpType op_type,
      const char* name,
      const algorithm::OpArgs& args,
      std::vector<at::Tensor> inputs,
      std::vector<at::Tensor> outputs,
      bool async_op,
      HostLayout layout = {});
  // Runs `calls` one after the other on host memory as one Work (the
  // coalesced forms); each takes its own sequence number. `layout` holds
  // the flat copies of the tensors that are not contiguous.
  Ptr<Work> submitOnHost(
      ::c10d::OpType op_type,
      const char* name,
      std::vector<algorithm::OpArgs> calls,
      std::vector<at::Tensor> inputs,
      std::vector<at::Tensor> outputs,
      bool async_op,
      HostLayout layout = {});
  // Before a host call: huge pages for its large buffers (SMDDP_HUGE_PAGES).
  void prepareHostMemory(const algorithm::OpArgs& a) const;
  void runOnHost(const algorithm::OpArgs& args);
  // Runs `body` as the native collective `name` (e.g. "allreduce"); takes
  // `nseq` sequence numbers (the first is passed to body). `detail`
  // describes the call in the flight recorder; a device call brings the
  // record it was prepared with and its hooks.
  Ptr<Work> submitNative(
      ::c10d::OpType op_type,
      const char* name,
      const std::string& detail,
      std::vector<at::Tensor> outputs,
      const std::optional<std::vector<at::Tensor>>& inputs,
      bool async_op,
      size_t nseq,
      std::function<void(uint64_t first_seq, const Deadline& deadline)> body,
      const DevicePath::Call* device_hooks = nullptr,
      std::optional<uint64_t> record = std::nullopt);
  // Makes the group unusable after the communication failure `msg` (the
  // first one wins): later calls fail fast with it, the peers are told, the
  // device work is aborted and the flight recorder dumped if asked.
  // `on_executor`: called from the thread that ran the failed call (the
  // host communicator is then idle and can tell its peers).
  void failGroup(const std::string& msg, bool on_executor);
  // The device path, created on first use; null when the CUDA module is
  // unavailable (the reason is logged once).
  DevicePath* devicePath() const;
  // The exception to store for a failure of native op `label` (the flight
  // recorder's entry `record`).
  std::exception_ptr translate(const std::string& label, std::exception_ptr error, uint64_t record);
  Ptr<::c10d::Backend> fallbackFor(const std::vector<at::Tensor>& tensors, const char* op) const;
  Ptr<::c10d::Backend> fallbackFor(c10::DeviceType device, const char* op) const;
  // Whether CPU tensors of this dtype / reduce op run natively.
  bool nativeReduce(at::ScalarType dtype, const ::c10d::ReduceOp& op) const;
  // The reduction of a native call; throws (TORCH_CHECK) for a reduce op
  // that is not defined on the dtype.
  algorithm::ReduceSpec makeReduceSpec(
      const char* op,
      at::ScalarType dtype,
      const ::c10d::ReduceOp& rop) const;
  // Strided tensors of one dtype, the whole one `size_` blocks of the other
  // (AllGather's output, ReduceScatter's input).
  void checkBlocks(
      const char* op,
      const at::Tensor& input,
      const at::Tensor& output,
      bool output_is_whole,
      int64_t index) const;
  // The list forms (one tensor per rank, all_gather's outputs or
  // reduce_scatter's inputs), whose sizes may differ from rank to rank:
  // checks each against `single` (the other side of the call) and this
  // rank's own against `single`'s size; returns the largest size.
  int64_t perRankBlock(
      const char* op,
      const std::vector<at::Tensor>& list,
      bool list_is_output,
      const at::Tensor& single) const;
  // The buffer through which a native call on `route` reads or writes `t`:
  // on the GPU `t` itself, which must be contiguous; on the host `t` or its
  // flat copy in `layout`.
  at::Tensor nativeBuffer(
      Route route,
      HostLayout& layout,
      const char* op,
      const at::Tensor& t,
      const std::string& what,
      HostLayout::Access access) const;
  // One call's arguments, checked (shared by the single and coalesced forms).
  algorithm::OpArgs allReduceArgs(
      const char* op,
      Route route,
      HostLayout& layout,
      const at::Tensor& t,
      const ::c10d::ReduceOp& rop,
      int64_t index = -1) const;
  // `block` (a nativeBuffer), or, where it overlapsOutOfPlace with `whole`,
  // its copy in `layout` on the host path; the device path refuses it.
  at::Tensor apartFrom(
      const char* op,
      Route route,
      HostLayout& layout,
      const at::Tensor& whole,
      const at::Tensor& block,
      HostLayout::Access access,
      int64_t index) const;
  algorithm::OpArgs allGatherArgs(
      const char* op,
      Route route,
      HostLayout& layout,
      const at::Tensor& input,
      const at::Tensor& output,
      int64_t index = -1) const;
  algorithm::OpArgs reduceScatterArgs(
      const char* op,
      Route route,
      HostLayout& layout,
      const at::Tensor& input,
      const at::Tensor& output,
      const ::c10d::ReduceOp& rop,
      int64_t index = -1) const;
  Where where(const char* op) const {
    return Where{op, rank_, size_};
  }
  // Raises DistBackendError once the group was shut down or aborted on this
  // rank: a call then must not reach the fallback, still open, which would
  // wait for peers that have moved on.
  void checkOpen(const char* op) const;
  // What shutdown() (graceful) and abort() end with; the first call only.
  void close(bool graceful);

  const std::string group_name_;
  std::vector<int64_t> global_ranks_;
  Config config_;
  Ptr<::c10d::Backend::Options> options_;
  std::unique_ptr<topology::Topology> topology_;
  transport::Nic nic_;
  std::unique_ptr<algorithm::Communicator> communicator_;
  // The group's store with its keys under this group's generation.
  Ptr<::c10d::Store> store_;
  mutable FlightRecorder recorder_;
  mutable std::mutex device_mu_;
  mutable std::unique_ptr<DevicePath> device_;
  mutable bool device_tried_ = false;
  std::shared_ptr<Executor> executor_;
  std::atomic<int64_t> timeout_ms_;
  std::atomic<uint64_t> next_seq_{0};  // how many sequence numbers were issued

  mutable std::mutex mu_;
  std::unordered_map<int, Ptr<::c10d::Backend>> fallbacks_;
  std::exception_ptr fatal_;  // first communication error (sticky)
  std::atomic<bool> broken_{false};
  std::atomic<bool> shut_down_{false};
  std::atomic<bool> aborted_{false};
};


} // namespace smddp
