// The policies of the hierarchical schedules: when a call runs its two
// stages one after the other, how the rail cuts its blocks, how the node
// stage pushes. Each constant says what it guarantees; why these values is
// in docs/design.md ("Where the time goes, as design rules"). The choices
// depend only on the call's sizes, the configuration and the host, so every
// rank of a node makes the same one, and none of them changes what the rail
// sends: rail peers on hosts that choose differently still agree.
#pragma once

#include <cstddef>

#include "common/config.h"

namespace smddp::algorithm::hierarchical::tuning {

// A call whose rail blocks each fit in one chunk (SMDDP_CHUNK_BYTES) and
// whose rail data (a block per node) is at most this runs its stages one
// after the other on the calling thread: a pipeline of one chunk per block
// could overlap nothing but the rail's own steps, and would pay two thread
// hand-offs for it. Larger calls pipeline, unless SMDDP_PIPELINE says
// otherwise or the host's ranks outnumber its CPUs (then the stage thread
// has no core to overlap on, and every call runs one stage after the other).
constexpr size_t kSequentialBytes = autos::kSequentialRailBytes;

// The rail cuts a block into at least kRailChunks chunks, so that the next
// stage (the node's reads of an AllGather, the last reduction step of a
// ReduceScatter) starts on the first chunk while the second crosses; no
// chunk is cut under kMinRailChunkBytes, which bounds the per-message cost
// against the bytes moved, nor over SMDDP_CHUNK_BYTES. Chunks are whole
// cache lines (64 bytes) and whole elements.
constexpr size_t kRailChunks = 2;
constexpr size_t kMinRailChunkBytes = autos::kMinRailChunkBytes;

// The sequential single-copy AllGather pushes its own block to the node
// peers in pieces of at most this (and at most a rail chunk), each right
// after reading it from the input: a piece is written to the peers while
// it is still in this core's cache.
constexpr size_t kPushPieceBytes = size_t{256} << 10;

} // namespace smddp::algorithm::hierarchical::tuning
