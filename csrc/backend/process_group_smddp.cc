#include "backend/process_group_smddp.h"

#include <c10/util/Exception.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "backend/conversions.h"
#include "backend/device_path.h"
#include "backend/fallback_factory.h"
#include "backend/store_adapter.h"
#include "common/error.h"
#include "common/huge_pages.h"
#include "common/log.h"
#include "topology/discovery.h"

namespace smddp {

using ::c10d::OpType;

// ------------------------------------------------------------ helpers

namespace {

std::exception_ptr makeDistBackendError(const std::string& msg) {
  return std::make_exception_ptr(c10::DistBackendError(
      c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg));
}

std::exception_ptr makeTorchError(const std::string& msg) {
  return std::make_exception_ptr(c10::Error(
      c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg));
}

// "float32, 1024 elements, SUM", for the flight recorder.
std::string detailOf(const algorithm::OpArgs& a) {
  return describeCall(a.kind, a.dtype(), a.reduce.op, a.count, a.root);
}

// Which ranks make a group, short enough for a store key: its size and a
// hash of its members' global ranks (none given: the whole world).
std::string membersKey(int size, const std::vector<int64_t>& global_ranks) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (int64_t r : global_ranks) {
    for (int i = 0; i < 8; ++i) {
      h = (h ^ ((static_cast<uint64_t>(r) >> (8 * i)) & 0xff)) * 1099511628211ull;
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return global_ranks.empty() ? str(size) : str(size, "-", hex);
}

} // namespace

// ------------------------------------------------------------ construction


ProcessGroupSMDDP::ProcessGroupSMDDP(
    const Ptr<::c10d::Store>& store,
    int rank,
    int size,
    std::chrono::milliseconds timeout,
    std::vector<int64_t> global_ranks,
    std::string group_name)
    : ::c10d::Backend(rank, size),
      group_name_(std::move(group_name)),
      global_ranks_(std::move(global_ranks)),
      timeout_ms_(timeout.count()) {
  options_ = c10::make_intrusive<::c10d::Backend::Options>("smddp", timeout);
  options_->group_name = group_name_;
  for (int64_t g : global_ranks_) {
    options_->global_ranks_in_group.push_back(static_cast<uint64_t>(g));
  }
  // How the set-up's communication failures begin.
  // A sub-group's ranks are named by their place in it, and, where that
  // differs, by their global rank too: the one a user knows them by.
  auto whoIs = [&](int r) {
    const int64_t global = static_cast<size_t>(r) < global_ranks_.size() ? global_ranks_[static_cast<size_t>(r)] : r;
    return global == r ? str("rank ", r) : str("rank ", r, " (global rank ", global, ")");
  };
  const std::string failed_here = str("ProcessGroupSMDDP (", whoIs(rank), " of ", size, ", group '", group_name_, "'): ");
  try {
    // The first key every rank touches: the n-th creation of a group of
    // these members on this store is generation n / size, and no rank can
    // finish creating generation g before every rank has counted itself
    // into it. The members are part of the key: torch restarts its group
    // names after destroy_process_group, so one name on one store may stand
    // for groups of other members and sizes, whose counts must not mix.
    const std::string members = str("smddp/", membersKey(size, global_ranks_));
    C10dStoreAdapter raw(store, timeout);
    const int64_t generation = (raw.add(members + "/groups", 1) - 1) / size;
    store_ = c10::make_intrusive<::c10d::PrefixStore>(str(members, "/", generation), store);
  } catch (const std::exception& e) {
    TORCH_CHECK_WITH(DistBackendError, false, failed_here, "set-up failed: the store: ", e.what());
  }
  C10dStoreAdapter st(store_, timeout);
  // The group exists once every rank has made its part: each arrives at
  // this last barrier, a rank whose set-up failed anywhere with why (and at
  // once), so that the others waiting there (their own part done) fail now
  // naming it, not at the group's timeout. Where the others wait earlier,
  // the step they wait in carries the failure (see below).
  const std::string kCreated = "smddp/created";
  auto tellOthers = [&](const std::string& why) {
    try {
      storeBarrierFailed(st, kCreated, size, str(whoIs(rank), " could not set up the group: ", why));
    } catch (const std::exception&) {
      // The store failing too: this rank's own error is the one to raise.
    }
  };
  // What each rank reads on its own (its settings, its NIC) may be wrong on
  // one rank only (a host whose NIC has another name). Such a rank still
  // takes part in the exchange that follows, with its error in place of
  // its part, so that every rank fails at once naming it, rather than
  // waiting for it until the group's timeout.
  try {
    config_ = Config::fromEnv();
  } catch (const Error& e) {
    try {
      Config::failAgreement(st, "smddp/config", rank, e.what());
    } catch (const std::exception&) {
      // The store failing too: this rank's own error is the one to raise.
    }
    tellOthers(e.what());
    TORCH_CHECK_VALUE(false, failed_here, e.what());
  }
  try {
    config_.checkAgreement(st, "smddp/config", rank, size, whoIs);
    const int global_rank =
        global_ranks_.empty() ? rank : static_cast<int>(global_ranks_[static_cast<size_t>(rank)]);
    const topology::Placement placement =
        topology::discoverPlacement(st, "smddp/node", rank, size, global_rank, config_.ranks_per_node);
    config_.host_ranks = placement.host_ranks;
    config_.host_cpus = placement.host_cpus;
    topology_ = std::make_unique<topology::Topology>(rank, placement.node_keys);
    algorithm::NetOptions net;
    net.store_host = storeHost(store);
    const topology::LauncherPlace place = topology::launcherPlace(*topology_);
    std::string nic_failure;
    try {
      nic_ = transport::chooseNic(config_.socket_ifname, place.index, place.count, net.store_host);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kConfig) {
        throw;
      }
      nic_failure = e.what();
    }
    const std::string failed_nic = storeBarrier(
        st, "smddp/nic-chosen", size, nic_failure.empty() ? "" : str(whoIs(rank), " could not set up the group: ", nic_failure));
    if (!nic_failure.empty()) {
      SMDDP_THROW(kConfig, nic_failure);
    }
    if (!failed_nic.empty()) {
      SMDDP_THROW(kConfig, failed_nic);
    }
    net.nic = nic_;
    communicator_ = algorithm::createCommunicator(st, *topology_, config_, net, timeout);
  } catch (const Error& e) {
    tellOthers(e.what());
    // A user's setting (differing between ranks, or naming no NIC of the
    // host) is a ValueError; anything else failed to communicate.
    TORCH_CHECK_VALUE(e.kind() != ErrorKind::kConfig, failed_here, e.what());
    TORCH_CHECK_WITH(DistBackendError, false, failed_here, "set-up failed: ", e.what());
  } catch (const std::exception& e) {
    tellOthers(e.what());
    throw;
  }
  executor_ = std::make_shared<Executor>("smddp-exec");
  // The fallbacks are made before the last barrier: a rank that destroyed
  // the group at once would otherwise close its sockets while a peer still
  // completes a connection (where gloo connects eagerly), and gloo fails
  // that peer's set-up as if this rank had crashed.
  std::exception_ptr fallback_error;
  std::string failure;
  if (config_.fallback != "none") {
    try {
      auto prefixed = c10::make_intrusive<::c10d::PrefixStore>("smddp-fallback", store_);
      for (auto& [device, backend] : makeFallbacks(prefixed, rank, size, timeout, config_.fallback)) {
        fallbacks_[static_cast<int>(device)] = backend;
      }
    } catch (const std::exception& e) {
      fallback_error = std::current_exception();
      failure = str(whoIs(rank), " could not create the fallback group (SMDDP_FALLBACK=", config_.fallback, "): ",
                    e.what(), ". Fix that rank's error, or set SMDDP_FALLBACK=none on every rank if only smddp's "
                    "native collectives are needed.");
    }
  }
  try {
    failure = storeBarrier(st, kCreated, size, failure);
  } catch (const std::exception& e) {
    failure = str("the ranks did not all arrive: ", e.what());
  }
  if (fallback_error) {
    std::rethrow_exception(fallback_error);
  }
  TORCH_CHECK_WITH(DistBackendError, failure.empty(), failed_here, "set-up failed: ", failure);
  SMDDP_LOG(kInfo, "group '", group_name_, "' rank ", rank, "/", size, ": ", describe());
  init();
}

ProcessGroupSMDDP::~ProcessGroupSMDDP() {
  shutdown();
}

void ProcessGroupSMDDP::setFallback(c10::DeviceType device, Ptr<::c10d::Backend> backend) {
  std::lock_guard<std::mutex> lock(mu_);
  fallbacks_[static_cast<int>(device)] = std::move(backend);
}

c10::intrusive_ptr<::c10d::Backend> ProcessGroupSMDDP::fallback(c10::DeviceType device) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = fallbacks_.find(static_cast<int>(device));
  return it == fallbacks_.end() ? nullptr : it->second;
}

