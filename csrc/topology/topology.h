// Where the ranks of a group live: rank -> (node, local rank), the node-local
// sub-groups and the rails.
//
// A node is the set of ranks that share a node key. The key is the host's
// identity, or with SMDDP_RANKS_PER_NODE=k the host's identity plus
// global_rank / k, so that one host acts as several nodes. Nodes are numbered
// by the smallest group rank they hold; inside a node, local ranks follow
// group rank. Rail l is the set of ranks with local rank l, one per node,
// ordered by node.
//
// Example, 4 ranks on one host, SMDDP_RANKS_PER_NODE=2:
//
//            local 0   local 1
//   node 0   rank 0    rank 1      node-local groups: {0,1} {2,3}
//   node 1   rank 2    rank 3      rails:             {0,2} {1,3}
//
// The topology is uniform when every node holds the same number of ranks;
// only then do rails exist and the hierarchical schedules apply.
#pragma once

#include <string>
#include <vector>

namespace smddp::topology {

class Topology {
 public:
  // `node_keys[r]` is the node key of group rank r.
  Topology(int rank, const std::vector<std::string>& node_keys);

  int rank() const {
    return rank_;
  }
  int size() const {
    return static_cast<int>(node_of_.size());
  }
  int numNodes() const {
    return static_cast<int>(node_ranks_.size());
  }
  int nodeOf(int r) const {
    return node_of_[static_cast<size_t>(r)];
  }
  int localRankOf(int r) const {
    return local_of_[static_cast<size_t>(r)];
  }
  int myNode() const {
    return nodeOf(rank_);
  }
  int myLocalRank() const {
    return localRankOf(rank_);
  }
  // Ranks of node n, ascending.
  const std::vector<int>& nodeRanks(int n) const {
    return node_ranks_[static_cast<size_t>(n)];
  }
  int localSize() const {
    return static_cast<int>(nodeRanks(myNode()).size());
  }
  bool uniform() const {
    return uniform_;
  }
  // Ranks with local rank l, ordered by node. Requires uniform().
  std::vector<int> railRanks(int l) const;
  // "2 nodes x 2 ranks {0,1} {2,3}" (or "non-uniform: ..."), for logs.
  std::string describe() const;

 private:
  int rank_;
  std::vector<int> node_of_;
  std::vector<int> local_of_;
  std::vector<std::vector<int>> node_ranks_;
  bool uniform_ = true;
};

// "rank 3", "ranks 1, 2, 5", or for a long list its first ranks and its
// last ("ranks 8, 16, ..., 1016 (127 ranks)"): for messages.
std::string rankList(const std::vector<int>& ranks);

// This machine's identity: the hostname and the kernel's boot id (two
// machines that share a hostname are told apart by the second).
std::string hostIdentity();

// What the ranks of one machine must share to meet in a node's shared
// memory: the /dev/shm they see (its device) and their pid namespace (a
// rank's pid must name the same process to its peers). Containers on one
// machine (host networking gives them its hostname) differ in one or both
// unless they run with the host's IPC and pid namespaces. No spaces.
std::string memoryDomain();

// CPUs this process may run on (its affinity mask), at least 1.
int usableCpus();

// The node key of a rank: its host identity, plus the emulated node index
// when ranks_per_node > 0.
std::string nodeKey(const std::string& host, int global_rank, int ranks_per_node);

} // namespace smddp::topology
