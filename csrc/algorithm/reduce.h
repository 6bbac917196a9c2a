// Elementwise reductions of the CPU path.
//
// reduce() combines `nsrc` arrays into `dst` element by element, always in
// the order the sources are given, so the result depends only on the schedule
// and never on which peer answered first. Half types (float16, bfloat16) are
// widened to float32, combined, and rounded once (round to nearest even).
// Integer SUM and PRODUCT wrap around like torch's. On bool, SUM and MAX are
// OR, PRODUCT and MIN are AND. MIN and MAX propagate NaN.
//
// The kernels exist twice, for AVX-512 and for any x86-64/other CPU, chosen
// once at run time; both give bitwise-identical results (no FMA contraction:
// the core is built with -ffp-contract=off).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/copy.h"
#include "common/types.h"

namespace smddp::algorithm {

struct ReduceSpec {
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  // PREMUL_SUM: every raw input is multiplied by this before it is summed.
  double premul = 1.0;
  // AVG: the sum is divided by this (the group size) when finalized.
  double divisor = 1.0;
};

// dst[i] = src[0][i] (+) src[1][i] (+) ... (+) src[nsrc-1][i].
// raw:      the sources are inputs of the collective (PREMUL_SUM scales them)
//           rather than partial results.
// finalize: apply AVG's division (the last step of a reduction).
// dst may be any of the sources (every element is read from each source
// before it is written); it must not overlap one only in part.
void reduce(
    const ReduceSpec& spec,
    void* dst,
    const void* const* srcs,
    int nsrc,
    size_t count,
    bool raw,
    bool finalize);

// In-place dst = finalize(dst) for an already-reduced array: AVG's division
// (and PREMUL_SUM's scaling when raw). Used when a single source is the
// whole reduction (a group of one).
void finalizeInPlace(const ReduceSpec& spec, void* dst, size_t count, bool raw);

// The reduction a collective over `group_size` ranks runs for `op`: AVG
// divides the sum by the group size, except on float16, whose partial sums
// overflow (past 65504) where the average does not: there each input is
// multiplied by 1/group_size first, as PREMUL_SUM does. `premul` is
// PREMUL_SUM's factor. Every path (CPU and CUDA) reduces with this spec.
ReduceSpec collectiveReduceSpec(DataType dtype, ReduceOp op, double premul, int group_size);

// The two flags by name, for the schedules: what a step's sources are and
// what it produces.
enum class Sources : uint8_t {
  kPartials,  // partial results of earlier steps
  kInputs,    // the collective's inputs: PREMUL_SUM scales each (raw)
};
enum class Result : uint8_t {
  kPartial,  // more steps follow
  kFinal,    // the last step: AVG divides (finalize)
};

inline void reduce(
    const ReduceSpec& spec,
    void* dst,
    const void* const* srcs,
    int nsrc,
    size_t count,
    Sources sources,
    Result result) {
  reduce(spec, dst, srcs, nsrc, count, sources == Sources::kInputs, result == Result::kFinal);
}

inline void finalizeInPlace(const ReduceSpec& spec, void* dst, size_t count, Sources sources) {
  finalizeInPlace(spec, dst, count, sources == Sources::kInputs);
}

// Name of the kernel set in use ("avx512" or "generic"), for logs and tests.
const char* reduceKernelIsa();

// Forces a kernel set (tests compare them); "auto" restores the default.
void setReduceKernelIsa(const char* isa);

} // namespace smddp::algorithm