std::string ProcessGroupSMDDP::describe() const {
  std::string out = communicator_ ? communicator_->describe() : str("fallback only, ", topology_->describe());
  std::lock_guard<std::mutex> lock(device_mu_);
  if (device_) {
    out += str("; ", device_->describe());
  }
  return out;
}

// ------------------------------------------------------------ plumbing

void ProcessGroupSMDDP::checkOpen(const char* op) const {
  if (!shut_down_.load()) {
    return;
  }
  TORCH_CHECK_WITH(DistBackendError, false, where(op), "the group was ",
                   aborted_.load() ? "aborted on this rank (abort())" : "shut down on this rank (shutdown() or "
                   "destroy_process_group)", ": create a new group to go on");
}

c10::intrusive_ptr<::c10d::Backend> ProcessGroupSMDDP::fallbackFor(
    c10::DeviceType device,
    const char* op) const {
  checkOpen(op);
  auto fb = fallback(device);
  TORCH_CHECK(
      fb,
      where(op),
      "this call is served by the fallback backend, and there is none for ",
      c10::DeviceTypeName(device),
      " tensors (SMDDP_FALLBACK=",
      config_.fallback,
      "). Unset SMDDP_FALLBACK, or use a call smddp implements natively.");
  return fb;
}

c10::intrusive_ptr<::c10d::Backend> ProcessGroupSMDDP::fallbackFor(
    const std::vector<at::Tensor>& tensors,
    const char* op) const {
  c10::DeviceType device = c10::DeviceType::CPU;
  for (const auto& t : tensors) {
    if (t.defined()) {
      device = t.device().type();
      break;
    }
  }
  return fallbackFor(device, op);
}

bool ProcessGroupSMDDP::nativeReduce(at::ScalarType dtype, const ::c10d::ReduceOp& op) const {
  bool dtype_ok = false;
  bool op_ok = false;
  toDataType(dtype, &dtype_ok);
  toReduceOp(op, &op_ok);
  return dtype_ok && op_ok;
}

