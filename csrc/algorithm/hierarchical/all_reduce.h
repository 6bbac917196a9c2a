// The hierarchical AllReduce: a node ReduceScatter of L slices, a rail
// AllReduce of each slice, a node AllGather of the slices.
//
// Drawn for 2 nodes x 2 ranks; rank (node, local) = 0:(0,0) 1:(0,1)
// 2:(1,0) 3:(1,1); rails {0,2} and {1,3}; the tensor in two slices s and t,
// x_r rank r's contribution to slice x:
//
//     node    0: s0+s1   1: t0+t1   2: s2+s3   3: t2+t3          (shm)
//     rails   0<->2 AllReduce s: both end with (s0+s1)+(s2+s3);
//             1<->3 likewise t                                   (sockets)
//     node    0<-1: t  1<-0: s  2<-3: t  3<-2: s                 (shm)
//
// The rail's AllReduce is a ring ReduceScatter of the slice's N sub-slices
// then a ring AllGather of them.
//
// Pipelined (on the single-copy path): both hand-offs at once. The chunks
// of my slice go to the rail's ReduceScatter as they are reduced over the
// node, and the node peers read each chunk of the result as the rail's
// AllGather lands it (or, for my rail block, once its ReduceScatter ends),
// announced as progress units (protocol::ProgressUnits). The rail sends the
// same messages as on the sequential path, so rail peers on hosts that
// chose differently still agree.
//
// Sequential: single-copy reads of the peers' inputs, the rail, single-copy
// reads of the peers' outputs; or, for a tensor of up to a staging slot
// that single-copy reads would not pay for, through the slots.
//
// One node: NodeCollectives::allReduce; one rank per node: the rail alone.
#pragma once

#include "algorithm/hierarchical/stages.h"
#include "algorithm/op.h"

namespace smddp::algorithm::hierarchical {

void allReduce(Stages& s, const OpArgs& args);

} // namespace smddp::algorithm::hierarchical
