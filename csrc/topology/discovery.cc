#include "topology/discovery.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "common/error.h"

namespace smddp::topology {

namespace {

const char* fromEnv(const std::function<const char*(const char*)>& getenv, const char* name) {
  return getenv ? getenv(name) : std::getenv(name);
}

} // namespace

Placement discoverPlacement(
    Store& store,
    const std::string& key,
    int rank,
    int size,
    int global_rank,
    int ranks_per_node,
    const std::function<const char*(const char*)>& getenv) {
  const std::string host = hostIdentity();
  auto places = storeAllGather(store, key, rank, size, toBytes(str(global_rank, " ", usableCpus(), " ", host)));
  Placement p;
  for (auto& bytes : places) {
    std::istringstream place(toString(bytes));
    int peer_rank = 0;
    int peer_cpus = 0;
    std::string peer_host;
    place >> peer_rank >> peer_cpus;
    place.get();
    std::getline(place, peer_host);
    p.node_keys.push_back(nodeKey(peer_host, peer_rank, ranks_per_node));
    if (peer_host == host) {
      ++p.host_ranks;
      p.host_cpus = p.host_cpus == 0 ? peer_cpus : std::min(p.host_cpus, peer_cpus);
    }
  }
  // A sub-group shares the host with the rest of the job (torchrun says
  // how many ranks it started here).
  if (const char* local_world = fromEnv(getenv, "LOCAL_WORLD_SIZE")) {
    p.host_ranks = std::max(p.host_ranks, std::atoi(local_world));
  }
  return p;
}

LauncherPlace launcherPlace(const Topology& topology, const std::function<const char*(const char*)>& getenv) {
  LauncherPlace p{topology.myLocalRank(), topology.localSize()};
  const char* local_rank = fromEnv(getenv, "LOCAL_RANK");
  const char* local_world = fromEnv(getenv, "LOCAL_WORLD_SIZE");
  if (local_rank != nullptr && local_world != nullptr && std::atoi(local_world) > 0) {
    p.index = std::atoi(local_rank);
    p.count = std::atoi(local_world);
  }
  return p;
}

} // namespace smddp::topology
