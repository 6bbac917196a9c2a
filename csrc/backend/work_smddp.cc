#include "backend/work_smddp.h"

#include <ATen/ThreadLocalState.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <unordered_map>

#include "backend/executor.h"
#include "common/error.h"

namespace smddp {

namespace {

c10::intrusive_ptr<c10::ivalue::Future> makeFuture(const std::vector<at::Tensor>& outputs) {
  std::vector<c10::Device> devices;
  for (const auto& t : outputs) {
    if (t.defined() && !t.is_cpu()) {
      devices.push_back(t.device());
      break;
    }
  }
  return c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()), devices);
}

} // namespace

WorkSMDDP::WorkSMDDP(
    int rank,
    ::c10d::OpType op_type,
    uint64_t nseq,
    const char* name,
    std::vector<at::Tensor> outputs,
    std::function<void(uint64_t)> body,
    std::shared_ptr<Executor> executor,
    std::chrono::milliseconds timeout,
    const char* profiling_title,
    const std::optional<std::vector<at::Tensor>>& inputs)
    : ::c10d::Work(rank, op_type, nullptr, inputs),
      nseq_(nseq),
      name_(name),
      outputs_(std::move(outputs)),
      body_(std::move(body)),
      executor_(std::move(executor)),
      timeout_(timeout) {
  if (profiling_title == nullptr || !body_) {
    return;
  }
  // The span opens where the body starts, not here: a queued async call
  // would otherwise show as running while it waits for the ones before it.
  auto span = std::make_shared<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (!span->isActive()) {
    return;
  }
  std::vector<c10::IValue> args;
  if (inputs) {
    args.assign(inputs->begin(), inputs->end());
  }
  span_begin_ = at::wrapPropagateTLSState([span, profiling_title, args = std::move(args)]() {
    span->_setAsync();  // it may end on another thread than the caller's
    span->before(profiling_title, c10::ArrayRef<const c10::IValue>(args.data(), args.size()));
  });
  span_end_ = at::wrapPropagateTLSState([span]() { span->end(); });
}

const char* WorkSMDDP::profilingTitle(const char* op) {
  if (!at::hasCallbacks()) {
    return nullptr;
  }
  static std::mutex mu;
  // Never freed: a profiler may read a title after the group is gone.
  static auto* titles = new std::unordered_map<std::string, std::unique_ptr<const std::string>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& title = (*titles)[op];
  if (!title) {
    title = std::make_unique<const std::string>(str("smddp:", op));
  }
  return title->c_str();
}

std::string WorkSMDDP::label() const {
  const uint64_t s = seq_.load(std::memory_order_acquire);
  return s == kNotStarted ? str(name_, " (not started)") : str(name_, " #", s);
}

WorkSMDDP::~WorkSMDDP() = default;

bool WorkSMDDP::isCompleted() {
  if (!done_.load(std::memory_order_acquire)) {
    return false;
  }
  return !gpu_done_ || exception_ || deviceException() || gpu_done_();
}

void WorkSMDDP::setDeviceHooks(
    std::function<void()> on_wait,
    std::function<bool()> gpu_done,
    std::function<std::string()> device_error,
    std::function<void(const std::function<void()>&)> context) {
  on_wait_ = std::move(on_wait);
  gpu_done_ = std::move(gpu_done);
  device_error_ = std::move(device_error);
  context_ = std::move(context);
}

