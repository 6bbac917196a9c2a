// The hierarchical ReduceScatter: the node first, then the rails.
//
// Drawn for 2 nodes x 2 ranks; rank (node, local) = 0:(0,0) 1:(0,1)
// 2:(1,0) 3:(1,1); rails {0,2} and {1,3}; x_r is rank r's contribution to
// block x, and rank r ends with block r (a, b, c, d):
//
//     node    0: a0+a1, c0+c1   1: b0+b1, d0+d1   2: a2+a3, c2+c3   3: ...
//     rails   0<->2 exchange the partials of a and c: 0 ends with
//             (a2+a3)+(a0+a1), 2 with (c0+c1)+(c2+c3); likewise 1 and 3
//
// Each rank reduces, over its node and in local rank order, the blocks of
// its rail (node partials); the rail's ring ReduceScatter reduces the
// partials over the nodes. The order of every operation is fixed, the same
// on every path: the result's bits do not depend on the path.
//
// Pipelined: each chunk of node partials is handed to the rail (an eventfd
// wakes it) as soon as it is reduced, in the order the rail's ring consumes
// them (protocol::RingOrder::consumedAt).
//
// Sequential, single-copy: the partials of the other nodes' blocks first;
// the own block's node partial is never written to memory: the rail's last
// step reduces the node's inputs chunk by chunk, through the cache, and
// combines each chunk with the other nodes' sum straight into the output
// (the same operations as through a partial, so the same bits).
//
// Sequential, staged (small calls): the partials through the staging slots,
// then the rail.
//
// One node: NodeCollectives::reduceScatter; one rank per node: the rail
// alone, on the inputs.
#pragma once

#include "algorithm/hierarchical/stages.h"
#include "algorithm/op.h"

namespace smddp::algorithm::hierarchical {

void reduceScatter(Stages& s, const OpArgs& args);

} // namespace smddp::algorithm::hierarchical
