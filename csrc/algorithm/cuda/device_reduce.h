// Elementwise reductions on the GPU: dst[i] = src[0][i] (+) ... (+) src[n-1][i],
// sources in the order given (deterministic), any of them possibly a peer
// GPU's memory mapped through CUDA IPC (read over NVLink).
//
// float32, float16 and bfloat16; SUM, AVG, PRODUCT, MIN, MAX, PREMUL_SUM.
// The element operations and conversions are the CPU kernels' own
// (algorithm/reduce_ops.h), so the bits equal the CPU path's for the same
// sources: half types accumulate in float32 and round once; MIN/MAX
// propagate NaN; no multiply-add is fused; `raw` applies PREMUL_SUM's factor
// to every source (Sources::kInputs), AVG's division is the
// final step (Result::kFinal).
//
// The kernel reads 16 bytes per load, every source's loads in flight
// together, from where every buffer is 16-byte aligned (a scalar head and
// tail around them, algorithm/device_plan.h; buffers misaligned unalike go
// one element at a time). It uses at most `max_blocks` blocks, so that a
// collective leaves most of the GPU to the computation it overlaps with.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "algorithm/device_setup.h"
#include "algorithm/reduce.h"

namespace smddp::algorithm::cuda {

// True for the dtype/op pairs the device kernels implement.
bool deviceReduceSupported(DataType dtype, ReduceOp op);

// Loads every reduction kernel into the current device's context now. Under
// CUDA's lazy loading a kernel is otherwise loaded at its first launch, and
// loading may wait until the device is idle: inside a collective that wait
// would count against the group's timeout, and behind a kernel that spins on
// a peer's flag it could wait on work that waits for it. Throws kComm.
void loadReduceKernels();

// Enqueues the reduction of `nsrc` (1..kMaxDeviceSources) sources on
// `stream`: Sources::kInputs scales each by PREMUL_SUM's factor,
// Result::kFinal divides by AVG's (reduce.h). Throws Error: kInvalidArgument
// for bad arguments; kComm when the device already holds an error from
// earlier work (named as such, so that it is not taken for this kernel's)
// or the launch fails.
void launchReduce(
    const ReduceSpec& spec,
    void* dst,
    const void* const* srcs,
    int nsrc,
    size_t count,
    Sources sources,
    Result result,
    int max_blocks,
    cudaStream_t stream);

// Reduces `nseg` segments of `count` elements in one launch: segment s
// writes dst + s * dst_stride bytes and reads srcs[k] + src_offsets[s] bytes
// of every source (the rails' ReduceScatter: every rail member's block of a
// chunk). As launchReduce otherwise.
void launchReduceSegments(
    const ReduceSpec& spec,
    void* dst,
    size_t dst_stride,
    const void* const* srcs,
    int nsrc,
    const size_t* src_offsets,
    int nseg,
    size_t count,
    Sources sources,
    Result result,
    int max_blocks,
    cudaStream_t stream);

// dst[i] = the final value of dst[i]: AVG's division (and PREMUL_SUM's
// factor for Sources::kInputs) in place; nothing to do for the other ops.
void launchFinalize(
    const ReduceSpec& spec,
    void* dst,
    size_t count,
    Sources sources,
    int max_blocks,
    cudaStream_t stream);

} // namespace smddp::algorithm::cuda