namespace {

// The CUDA path's kernels and copies take flat device buffers.
void checkContiguous(const Where& where, const at::Tensor& t, const std::string& what) {
  checkStrided(where, t, what);
  TORCH_CHECK(
      t.is_contiguous(),
      where,
      what,
      " must be contiguous (got sizes ",
      t.sizes(),
      ", strides ",
      t.strides(),
      "); call .contiguous() on it first");
}

void checkSameDevice(const Where& where, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(
      a.device() == b.device(),
      where,
      "input and output must be on the same device (got ",
      a.device(),
      " and ",
      b.device(),
      ")");
}

void checkSameDtype(const Where& where, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(
      a.scalar_type() == b.scalar_type(),
      where,
      "input and output must have the same dtype (got ",
      a.scalar_type(),
      " and ",
      b.scalar_type(),
      ")");
}

} // namespace

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::submitNative(
    OpType op_type,
    const char* name,
    const std::string& detail,
    std::vector<at::Tensor> outputs,
    const std::optional<std::vector<at::Tensor>>& inputs,
    bool async_op,
    size_t nseq,
    std::function<void(uint64_t, const Deadline&)> body,
    const DevicePath::Call* device_hooks,
    std::optional<uint64_t> record) {
  const uint64_t id = record ? *record : recorder_.issued(name, detail);
  // The executor numbers works when they start; a work issued from a future
  // callback may start before ones issued earlier (executor.h).
  const uint64_t issued = next_seq_.fetch_add(nseq);
  if (broken_.load()) {
    const std::string label = str(name, " #", issued);
    std::lock_guard<std::mutex> lock(mu_);
    std::string first;
    try {
      std::rethrow_exception(fatal_);
    } catch (const std::exception& e) {
      first = e.what();
    }
    const std::string msg = str(
        where(name),
        label,
        " not started: the group is unusable after an earlier failure. ",
        "Destroy it and create a new one. The failure was: ",
        first);
    recorder_.failed(id, msg);
    return makeCompletedWork(rank_, op_type, std::move(outputs), makeDistBackendError(msg));
  }
  const auto timeout = std::chrono::milliseconds(timeout_ms_.load());
  auto work = c10::make_intrusive<WorkSMDDP>(
      rank_,
      op_type,
      nseq,
      name,
      outputs,
      [this, name, timeout, id, on_device = device_hooks != nullptr, body = std::move(body)](uint64_t seq) {
        recorder_.started(id, seq);
        try {
          body(seq, Deadline::after(timeout));
        } catch (...) {
          std::rethrow_exception(translate(str(name, " #", seq), std::current_exception(), id));
        }
        // A device call completes when its end event fires (the device
        // path marks it then).
        if (on_device) {
          recorder_.enqueued(id);
        } else {
          recorder_.completed(id);
        }
      },
      executor_,
      timeout,
      WorkSMDDP::profilingTitle(name),
      inputs);
  if (device_hooks != nullptr) {
    work->setDeviceHooks(
        device_hooks->on_wait, device_hooks->gpu_done, device_hooks->device_error, device_hooks->completion_context);
  }
  try {
    executor_->submit(work, !async_op);
  } catch (const Error& e) {
    const std::string msg = str(where(name), work->label(), ": ", e.what());
    recorder_.failed(id, msg);
    work->fail(makeDistBackendError(msg));
  }
  return work;
}

std::exception_ptr ProcessGroupSMDDP::translate(
    const std::string& label,
    std::exception_ptr error,
    uint64_t record) {
  const std::string head = str(
      "ProcessGroupSMDDP ", label, " failed on rank ", rank_, " (group '", group_name_, "', ",
      size_, " ranks): ");
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    std::string msg = head + e.what();
    recorder_.failed(record, msg);
    if (e.kind() == ErrorKind::kInvalidArgument) {
      return makeTorchError(msg);
    }
    failGroup(msg, /*on_executor=*/true);
    return makeDistBackendError(msg);
  } catch (const c10::Error& e) {
    recorder_.failed(record, e.what());
    return error;
  } catch (const std::exception& e) {
    recorder_.failed(record, head + e.what());
    return makeDistBackendError(head + e.what());
  }
}

void ProcessGroupSMDDP::failGroup(const std::string& msg, bool on_executor) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fatal_) {
      fatal_ = makeDistBackendError(msg);
    }
  }
  const bool first = !broken_.exchange(true);
  if (communicator_) {
    // Peers waiting on this rank learn of the failure now, not at timeout.
    if (on_executor) {
      communicator_->abort(msg);
    } else {
      communicator_->interrupt(msg);
    }
  }
  {
    std::lock_guard<std::mutex> lock(device_mu_);
    if (device_) {
      // Device work in flight ends; node peers may wait in its own arena.
      device_->abort(msg);
    }
  }
  if (!first) {
    return;
  }
  SMDDP_LOG(kError, msg);
  if (!config_.debug_dump.empty()) {
    const std::string path = flightDumpPath(config_.debug_dump, group_name_, rank_);
    if (recorder_.dump(path, group_name_, rank_, size_, msg)) {
      SMDDP_LOG(kError, "rank ", rank_, ": the group's last collectives are in ", path);
    } else {
      SMDDP_LOG(kError, "rank ", rank_, ": could not write SMDDP_DEBUG_DUMP file ", path, ": ", errnoString(errno));
    }
  }
}

DevicePath* ProcessGroupSMDDP::devicePath() const {
  std::lock_guard<std::mutex> lock(device_mu_);
  if (device_tried_ || !communicator_) {
    return device_.get();
  }
  device_tried_ = true;
  std::string why;
  DevicePathFactory factory = devicePathFactory(&why);
  if (!factory) {
    return nullptr;
  }
  DevicePathArgs a;
  a.store = store_;
  a.topology = topology_.get();
  a.config = config_;
  a.timeout = std::chrono::milliseconds(timeout_ms_.load());
  a.host = communicator_.get();
  a.who = str("rank ", rank_, " of ", size_, ", group '", group_name_, "'");
  a.recorder = &recorder_;
  auto* self = const_cast<ProcessGroupSMDDP*>(this);
  a.on_failure = [self](const std::string& why) {
    self->failGroup(str("ProcessGroupSMDDP failed on rank ", self->rank_, " (group '", self->group_name_, "', ",
                        self->size_, " ranks): ", why),
                    /*on_executor=*/false);
  };
  try {
    device_ = factory(a);
  } catch (const std::exception& e) {
    SMDDP_LOG(kWarn, "rank ", rank_, ": the CUDA path could not be set up (", e.what(),
              "); CUDA tensors use the fallback backend");
  }
  return device_.get();
}

