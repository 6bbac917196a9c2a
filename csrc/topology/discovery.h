// Where the ranks of a new group are, found through the store.
//
// Every rank publishes its global rank, the CPUs it may use and its host;
// from that, every rank computes the same node keys (topology.h) and the
// same view of each host: how many of the job's ranks run there and the
// fewest CPUs any of them may use, which decide the knobs' "auto" values
// (alike on every rank of a host, so that they choose alike).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/store.h"
#include "topology/topology.h"

namespace smddp::topology {

struct Placement {
  // node_keys[r]: the node key of group rank r.
  std::vector<std::string> node_keys;
  // The job's ranks on this rank's host (at least the group's: torchrun's
  // LOCAL_WORLD_SIZE counts the ranks of other groups too).
  int host_ranks = 0;
  // The fewest CPUs any rank of this host may use.
  int host_cpus = 0;
};

// Collective over the group: `global_rank` is this rank's in the job.
// `getenv` defaults to the process environment.
Placement discoverPlacement(
    Store& store,
    const std::string& key,
    int rank,
    int size,
    int global_rank,
    int ranks_per_node,
    const std::function<const char*(const char*)>& getenv = nullptr);

// This process's place among the launcher's ranks on its host (torchrun's
// LOCAL_RANK of LOCAL_WORLD_SIZE), else its local rank in `topology`: the
// place picks the rank's NIC, which follows its GPU, not a group, so that a
// sub-group's ranks keep their rails' NICs.
struct LauncherPlace {
  int index = 0;
  int count = 1;
};
LauncherPlace launcherPlace(
    const Topology& topology,
    const std::function<const char*(const char*)>& getenv = nullptr);

} // namespace smddp::topology
