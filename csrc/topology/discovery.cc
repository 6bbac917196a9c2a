#include "topology/discovery.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <sstream>

#include "common/error.h"
#include "common/log.h"

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
  const std::string domain = memoryDomain();
  auto places = storeAllGather(
      store, key, rank, size, toBytes(str(global_rank, " ", usableCpus(), " ", domain, " ", host)));
  Placement p;
  int apart = -1; // a rank of this machine that cannot share this rank's memory
  std::string apart_domain;
  int first_here = -1; // the machine's lowest rank, which says so
  for (size_t r = 0; r < places.size(); ++r) {
    std::istringstream place(toString(places[r]));
    int peer_rank = 0;
    int peer_cpus = 0;
    std::string peer_domain;
    std::string peer_host;
    place >> peer_rank >> peer_cpus >> peer_domain;
    place.get();
    std::getline(place, peer_host);
    // A node is what can share memory; the "auto" knobs count what shares
    // the machine's CPUs.
    p.node_keys.push_back(nodeKey(str(peer_host, " ", peer_domain), peer_rank, ranks_per_node));
    if (peer_host == host) {
      first_here = first_here < 0 ? static_cast<int>(r) : first_here;
      ++p.host_ranks;
      p.host_cpus = p.host_cpus == 0 ? peer_cpus : std::min(p.host_cpus, peer_cpus);
      if (peer_domain != domain && apart < 0) {
        apart = static_cast<int>(r);
        apart_domain = peer_domain;
      }
    }
  }
  // Once per process: every group a mesh creates would find it again.
  static std::atomic<bool> said{false};
  if (apart >= 0 && rank == first_here && !said.exchange(true)) {
    SMDDP_LOG(kWarn, "rank ", rank, " and rank ", apart, " run on one machine but cannot share memory (",
              domain, " here, ", apart_domain,
              " there: another /dev/shm or pid namespace, as in containers without the host's IPC and pid "
              "namespaces), so they are on different nodes and talk over TCP; run them in one container, or "
              "with --ipc=host --pid=host, to let them use shared memory");
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
