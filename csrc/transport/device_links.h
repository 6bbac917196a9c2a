// What the set-up of a device communicator needs from the device runtime:
// the identity of a rank's device, and the export and import of the memory
// and events the ranks of one node share. The CUDA path implements it with
// CUDA IPC (transport/cuda/ipc_arena.h); the native tests implement it on
// the host, so that the set-up protocol (algorithm/device_setup.h) is tested
// without a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace smddp::transport {

class DeviceLinks {
 public:
  virtual ~DeviceLinks() = default;
  // Identifies this rank's device in the job: ranks with equal identities
  // share a device ("<host identity>/<PCI bus id>").
  virtual std::string identity() = 0;
  // Exports what the node's peers map (buffers, events); the bytes go to
  // them. Throws Error.
  virtual std::vector<uint8_t> exportLocal() = 0;
  // Maps local rank l's export. Throws Error.
  virtual void importPeer(int local_rank, const std::vector<uint8_t>& exported) = 0;
  // Closes every peer's export this rank mapped (idempotent).
  virtual void closeImports() = 0;
  // Frees this rank's exports: only once every peer has closed them, which
  // CUDA requires (the set-up meets the node in between).
  virtual void releaseExports() = 0;
};

} // namespace smddp::transport
