// The device (CUDA) half of ProcessGroupSMDDP, behind an interface, so that
// it lives in an extension module of its own (smddp._C_cuda, built from
// csrc/*/cuda/): `import smddp` never loads a CUDA library, and a CUDA module
// that cannot be loaded (a driver or library mismatch) costs CUDA tensors
// their native path, with a warning, and nothing else.
//
// The CUDA module registers its factory when it is imported. The backend
// asks the Python layer to import it (the loader) the first time a CUDA
// tensor reaches a native collective of any group, once per process.
//
// Stream semantics are ProcessGroupNCCL's:
//   call time (caller's thread)   an event on the caller's current stream;
//                                 the tensors are recorded on the group's
//                                 communication stream (recordStream)
//   run time (executor)           the communication stream waits for that
//                                 event, the collective is enqueued on it,
//                                 an end event is recorded after it
//   wait() / synchronize()        the caller's current stream waits for the
//                                 end event (the host does not block)
//   is_completed()                enqueued, and the end event has fired
//
// Failures: every device collective is watched until its end event fires;
// one that outlives the group's timeout, or an asynchronous error of a
// communicator, aborts the device communicators (so that the GPU work ends),
// fails the collective's Work and makes the group unusable (on_failure).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithm/communicator.h"
#include "algorithm/op.h"
#include "common/config.h"
#include "common/flight_recorder.h"
#include "topology/topology.h"

namespace smddp {

class DevicePath {
 public:
  // What the backend needs to run one device collective.
  struct Call {
    // Runs on the executor: enqueue the collective.
    std::function<void(uint64_t seq, const Deadline& deadline)> body;
    // Called by Work::wait()/synchronize() after the body ran.
    std::function<void()> on_wait;
    // Whether the GPU has finished (for is_completed()).
    std::function<bool()> gpu_done;
    // The failure the watchdog found for this call, "" while there is none.
    std::function<std::string()> device_error;
    // Runs the completion of the Work's future with the communication
    // stream current (CUDA futures record their events on current streams).
    std::function<void(const std::function<void()>&)> completion_context;
  };

  virtual ~DevicePath() = default;

  // Whether reductions of this dtype/op run natively on the device.
  virtual bool supportsReduce(at::ScalarType dtype, ReduceOp op) const = 0;

  // Prepares `kind` on device tensors (all on one device): `args` has
  // everything but seq and deadline. `record` is the call's flight-recorder
  // entry.
  virtual Call prepare(
      CollectiveKind kind,
      const algorithm::OpArgs& args,
      const std::vector<at::Tensor>& inputs,
      const std::vector<at::Tensor>& outputs,
      uint64_t record) = 0;

  // Blocks until every device collective enqueued so far has finished on
  // the device (barrier()); throws Error(kTimeout) at the deadline.
  virtual void synchronize(const Deadline& deadline) = 0;

  // From any thread: device work in flight fails instead of hanging.
  virtual void abort(const std::string& why) = 0;

  virtual std::string describe() const = 0;
};

struct DevicePathArgs {
  // The group's store (its keys already scoped to this group's generation).
  c10::intrusive_ptr<::c10d::Store> store;
  // The group's topology; outlives the device path.
  const topology::Topology* topology = nullptr;
  Config config;
  std::chrono::milliseconds timeout{0};
  // The group's CPU communicator (host staging); outlives the device path.
  algorithm::Communicator* host = nullptr;
  // "group 'name', rank r of n", for messages.
  std::string who;
  // The group's flight recorder; outlives the device path.
  FlightRecorder* recorder = nullptr;
  // Called once, from the watchdog's thread, when device work fails.
  std::function<void(const std::string& why)> on_failure;
};

using DevicePathFactory = std::function<std::unique_ptr<DevicePath>(const DevicePathArgs&)>;

// Called by the CUDA module when it is imported.
void registerDevicePathFactory(DevicePathFactory factory);

// Set by the Python layer: imports the CUDA module and returns "" or why it
// could not.
void setDevicePathLoader(std::function<std::string()> loader);

// The factory, after loading the CUDA module if nothing is registered yet
// (once per process: a failure is logged once and remembered). Null, with
// `why` set, when there is none.
DevicePathFactory devicePathFactory(std::string* why);

} // namespace smddp
