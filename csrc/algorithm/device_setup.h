// The set-up of a group's device communicator, apart from the device runtime:
// which schedule the device collectives take, under which store keys the
// communicator's ranks meet, and whether the ranks of each node can map each
// other's device memory, through transport::DeviceLinks (CUDA IPC in the
// CUDA path, a host implementation in the native tests).
//
// Keys. A group's k-th device communicator (one per device a rank drives,
// created at its first collective on that device, so in the same order on
// every rank) meets under "smddp/device/<k>" of the group's store, whatever
// device each rank drives. Under torchrun local rank l drives cuda:l: a key
// made from the device would differ between the ranks of one node, and each
// would wait for the others for ever.
//
// Modes, the same on every rank of the group:
//   node          one node: CUDA IPC between its ranks
//   rails         several uniform nodes, a GPU per rank: IPC inside nodes,
//                 one NCCL communicator per rail between them
//   host staging  anything else, SMDDP_CUDA_IPC=off, or a rank on which the
//                 IPC link failed (a sandboxed runtime, say): copies to host
//                 memory and the group's CPU schedules
//
// Linking is collective over each node and agreed over the group: a rank
// whose export fails still publishes why, so that no peer waits for it, and
// every rank learns which rank failed and takes host staging with the rest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/store.h"
#include "topology/topology.h"
#include "transport/device_links.h"

namespace smddp::algorithm {

// Sources one device reduction kernel reads at once: nodes with more local
// ranks reduce through the fallback backend.
constexpr int kMaxDeviceSources = 16;

enum class DeviceMode : uint8_t { kNode, kRails, kHostStaging };

const char* deviceModeName(DeviceMode mode);

// What a device collective of this rank waits on in `mode`, and why it
// might never end, for the message of one that outlives the group's
// timeout ("" for host staging, whose waits name their peers themselves).
std::string deviceWaitsOn(DeviceMode mode, const topology::Topology& topo);

// Whether SMDDP_CUDA_SYNC=device serves a node of `local_size` ranks: a
// device-side step waits on at most kMaxDeviceSources peers' flags.
inline bool deviceSyncServes(int local_size) {
  return local_size <= kMaxDeviceSources;
}

// Why a collective of a communicator in `mode` cannot be captured in a CUDA
// graph, as the end of a sentence ("" if it can): a graph replays what the
// GPU does, not the rounds of the host threads.
std::string captureRefusal(DeviceMode mode, bool device_sync, int local_size);

struct DevicePlan {
  DeviceMode mode = DeviceMode::kHostStaging;
  // Every store key of the communicator begins with it.
  std::string scope;
  // Why the mode is host staging ("" otherwise), for the log.
  std::string why;
  // Whether the node's ranks fit one reduction kernel (kMaxDeviceSources).
  bool reduce_on_device = false;

  std::string key(const std::string& what) const {
    return scope + "/" + what;
  }
};

class DeviceSetup {
 public:
  DeviceSetup(const topology::Topology& topology, const Config& config);

  // Whether reductions can run on the device for this topology, known before
  // any communicator exists.
  bool reduceOnDevice() const;

  // Collective over the group: the plan of this rank's next device
  // communicator; unless it is host staging, `links` is linked to the node's
  // peers. Throws Error (kTimeout naming the key) if a rank does not come.
  DevicePlan plan(Store& store, transport::DeviceLinks& links);

 private:
  topology::Topology topo_;
  Config config_;
  int next_ = 0;
};

} // namespace smddp::algorithm