std::exception_ptr WorkSMDDP::deviceException() const {
  if (!device_error_ || !done_.load(std::memory_order_acquire)) {
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(device_mu_);
  if (!device_exception_) {
    const std::string why = device_error_();
    if (!why.empty()) {
      device_exception_ = std::make_exception_ptr(c10::DistBackendError(
          c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, why));
    }
  }
  return device_exception_;
}

std::exception_ptr WorkSMDDP::exception() const {
  std::exception_ptr host = ::c10d::Work::exception();
  return host ? host : deviceException();
}

bool WorkSMDDP::isSuccess() const {
  return !exception();
}

void WorkSMDDP::synchronize() {
  if (!on_wait_) {
    return;
  }
  // The end event exists once the host part has run: wait for it (errors
  // surface in wait(), not here), then make the caller's stream wait.
  std::unique_lock<std::mutex> lock = waitHost();
  lock.unlock();
  if (!exception_) {
    on_wait_();
  }
}

std::vector<at::Tensor> WorkSMDDP::result() {
  return outputs_;
}

std::chrono::milliseconds WorkSMDDP::getTimeout() const {
  return timeout_;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkSMDDP::getFuture() {
  c10::intrusive_ptr<c10::ivalue::Future> born_done;
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(future_mu_);
    if (!future_) {
      future_ = makeFuture(outputs_);
      if (future_done_) {
        born_done = future_;
      }
    }
    future = future_;
  }
  if (born_done) {
    markFuture(born_done);
  }
  return future;
}

void WorkSMDDP::markFuture(const c10::intrusive_ptr<c10::ivalue::Future>& future) {
  // Outside future_mu_: the callbacks may call anything, this work's
  // getFuture() included. (A callback's own exception is the future's
  // business: c10 catches it and fails the chained future.)
  auto mark = [&] {
    if (error_) {
      future->setError(error_);
    } else {
      future->markCompleted(c10::IValue(outputs_));
    }
  };
  try {
    if (context_) {
      context_(mark);
    } else {
      mark();
    }
  } catch (...) {
    // Marking itself failed (a CUDA event after an abort, say): the
    // future's waiters get that error instead of waiting for ever.
    future->setErrorIfNeeded(std::current_exception());
  }
}

void WorkSMDDP::runBody(uint64_t first) {
  seq_.store(first, std::memory_order_release);
  if (span_begin_) {
    span_begin_();
  }
  try {
    body_(first);
  } catch (...) {
    error_ = std::current_exception();
  }
  if (span_end_) {
    span_end_();
  }
  // Drop the closures (and the tensors they hold) before waking anyone.
  dropClosures();
}

void WorkSMDDP::dropClosures() {
  body_ = nullptr;
  span_begin_ = nullptr;
  span_end_ = nullptr;
}

void WorkSMDDP::fail(std::exception_ptr error) {
  abandon(error);
  markFuture();
}

void WorkSMDDP::abandon(std::exception_ptr error) {
  dropClosures();
  error_ = error;
  finishUp();
}

void WorkSMDDP::markFuture() {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(future_mu_);
    future_done_ = true;
    future = future_;
  }
  if (future) {
    markFuture(future);
  }
}

void WorkSMDDP::finishUp() {
  done_.store(true, std::memory_order_release);
  finish(error_);
}

std::unique_lock<std::mutex> WorkSMDDP::waitHost() {
  // Runs the work here if it is next: only for unbounded waits, since that
  // would block past a caller's timeout.
  if (!done_.load(std::memory_order_acquire) && executor_) {
    executor_->prepareWait(this, true);
  }
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return completed_; });
  return lock;
}

bool WorkSMDDP::wait(std::chrono::milliseconds timeout) {
  const bool counted = timeout != kNoTimeout && !done_.load(std::memory_order_acquire) && executor_ &&
      executor_->prepareWait(this, false);
  std::unique_lock<std::mutex> lock = timeout == kNoTimeout ? waitHost() : std::unique_lock<std::mutex>(mutex_);
  if (timeout != kNoTimeout && !cv_.wait_for(lock, timeout, [&] { return completed_; })) {
    lock.unlock();
    if (counted) {
      executor_->cancelWait(this);
    }
    TORCH_CHECK_WITH(
        DistBackendError,
        false,
        "ProcessGroupSMDDP: wait() on ",
        label(),
        " gave up after ",
        timeout.count(),
        " ms; the collective is still running and fails on its own when the "
        "group's timeout (",
        timeout_.count(),
        " ms) expires");
  }
  if (exception_) {
    std::rethrow_exception(exception_);
  }
  lock.unlock();
  if (std::exception_ptr device = deviceException()) {
    std::rethrow_exception(device);
  }
  if (on_wait_) {
    on_wait_();
  }
  return true;
}

c10::intrusive_ptr<::c10d::Work> makeCompletedWork(
    int rank,
    ::c10d::OpType op_type,
    std::vector<at::Tensor> outputs,
    std::exception_ptr error) {
  auto work = c10::make_intrusive<WorkSMDDP>(
      rank,
      op_type,
      0,
      "local operation",
      std::move(outputs),
      nullptr,
      nullptr,
      std::chrono::milliseconds(0));
  work->fail(error);
  return work;
}

} // namespace smddp
