// The hierarchical Broadcast and Barrier.
//
// Drawn for 2 nodes x 2 ranks; rank (node, local) = 0:(0,0) 1:(0,1)
// 2:(1,0) 3:(1,1); rails {0,2} and {1,3}; Broadcast from rank 1:
//
//     rail    1 -> 3                      (the root's rail, sockets)
//     node    1 -> 0        3 -> 2        (from the rail's member, shm)
//
// Barrier: the node, the rail (an AllGather of nothing), the node again, so
// that no rank leaves before every rank of every node has arrived.
#pragma once

#include "algorithm/hierarchical/stages.h"
#include "algorithm/op.h"

namespace smddp::algorithm::hierarchical {

// args.root is a group rank.
void broadcast(Stages& s, const OpArgs& args);
void barrier(Stages& s, const OpArgs& args);

} // namespace smddp::algorithm::hierarchical