ProcessGroupSMDDP::Route ProcessGroupSMDDP::route(
    const char* op,
    const std::vector<at::Tensor>& tensors,
    const ::c10d::ReduceOp* reduce_op) const {
  checkOpen(op);
  if (tensors.empty() || !tensors[0].defined()) {
    return Route::kFallback;
  }
  const at::Device device = tensors[0].device();
  for (const auto& t : tensors) {
    TORCH_CHECK(t.defined(), where(op), "a tensor is undefined");
    TORCH_CHECK(
        t.device() == device,
        where(op),
        "all tensors must be on one device (got ",
        device,
        " and ",
        t.device(),
        ")");
  }
  if (!communicator_) {
    return Route::kFallback;
  }
  if (device.is_cpu()) {
    if (reduce_op == nullptr || nativeReduce(tensors[0].scalar_type(), *reduce_op)) {
      return Route::kHost;
    }
    bool dtype_ok = false;
    toDataType(tensors[0].scalar_type(), &dtype_ok);
    // gloo reduces complex tensors (as pairs of reals) and the bitwise ops;
    // other dtypes neither can: say so here, naming the call.
    TORCH_CHECK(
        dtype_ok || at::isComplexType(tensors[0].scalar_type()),
        where(op),
        "cannot reduce ",
        tensors[0].scalar_type(),
        " tensors (neither smddp nor its CPU fallback, gloo, can); use float32, float64, "
        "float16, bfloat16, int8, uint8, int32, int64 or bool");
    return Route::kFallback;
  }
  if (device.is_cuda()) {
    DevicePath* dev = devicePath();
    if (dev == nullptr) {
      return Route::kFallback;
    }
    if (reduce_op == nullptr) {
      return Route::kDevice;
    }
    bool ok = false;
    ReduceOp r = toReduceOp(*reduce_op, &ok);
    return ok && dev->supportsReduce(tensors[0].scalar_type(), r) ? Route::kDevice : Route::kFallback;
  }
  return Route::kFallback;
}

void ProcessGroupSMDDP::prepareHostMemory(const algorithm::OpArgs& a) const {
  const size_t block = a.count * a.elemSize();
  const size_t whole = block * static_cast<size_t>(size_);
  const size_t in = a.kind == CollectiveKind::kReduceScatter ? whole : block;
  const size_t out = a.kind == CollectiveKind::kAllGather ? whole : block;
  HugePages& pages = HugePages::process();
  pages.prepare(a.in, in, config_.huge_pages, config_.huge_pages_min_bytes);
  if (a.out != a.in) {
    pages.prepare(a.out, out, config_.huge_pages, config_.huge_pages_min_bytes);
  }
}

