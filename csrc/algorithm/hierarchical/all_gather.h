// The hierarchical AllGather: rails first, then the node.
//
// Drawn for 2 nodes x 2 ranks; rank (node, local) = 0:(0,0) 1:(0,1)
// 2:(1,0) 3:(1,1); rails {0,2} and {1,3}; blocks a b c d of ranks 0..3:
//
//     rails   0<->2: a, c        1<->3: b, d                   (sockets)
//     node    0<-1: b, d  1<-0: a, c  2<-3: b, d  3<-2: a, c   (shm)
//
// Pipelined (Stages::sequential() false): the rail stage places the own
// block in the output chunk by chunk, then runs the rail's ring; each chunk
// that is in place (own or landed) is announced in the node arena, as a
// progress unit (protocol::ProgressUnits), and every node peer reads it from
// this rank's output at once, while the rail moves the next.
//
// Sequential, single-copy: each piece of the own block (just read from the
// input) and each chunk the rail lands (just received) is pushed into every
// node peer's output right away (process_vm_writev), while it is still in
// cache; a last round says every push has landed.
//
// Sequential, staged (small calls): the rail, then each rank's rail blocks,
// packed, through its staging slot.
//
// One node: NodeCollectives::allGather; one rank per node: the rail alone.
// Every multi-rank path starts with a round that checks the node agrees on
// the call, so that a rank whose call differs meets a kMismatch rather than
// a wait on its rail.
#pragma once

#include "algorithm/hierarchical/stages.h"
#include "algorithm/op.h"

namespace smddp::algorithm::hierarchical {

void allGather(Stages& s, const OpArgs& args);

} // namespace smddp::algorithm::hierarchical
