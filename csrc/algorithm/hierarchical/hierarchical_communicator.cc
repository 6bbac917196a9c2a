#include "algorithm/hierarchical/hierarchical_communicator.h"

#include "algorithm/hierarchical/all_gather.h"
#include "algorithm/hierarchical/all_reduce.h"
#include "algorithm/hierarchical/broadcast.h"
#include "algorithm/hierarchical/reduce_scatter.h"
#include "common/error.h"

namespace smddp::algorithm {

HierarchicalCommunicator::HierarchicalCommunicator(
    Store& store,
    const topology::Topology& topology,
    const Config& config,
    std::unique_ptr<transport::Network> network,
    std::unique_ptr<transport::NodeArena> arena)
    : stages_(store, topology, config, std::move(network), std::move(arena)) {}

void HierarchicalCommunicator::allGather(const OpArgs& args) {
  hierarchical::allGather(stages_, args);
}

void HierarchicalCommunicator::reduceScatter(const OpArgs& args) {
  hierarchical::reduceScatter(stages_, args);
}

void HierarchicalCommunicator::allReduce(const OpArgs& args) {
  hierarchical::allReduce(stages_, args);
}

void HierarchicalCommunicator::broadcast(const OpArgs& args) {
  hierarchical::broadcast(stages_, args);
}

void HierarchicalCommunicator::barrier(const OpArgs& args) {
  hierarchical::barrier(stages_, args);
}

void HierarchicalCommunicator::abort(const std::string& why) {
  stages_.abort(why);
}

void HierarchicalCommunicator::interrupt(const std::string& why) {
  stages_.interrupt(why);
}

std::string HierarchicalCommunicator::describe() const {
  return str("hierarchical (shm+single-copy in nodes, ", stages_.network().transport(), " rails), ",
             stages_.topo().describe());
}

} // namespace smddp::algorithm