void ProcessGroupSMDDP::runOnHost(const algorithm::OpArgs& a) {
  switch (a.kind) {
    case CollectiveKind::kAllGather:
      communicator_->allGather(a);
      return;
    case CollectiveKind::kReduceScatter:
      communicator_->reduceScatter(a);
      return;
    case CollectiveKind::kAllReduce:
      communicator_->allReduce(a);
      return;
    case CollectiveKind::kBroadcast:
      communicator_->broadcast(a);
      return;
    case CollectiveKind::kBarrier:
      communicator_->barrier(a);
      return;
  }
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::submit(
    Route route,
    OpType op_type,
    const char* name,
    const algorithm::OpArgs& args,
    std::vector<at::Tensor> inputs,
    std::vector<at::Tensor> outputs,
    bool async_op,
    HostLayout layout) {
  if (route == Route::kDevice) {
    const uint64_t record = recorder_.issued(name, smddp::str(detailOf(args), ", ", outputs.at(0).device()));
    DevicePath::Call call = devicePath()->prepare(args.kind, args, inputs, outputs, record);
    return submitNative(op_type, name, "", outputs, inputs, async_op, 1, call.body, &call, record);
  }
  return submitOnHost(
      op_type, name, {args}, std::move(inputs), std::move(outputs), async_op, std::move(layout));
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::submitOnHost(
    OpType op_type,
    const char* name,
    std::vector<algorithm::OpArgs> calls,
    std::vector<at::Tensor> inputs,
    std::vector<at::Tensor> outputs,
    bool async_op,
    HostLayout layout) {
  const size_t n = calls.size();
  const std::string detail = n == 1 ? detailOf(calls[0]) : str(n, " calls, the first ", detailOf(calls[0]));
  // The closure keeps the tensors and their flat copies (and so the pointers
  // in calls) alive.
  return submitNative(
      op_type, name, detail, outputs, inputs, async_op, n,
      [this, calls = std::move(calls), inputs, outputs, layout = std::move(layout)](
          uint64_t seq, const Deadline& deadline) {
        // Before copyIn: the flat copies it writes are fresh, and the advice
        // gives them huge pages as they are written.
        for (const algorithm::OpArgs& a : calls) {
          prepareHostMemory(a);
        }
        layout.copyIn();
        for (size_t i = 0; i < calls.size(); ++i) {
          algorithm::OpArgs a = calls[i];
          a.seq = seq + i;
          a.deadline = deadline;
          runOnHost(a);
        }
        layout.copyOut();
      });
}

// ------------------------------------------------------------ one call's arguments
//
// Shared by each collective's single and coalesced forms; `index` names the
// pair of tensors in a coalesced call (-1: the single form).

namespace {

std::string nth(const char* what, int64_t index) {
  return index < 0 ? std::string(what) : str(what, " ", index);
}

algorithm::OpArgs opArgs(
    CollectiveKind kind,
    const algorithm::ReduceSpec& reduce,
    const void* in,
    void* out,
    size_t count) {
  algorithm::OpArgs a;
  a.kind = kind;
  a.reduce = reduce;
  a.in = in;
  a.out = out;
  a.count = count;
  return a;
}

algorithm::ReduceSpec moveSpec(DataType dtype) {
  algorithm::ReduceSpec spec;
  spec.dtype = dtype;
  return spec;
}

} // namespace

int64_t ProcessGroupSMDDP::perRankBlock(
    const char* op,
    const std::vector<at::Tensor>& list,
    bool list_is_output,
    const at::Tensor& single) const {
  const char* list_what = list_is_output ? "output" : "input";
  int64_t block = 0;
  for (size_t k = 0; k < list.size(); ++k) {
    const at::Tensor& t = list[k];
    checkStrided(where(op), t, nth(list_what, static_cast<int64_t>(k)));
    if (list_is_output) {
      checkWritable(where(op), t, nth(list_what, static_cast<int64_t>(k)));
      checkSameDtype(where(op), single, t);
    } else {
      checkSameDtype(where(op), t, single);
    }
    block = std::max(block, t.numel());
  }
  const at::Tensor& mine = list[static_cast<size_t>(rank_)];
  TORCH_CHECK(
      mine.numel() == single.numel(),
      where(op),
      list_what,
      " ",
      rank_,
      " (this rank's) must have the ",
      list_is_output ? "input" : "output",
      "'s ",
      single.numel(),
      " elements (got ",
      mine.numel(),
      ")");
  return block;
}

at::Tensor ProcessGroupSMDDP::nativeBuffer(
    Route route,
    HostLayout& layout,
    const char* op,
    const at::Tensor& t,
    const std::string& what,
    HostLayout::Access access) const {
  if (route == Route::kDevice) {
    checkContiguous(where(op), t, what);
    return t;
  }
  return layout.buffer(where(op), t, what, access);
}

algorithm::OpArgs ProcessGroupSMDDP::allReduceArgs(
    const char* op,
    Route route,
    HostLayout& layout,
    const at::Tensor& t,
    const ::c10d::ReduceOp& rop,
    int64_t index) const {
  at::Tensor buf = nativeBuffer(route, layout, op, t, nth("tensor", index), HostLayout::kReadWrite);
  return opArgs(
      CollectiveKind::kAllReduce, makeReduceSpec(op, t.scalar_type(), rop), buf.data_ptr(), buf.data_ptr(),
      static_cast<size_t>(t.numel()));
}

void ProcessGroupSMDDP::checkBlocks(
    const char* op,
    const at::Tensor& input,
    const at::Tensor& output,
    bool output_is_whole,
    int64_t index) const {
  checkStrided(where(op), input, nth("input", index));
  checkStrided(where(op), output, nth("output", index));
  checkSameDtype(where(op), input, output);
  const at::Tensor& whole = output_is_whole ? output : input;
  const at::Tensor& block = output_is_whole ? input : output;
  TORCH_CHECK(
      whole.numel() == block.numel() * size_,
      where(op),
      nth(output_is_whole ? "output" : "input", index),
      " has ",
      whole.numel(),
      " elements, expected ",
      block.numel(),
      output_is_whole ? " (input) x " : " (output) x ",
      size_,
      " (ranks) = ",
      block.numel() * size_);
}

at::Tensor ProcessGroupSMDDP::apartFrom(
    const char* op,
    Route route,
    HostLayout& layout,
    const at::Tensor& whole,
    const at::Tensor& block,
    HostLayout::Access access,
    int64_t index) const {
  if (!overlapsOutOfPlace(whole, block, rank_)) {
    return block;
  }
  TORCH_CHECK(
      route != Route::kDevice,
      where(op),
      nth("output", index),
      " and ",
      nth("input", index),
      " share memory other than as this rank's block of the larger one (the in-place layout); pass tensors "
      "that do not overlap, or the in-place layout");
  return layout.copy(block, access);
}

algorithm::OpArgs ProcessGroupSMDDP::allGatherArgs(
    const char* op,
    Route route,
    HostLayout& layout,
    const at::Tensor& input,
    const at::Tensor& output,
    int64_t index) const {
  checkBlocks(op, input, output, true, index);
  at::Tensor in = nativeBuffer(route, layout, op, input, nth("input", index), HostLayout::kRead);
  at::Tensor out = nativeBuffer(route, layout, op, output, nth("output", index), HostLayout::kWrite);
  // An input inside the output other than as this rank's block would be
  // overwritten before every peer has read it: gather from a copy.
  in = apartFrom(op, route, layout, out, in, HostLayout::kRead, index);
  MoveType m = moveType(input);
  return opArgs(CollectiveKind::kAllGather, moveSpec(m.dtype), in.data_ptr(), out.data_ptr(), m.count);
}

algorithm::OpArgs ProcessGroupSMDDP::reduceScatterArgs(
    const char* op,
    Route route,
    HostLayout& layout,
    const at::Tensor& input,
    const at::Tensor& output,
    const ::c10d::ReduceOp& rop,
    int64_t index) const {
  checkBlocks(op, input, output, false, index);
  at::Tensor in = nativeBuffer(route, layout, op, input, nth("input", index), HostLayout::kRead);
  at::Tensor out = nativeBuffer(route, layout, op, output, nth("output", index), HostLayout::kWrite);
  // An output inside the input other than as this rank's block would be
  // written while peers still read that part of the input: reduce into a
  // copy, written back when the call is done.
  out = apartFrom(op, route, layout, in, out, HostLayout::kWrite, index);
  return opArgs(
      CollectiveKind::kReduceScatter, makeReduceSpec(op, input.scalar_type(), rop), in.data_ptr(),
      out.data_ptr(), static_cast<size_t>(output.numel()));
}

// ------------------------------------------------------------ native ops

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::allreduce(
    std::vector<at::Tensor>& tensors,
    const ::c10d::AllreduceOptions& opts) {
  static const char* kOp = "allreduce";
  TORCH_CHECK(tensors.size() == 1, where(kOp), "takes exactly one tensor (got ", tensors.size(), ")");
  at::Tensor t = tensors[0];
  // Sparse tensors (DDP's gradients of sparse embeddings): gloo sums them.
  const Route r = t.defined() && t.is_sparse() ? Route::kFallback : route(kOp, {t}, &opts.reduceOp);
  if (r == Route::kFallback) {
    return fallbackFor(tensors, kOp)->allreduce(tensors, opts);
  }
  HostLayout layout;
  algorithm::OpArgs a = allReduceArgs(kOp, r, layout, t, opts.reduceOp);
  return submit(r, OpType::ALLREDUCE, kOp, a, {t}, {t}, opts.asyncOp, std::move(layout));
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::allreduce_coalesced(
    std::vector<at::Tensor>& tensors,
    const ::c10d::AllreduceCoalescedOptions& opts) {
  static const char* kOp = "allreduce_coalesced";
  if (tensors.empty()) {
    return makeCompletedWork(rank_, OpType::ALLREDUCE_COALESCED, {});
  }
  if (route(kOp, tensors, &opts.reduceOp) != Route::kHost) {
    return fallbackFor(tensors, kOp)->allreduce_coalesced(tensors, opts);
  }
  HostLayout layout;
  std::vector<algorithm::OpArgs> calls;
  for (size_t i = 0; i < tensors.size(); ++i) {
    calls.push_back(allReduceArgs(kOp, Route::kHost, layout, tensors[i], opts.reduceOp, static_cast<int64_t>(i)));
  }
  return submitOnHost(
      OpType::ALLREDUCE_COALESCED, kOp, std::move(calls), tensors, tensors, opts.asyncOp, std::move(layout));
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::broadcast(
    std::vector<at::Tensor>& tensors,
    const ::c10d::BroadcastOptions& opts) {
  static const char* kOp = "broadcast";
  TORCH_CHECK(tensors.size() == 1, where(kOp), "takes exactly one tensor (got ", tensors.size(), ")");
  TORCH_CHECK(
      opts.rootRank >= 0 && opts.rootRank < size_,
      where(kOp),
      "root rank ",
      opts.rootRank,
      " is not in the group (size ",
      size_,
      ")");
  TORCH_CHECK(opts.rootTensor == 0, where(kOp), "root tensor must be 0 (got ", opts.rootTensor, ")");
  at::Tensor t = tensors[0];
  const Route r = route(kOp, {t}, nullptr);
  if (r == Route::kFallback) {
    return fallbackFor(tensors, kOp)->broadcast(tensors, opts);
  }
  HostLayout layout;
  // Only the root's values are read.
  at::Tensor buf = nativeBuffer(
      r, layout, kOp, t, "tensor", rank_ == opts.rootRank ? HostLayout::kReadWrite : HostLayout::kWrite);
  MoveType m = moveType(t);
  algorithm::OpArgs a =
      opArgs(CollectiveKind::kBroadcast, moveSpec(m.dtype), buf.data_ptr(), buf.data_ptr(), m.count);
  a.root = static_cast<int>(opts.rootRank);
  return submit(r, OpType::BROADCAST, kOp, a, {t}, {t}, opts.asyncOp, std::move(layout));
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::_allgather_base(
    at::Tensor& output,
    at::Tensor& input,
    const ::c10d::AllgatherOptions& opts) {
  static const char* kOp = "allgather_into_tensor";
  const Route r = route(kOp, {input, output}, nullptr);
  if (r == Route::kFallback) {
    return fallbackFor({input}, kOp)->_allgather_base(output, input, opts);
  }
  HostLayout layout;
  algorithm::OpArgs a = allGatherArgs(kOp, r, layout, input, output);
  return submit(r, OpType::_ALLGATHER_BASE, kOp, a, {input}, {output}, opts.asyncOp, std::move(layout));
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& opts) {
  static const char* kOp = "allgather_into_tensor_coalesced";
  TORCH_CHECK(
      outputs.size() == inputs.size(),
      where(kOp),
      "got ",
      outputs.size(),
      " outputs for ",
      inputs.size(),
      " inputs");
  if (inputs.empty()) {
    return makeCompletedWork(rank_, compat::opAllgatherIntoTensorCoalesced(), {});
  }
  std::vector<at::Tensor> all = inputs;
  all.insert(all.end(), outputs.begin(), outputs.end());
  if (route(kOp, all, nullptr) != Route::kHost) {
    return fallbackFor(inputs, kOp)->allgather_into_tensor_coalesced(outputs, inputs, opts);
  }
  HostLayout layout;
  std::vector<algorithm::OpArgs> calls;
  for (size_t i = 0; i < inputs.size(); ++i) {
    calls.push_back(allGatherArgs(kOp, Route::kHost, layout, inputs[i], outputs[i], static_cast<int64_t>(i)));
  }
  return submitOnHost(
      compat::opAllgatherIntoTensorCoalesced(), kOp, std::move(calls), inputs, outputs, opts.asyncOp,
      std::move(layout));
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::allgather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& opts) {
  static const char* kOp = "allgather";
  TORCH_CHECK(inputs.size() == 1, where(kOp), "takes exactly one input tensor (got ", inputs.size(), ")");
  TORCH_CHECK(
      outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(size_),
      where(kOp),
      "needs one output list of ",
      size_,
      " tensors (one per rank)");
  at::Tensor in = inputs[0];
  std::vector<at::Tensor> all = outputs[0];
  all.push_back(in);
  if (route(kOp, all, nullptr) != Route::kHost) {
    return fallbackFor(inputs, kOp)->allgather(outputs, inputs, opts);
  }
  checkStrided(where(kOp), in, "input");
  // Output k takes rank k's input, whose size may differ from rank to rank
  // (as nccl allows): every rank pads its input to the largest.
  const int64_t block = perRankBlock(kOp, outputs[0], true, in);
  HostLayout layout;
  at::Tensor src = layout.padded(in, block, HostLayout::kRead);
  at::Tensor flat = layout.blocks(outputs[0], block, HostLayout::kWrite);
  MoveType m = moveType(src);
  return submitOnHost(
      OpType::ALLGATHER, kOp,
      {opArgs(CollectiveKind::kAllGather, moveSpec(m.dtype), src.data_ptr(), flat.data_ptr(), m.count)},
      {in}, outputs[0], opts.asyncOp, std::move(layout));
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& opts) {
  static const char* kOp = "allgather_coalesced";
  TORCH_CHECK(
      outputs.size() == static_cast<size_t>(size_),
      where(kOp),
      "needs ",
      size_,
      " output lists (one per rank), got ",
      outputs.size());
  std::vector<at::Tensor> all = inputs;
  for (const auto& list : outputs) {
    TORCH_CHECK(
        list.size() == inputs.size(),
        where(kOp),
        "every output list needs ",
        inputs.size(),
        " tensors");
    for (size_t i = 0; i < list.size(); ++i) {
      checkStrided(where(kOp), list[i], nth("output", static_cast<int64_t>(i)));
      checkWritable(where(kOp), list[i], nth("output", static_cast<int64_t>(i)));
      checkSameDtype(where(kOp), inputs[i], list[i]);
      TORCH_CHECK(list[i].numel() == inputs[i].numel(), where(kOp), "output ", i, " has the wrong size");
    }
    all.insert(all.end(), list.begin(), list.end());
  }
  if (route(kOp, all, nullptr) != Route::kHost) {
    return fallbackFor(inputs, kOp)->allgather_coalesced(outputs, inputs, opts);
  }
  // Output list r takes rank r's inputs: input i's gather lands in the
  // i-th tensor of every list.
  HostLayout layout;
  std::vector<algorithm::OpArgs> calls;
  std::vector<at::Tensor> all_outs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    at::Tensor src = layout.buffer(where(kOp), inputs[i], nth("input", static_cast<int64_t>(i)), HostLayout::kRead);
    std::vector<at::Tensor> gathered;
    for (const auto& list : outputs) {
      gathered.push_back(list[i]);
      all_outs.push_back(list[i]);
    }
    at::Tensor flat = layout.blocks(gathered, src.numel(), HostLayout::kWrite);
    MoveType m = moveType(src);
    calls.push_back(opArgs(CollectiveKind::kAllGather, moveSpec(m.dtype), src.data_ptr(), flat.data_ptr(), m.count));
  }
  return submitOnHost(
      OpType::ALLGATHER_COALESCED, kOp, std::move(calls), inputs, all_outs, opts.asyncOp, std::move(layout));
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::_reduce_scatter_base(
    at::Tensor& output,
    at::Tensor& input,
    const ::c10d::ReduceScatterOptions& opts) {
  static const char* kOp = "reduce_scatter_tensor";
  const Route r = route(kOp, {input, output}, &opts.reduceOp);
  if (r == Route::kFallback) {
    return fallbackFor({input}, kOp)->_reduce_scatter_base(output, input, opts);
  }
  HostLayout layout;
  algorithm::OpArgs a = reduceScatterArgs(kOp, r, layout, input, output, opts.reduceOp);
  return submit(
      r, OpType::_REDUCE_SCATTER_BASE, kOp, a, {input}, {output}, opts.asyncOp, std::move(layout));
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const ::c10d::ReduceScatterOptions& opts) {
  static const char* kOp = "reduce_scatter_tensor_coalesced";
  TORCH_CHECK(
      outputs.size() == inputs.size(),
      where(kOp),
      "got ",
      outputs.size(),
      " outputs for ",
      inputs.size(),
      " inputs");
  if (inputs.empty()) {
    return makeCompletedWork(rank_, compat::opReduceScatterTensorCoalesced(), {});
  }
  std::vector<at::Tensor> all = inputs;
  all.insert(all.end(), outputs.begin(), outputs.end());
  if (route(kOp, all, &opts.reduceOp) != Route::kHost) {
    return fallbackFor(inputs, kOp)->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  }
  HostLayout layout;
  std::vector<algorithm::OpArgs> calls;
  for (size_t i = 0; i < inputs.size(); ++i) {
    calls.push_back(reduceScatterArgs(
        kOp, Route::kHost, layout, inputs[i], outputs[i], opts.reduceOp, static_cast<int64_t>(i)));
  }
  return submitOnHost(
      compat::opReduceScatterTensorCoalesced(), kOp, std::move(calls), inputs, outputs, opts.asyncOp,
      std::move(layout));
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::reduce_scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const ::c10d::ReduceScatterOptions& opts) {
  static const char* kOp = "reduce_scatter";
  TORCH_CHECK(outputs.size() == 1, where(kOp), "takes exactly one output tensor (got ", outputs.size(), ")");
  TORCH_CHECK(
      inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(size_),
      where(kOp),
      "needs one input list of ",
      size_,
      " tensors (one per rank)");
  at::Tensor out = outputs[0];
  std::vector<at::Tensor> all = inputs[0];
  all.insert(all.begin(), out);
  if (route(kOp, all, &opts.reduceOp) != Route::kHost) {
    return fallbackFor(outputs, kOp)->reduce_scatter(outputs, inputs, opts);
  }
  checkStrided(where(kOp), out, "output");
  checkWritable(where(kOp), out, "output");
  // Input k is this rank's part of rank k's output, whose size may differ
  // from rank to rank (as gloo allows): every block is padded to the
  // largest.
  const int64_t block = perRankBlock(kOp, inputs[0], false, out);
  algorithm::ReduceSpec spec = makeReduceSpec(kOp, out.scalar_type(), opts.reduceOp);
  HostLayout layout;
  // The padding of shorter blocks is reduced too, and dropped.
  at::Tensor flat = layout.blocks(inputs[0], block, HostLayout::kRead);
  at::Tensor res = layout.padded(out, block, HostLayout::kWrite);
  return submitOnHost(
      OpType::REDUCE_SCATTER, kOp,
      {opArgs(CollectiveKind::kReduceScatter, spec, flat.data_ptr(), res.data_ptr(), static_cast<size_t>(block))},
      inputs[0], {out}, opts.asyncOp, std::move(layout));
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::barrier(const ::c10d::BarrierOptions& opts) {
  static const char* kOp = "barrier";
  checkOpen(kOp);
  if (!communicator_) {
    return fallbackFor(c10::DeviceType::CPU, kOp)->barrier(opts);
  }
  return submitNative(
      OpType::BARRIER, kOp, "", {}, std::nullopt, opts.asyncOp, 1,
      [this](uint64_t seq, const Deadline& deadline) {
        // As with nccl, a barrier also waits for the device collectives
        // enqueued before it.
        {
          std::unique_lock<std::mutex> lock(device_mu_);
          DevicePath* dev = device_.get();
          lock.unlock();
          if (dev != nullptr) {
            dev->synchronize(deadline);
          }
        }
        algorithm::OpArgs a;
        a.kind = CollectiveKind::kBarrier;
        a.seq = seq;
        a.deadline = deadline;
        communicator_->barrier(a);
      });
}

algorithm::ReduceSpec ProcessGroupSMDDP::makeReduceSpec(
    const char* op,
    at::ScalarType dtype,
    const ::c10d::ReduceOp& rop) const {
  bool ok = false;
  algorithm::ReduceSpec spec;
  spec.dtype = toDataType(dtype, &ok);
  spec.op = toReduceOp(rop, &ok);
  TORCH_CHECK(
      reduceOpSupported(spec.dtype, spec.op),
      where(op),
      "ReduceOp.",
      c10dReduceOpName(rop),
      " is not defined for ",
      dtype,
      " tensors; ",
      spec.op == ReduceOp::kAvg ? "use SUM and divide, or a floating-point tensor"
                                : "use a floating-point tensor");
  double premul = 1.0;
  if (spec.op == ReduceOp::kPremulSum) {
    auto* sup = dynamic_cast<compat::PreMulSumSupplement*>(rop.supplement_.get());
    TORCH_CHECK(sup != nullptr, where(op), "PREMUL_SUM without a factor");
    premul = sup->tensor_factor.defined() ? sup->tensor_factor.item<double>() : sup->double_factor;
  }
  return algorithm::collectiveReduceSpec(spec.dtype, spec.op, premul, size_);
}

// ------------------------------------------------------------ delegated ops

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::allreduce_sparse(
    std::vector<at::Tensor>& tensors,
    const ::c10d::AllreduceOptions& opts) {
  return fallbackFor(tensors, "allreduce_sparse")->allreduce_sparse(tensors, opts);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::reduce(
    std::vector<at::Tensor>& tensors,
    const ::c10d::ReduceOptions& opts) {
  return fallbackFor(tensors, "reduce")->reduce(tensors, opts);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::gather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const ::c10d::GatherOptions& opts) {
  return fallbackFor(inputs, "gather")->gather(outputs, inputs, opts);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const ::c10d::ScatterOptions& opts) {
  return fallbackFor(outputs, "scatter")->scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::alltoall_base(
    at::Tensor& output,
    at::Tensor& input,
    std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes,
    const ::c10d::AllToAllOptions& opts) {
  return fallbackFor({input}, "all_to_all_single")
      ->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::alltoall(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const ::c10d::AllToAllOptions& opts) {
  return fallbackFor(inputs, "all_to_all")->alltoall(outputs, inputs, opts);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::send(
    std::vector<at::Tensor>& tensors,
    int dst_rank,
    int tag) {
  return fallbackFor(tensors, "send")->send(tensors, dst_rank, tag);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::recv(
    std::vector<at::Tensor>& tensors,
    int src_rank,
    int tag) {
  return fallbackFor(tensors, "recv")->recv(tensors, src_rank, tag);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSMDDP::recvAnysource(
    std::vector<at::Tensor>& tensors,
    int tag) {
  return fallbackFor(tensors, "recv")->recvAnysource(tensors, tag);
}

void ProcessGroupSMDDP::monitoredBarrier(const ::c10d::BarrierOptions& opts, bool wait_all_ranks) {
  fallbackFor(c10::DeviceType::CPU, "monitored_barrier")->monitoredBarrier(opts, wait_all_ranks);
}

// ------------------------------------------------------------ lifecycle

void ProcessGroupSMDDP::abort() {
  aborted_.store(true);
  if (communicator_) {
    communicator_->interrupt(str("rank ", rank_, " aborted the group"));
  }
  {
    std::lock_guard<std::mutex> lock(device_mu_);
    if (device_) {
      device_->abort(str("rank ", rank_, " aborted the group"));
    }
  }
  close(/*graceful=*/false);
}

void ProcessGroupSMDDP::shutdown() {
  close(/*graceful=*/true);
}

void ProcessGroupSMDDP::close(bool graceful) {
  if (shut_down_.exchange(true)) {
    return;
  }
  if (executor_) {
    executor_->shutdown(nullptr);
  }
  std::unordered_map<int, Ptr<::c10d::Backend>> fallbacks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fallbacks = fallbacks_;
  }
  // An abort does not wait for the fallbacks either (a graceful shutdown
  // of nccl's would wait for its pending work, which may never end).
  for (auto& kv : fallbacks) {
    if (graceful) {
      kv.second->shutdown();
    } else {
      kv.second->abort();
    }
  }
  {
    // After the executor: no device collective is being enqueued.
    std::lock_guard<std::mutex> lock(device_mu_);
    device_.reset();
  }
  communicator_.reset();
}

c10::intrusive_ptr<::c10d::Backend> ProcessGroupSMDDP::split(
    const Ptr<::c10d::Store>& store,
    const std::vector<int>& ranks,
    const Ptr<::c10d::Backend::Options>& opts) {
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) {
    return nullptr;
  }
  const int new_rank = static_cast<int>(it - ranks.begin());
  std::vector<int64_t> global;
  for (int r : ranks) {
    global.push_back(global_ranks_.empty() ? r : global_ranks_[static_cast<size_t>(r)]);
  }
  auto timeout = opts ? opts->timeout : std::chrono::milliseconds(timeout_ms_.load());
  std::string name = opts ? opts->group_name : group_name_ + ":split";
  return c10::make_intrusive<ProcessGroupSMDDP>(
      store, new_rank, static_cast<int>(ranks.size()), timeout, global, name);
}

void ProcessGroupSMDDP::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ms_.store(timeout.count());
  options_->timeout = timeout;
}

uint64_t ProcessGroupSMDDP::getSequenceNumberForGroup() {
  return next_seq_.load();
}

::c10d::ErrorType ProcessGroupSMDDP::getError() {
  return broken_.load() ? ::c10d::ErrorType::COMM_ERROR : ::c10d::ErrorType::SUCCESS;
}

} // namespace smddp
