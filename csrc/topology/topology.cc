#include "topology/topology.h"

#include <sched.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "common/error.h"

namespace smddp::topology {

Topology::Topology(int rank, const std::vector<std::string>& node_keys)
    : rank_(rank) {
  const int n = static_cast<int>(node_keys.size());
  SMDDP_ASSERT(rank >= 0 && rank < n, "rank ", rank, " of ", n);
  node_of_.assign(static_cast<size_t>(n), -1);
  local_of_.assign(static_cast<size_t>(n), -1);
  std::map<std::string, int> index;
  for (int r = 0; r < n; ++r) {
    auto it = index.find(node_keys[static_cast<size_t>(r)]);
    int node = 0;
    if (it == index.end()) {
      node = static_cast<int>(node_ranks_.size());
      index.emplace(node_keys[static_cast<size_t>(r)], node);
      node_ranks_.emplace_back();
    } else {
      node = it->second;
    }
    node_of_[static_cast<size_t>(r)] = node;
    local_of_[static_cast<size_t>(r)] =
        static_cast<int>(node_ranks_[static_cast<size_t>(node)].size());
    node_ranks_[static_cast<size_t>(node)].push_back(r);
  }
  for (const auto& ranks : node_ranks_) {
    if (ranks.size() != node_ranks_[0].size()) {
      uniform_ = false;
    }
  }
}

std::vector<int> Topology::railRanks(int l) const {
  SMDDP_ASSERT(uniform_, "rails of a non-uniform topology");
  std::vector<int> out;
  out.reserve(node_ranks_.size());
  for (const auto& ranks : node_ranks_) {
    out.push_back(ranks[static_cast<size_t>(l)]);
  }
  return out;
}

std::string Topology::describe() const {
  std::string s = uniform_
      ? str(numNodes(), " node", numNodes() == 1 ? "" : "s", " x ",
            node_ranks_[0].size(), " rank", node_ranks_[0].size() == 1 ? "" : "s")
      : str("non-uniform, ", numNodes(), " nodes");
  for (const auto& ranks : node_ranks_) {
    s += " {";
    for (size_t i = 0; i < ranks.size(); ++i) {
      s += str(i ? "," : "", ranks[i]);
    }
    s += "}";
  }
  return s;
}

std::string rankList(const std::vector<int>& ranks) {
  // Past this many, a message keeps the first few and the last.
  constexpr size_t kListed = 8;
  constexpr size_t kHead = 6;
  if (ranks.empty()) {
    return "no rank";
  }
  if (ranks.size() == 1) {
    return str("rank ", ranks[0]);
  }
  std::string s = "ranks ";
  const bool cut = ranks.size() > kListed;
  for (size_t i = 0; i < (cut ? kHead : ranks.size()); ++i) {
    s += str(i ? ", " : "", ranks[i]);
  }
  if (cut) {
    s += str(", ..., ", ranks.back(), " (", ranks.size(), " ranks)");
  }
  return s;
}

std::string hostIdentity() {
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) {
    host[0] = '\0';
  }
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  if (f) {
    std::getline(f, boot);
  }
  return str(host, "/", boot);
}

std::string memoryDomain() {
  std::string shm = "none";
  struct stat st;
  if (::stat("/dev/shm", &st) == 0) {
    shm = str(major(st.st_dev), ":", minor(st.st_dev));
  }
  char ns[64] = {0};
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
  return str("shm:", shm, ",", n > 0 ? std::string(ns, static_cast<size_t>(n)) : std::string("pid:none"));
}

int usableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) {
    return std::max(1, CPU_COUNT(&set));
  }
  return std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
}

std::string nodeKey(
    const std::string& host,
    int global_rank,
    int ranks_per_node) {
  if (ranks_per_node <= 0) {
    return host;
  }
  return str(host, "#", global_rank / ranks_per_node);
}

} // namespace smddp::topology
