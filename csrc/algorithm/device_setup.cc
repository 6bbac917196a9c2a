#include "algorithm/device_setup.h"

#include <algorithm>
#include <map>

#include "common/error.h"
#include "common/log.h"

namespace smddp::algorithm {

namespace {

// What a rank publishes after its export: 1 + the bytes, or 0 + why not.
std::vector<uint8_t> exportRecord(bool ok, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out;
  out.reserve(payload.size() + 1);
  out.push_back(ok ? 1 : 0);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

} // namespace

std::string deviceWaitsOn(DeviceMode mode, const topology::Topology& topo) {
  const auto others = [&](std::vector<int> ranks) {
    ranks.erase(std::remove(ranks.begin(), ranks.end(), topo.rank()), ranks.end());
    return ranks;
  };
  const std::vector<int> node = others(topo.nodeRanks(topo.myNode()));
  switch (mode) {
    case DeviceMode::kNode:
      return str("it waits on ", topology::rankList(node), " of its node (CUDA IPC): one of them has not reached ",
                 "it, or has device work before it that does not end");
    case DeviceMode::kRails: {
      const std::string rail = str(topology::rankList(others(topo.railRanks(topo.myLocalRank()))),
                                   " of its rail on other nodes (NCCL)");
      return str("it waits on ", node.empty() ? rail : str(topology::rankList(node), " of its node (CUDA IPC) and ", rail),
                 ": one of them has not reached it, has device work before it that does not end, or called another ",
                 "collective or size (calls are not compared across nodes; TORCH_DISTRIBUTED_DEBUG=DETAIL has torch ",
                 "compare them on every rank before each one runs)");
    }
    case DeviceMode::kHostStaging:
      return std::string();
  }
  return std::string();
}

std::string captureRefusal(DeviceMode mode, bool device_sync, int local_size) {
  if (mode == DeviceMode::kHostStaging) {
    return "this group's CUDA collectives stage through the host, which the CPU runs: run it outside the capture";
  }
  if (!device_sync && local_size > 1) {
    return str("the ", local_size, " ranks of its node meet in host rounds: ",
               deviceSyncServes(local_size) ? std::string("set SMDDP_CUDA_SYNC=device (or memops) on every rank")
                                            : str("nodes of more than ", kMaxDeviceSources, " ranks cannot be captured"));
  }
  return std::string();
}

const char* deviceModeName(DeviceMode mode) {
  switch (mode) {
    case DeviceMode::kNode:
      return "node";
    case DeviceMode::kRails:
      return "rails";
    case DeviceMode::kHostStaging:
      return "host staging";
  }
  return "unknown";
}

DeviceSetup::DeviceSetup(const topology::Topology& topology, const Config& config)
    : topo_(topology), config_(config) {}

bool DeviceSetup::reduceOnDevice() const {
  return topo_.localSize() <= kMaxDeviceSources;
}

DevicePlan DeviceSetup::plan(Store& store, transport::DeviceLinks& links) {
  DevicePlan p;
  p.scope = str("smddp/device/", next_++);
  p.reduce_on_device = reduceOnDevice();
  const int rank = topo_.rank();
  const int size = topo_.size();

  // Which GPU each rank drives decides how nodes talk: NCCL needs one each.
  auto ids = storeAllGather(store, p.key("identity"), rank, size, toBytes(links.identity()));
  // The first two ranks that drive one GPU, named in the plan's reason.
  std::map<std::string, int> first_of;
  std::string shared;
  for (int r = 0; r < size; ++r) {
    const std::string id = toString(ids[static_cast<size_t>(r)]);
    auto [it, fresh] = first_of.emplace(id, r);
    if (!fresh && shared.empty()) {
      shared = str("ranks ", it->second, " and ", r, " both drive ", id);
    }
  }
  const bool own_gpu = shared.empty();
  if (topo_.numNodes() == 1) {
    p.mode = DeviceMode::kNode;
  } else if (!topo_.uniform()) {
    p.mode = DeviceMode::kHostStaging;
    p.why = str("the topology is not uniform (", topo_.describe(), ")");
  } else if (config_.cuda_inter_node == "host") {
    p.mode = DeviceMode::kHostStaging;
    p.why = "SMDDP_CUDA_INTER_NODE=host";
  } else if (!own_gpu) {
    p.mode = DeviceMode::kHostStaging;
    p.why = str("ranks share GPUs (", shared, "; NCCL rails need a GPU per rank, or ",
                "SMDDP_CUDA_RANKS_PER_GPU with SMDDP_CUDA_INTER_NODE=nccl)");
  } else {
    p.mode = DeviceMode::kRails;
  }
  if (p.mode == DeviceMode::kHostStaging && config_.cuda_inter_node == "nccl" && rank == 0) {
    SMDDP_LOG(kWarn, "SMDDP_CUDA_INTER_NODE=nccl cannot be honoured: ", p.why,
              "; staging CUDA collectives through host memory instead");
  }
  if (p.mode != DeviceMode::kHostStaging && !config_.cuda_ipc) {
    p.mode = DeviceMode::kHostStaging;
    p.why = "SMDDP_CUDA_IPC=off";
  }
  if (p.mode == DeviceMode::kHostStaging) {
    return p;
  }

  // Link the node: a failed export is published too, so nobody waits for it.
  const int node = topo_.myNode();
  const int me = topo_.myLocalRank();
  const std::vector<int>& ranks = topo_.nodeRanks(node);
  std::string failure;
  std::vector<uint8_t> mine;
  try {
    mine = exportRecord(true, links.exportLocal());
  } catch (const Error& e) {
    failure = str("rank ", rank, " could not export its device memory: ", e.what());
    mine = exportRecord(false, toBytes(failure));
  }
  auto exported = storeAllGather(store, p.key(str("export/", node)), me, static_cast<int>(ranks.size()), mine);
  for (int l = 0; l < static_cast<int>(ranks.size()) && failure.empty(); ++l) {
    if (l == me) {
      continue;
    }
    const auto& rec = exported[static_cast<size_t>(l)];
    if (rec.empty() || rec[0] != 1) {
      failure = rec.empty() ? str("rank ", ranks[static_cast<size_t>(l)], " published nothing")
                            : toString(std::vector<uint8_t>(rec.begin() + 1, rec.end()));
      continue;
    }
    try {
      links.importPeer(l, std::vector<uint8_t>(rec.begin() + 1, rec.end()));
    } catch (const Error& e) {
      failure = str("rank ", rank, " could not map the device memory of rank ", ranks[static_cast<size_t>(l)], ": ",
                    e.what());
    }
  }
  // Every rank of the group takes the same mode.
  auto verdicts = storeAllGather(store, p.key("linked"), rank, size, toBytes(failure));
  for (const auto& v : verdicts) {
    if (!v.empty()) {
      p.mode = DeviceMode::kHostStaging;
      p.why = str("CUDA IPC is unavailable: ", toString(v));
      break;
    }
  }
  if (p.mode == DeviceMode::kHostStaging) {
    // Exports are freed only once no peer maps them any more.
    links.closeImports();
    storeBarrier(store, p.key(str("unlinked/", node)), static_cast<int>(ranks.size()));
    links.releaseExports();
    if (rank == 0) {
      SMDDP_LOG(kWarn, p.why, "; CUDA collectives stage through host memory (set SMDDP_CUDA_IPC=off to say so)");
    }
  }
  return p;
}

} // namespace smddp::algorithm
