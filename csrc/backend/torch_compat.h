// Every difference between the torch versions smddp builds against
// (2.11 .. 2.14) lives in this header and nowhere else.
//
// - 2.14 renamed NCCLPreMulSumSupplement to PreMulSumSupplement and kept the
//   old name as an alias: the old name works in both.
// - 2.14 added all_gather_single / reduce_scatter_single / *_single_coalesced
//   / all_to_all_single virtuals that forward to the old names
//   (_allgather_base, _reduce_scatter_base, allgather_into_tensor_coalesced,
//   reduce_scatter_tensor_coalesced, alltoall_base) and back: overriding the
//   old names serves both versions.
// - 2.14 added Backend::Options::clone(); a backend without extra option
//   fields needs nothing.
// - OpType::REDUCE_SCATTER_TENSOR_COALESCED (2.13) and
//   ALLGATHER_INTO_TENSOR_COALESCED (2.14) are newer than 2.11: detected by
//   name, with OpType::COALESCED where they do not exist.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>

#define SMDDP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||        \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

static_assert(SMDDP_TORCH_AT_LEAST(2, 11), "smddp needs torch >= 2.11");

namespace smddp::compat {

using PreMulSumSupplement = ::c10d::NCCLPreMulSumSupplement;

template <typename E = ::c10d::OpType>
constexpr E opAllgatherIntoTensorCoalesced() {
  if constexpr (requires { E::ALLGATHER_INTO_TENSOR_COALESCED; }) {
    return E::ALLGATHER_INTO_TENSOR_COALESCED;
  } else {
    return E::COALESCED;
  }
}

template <typename E = ::c10d::OpType>
constexpr E opReduceScatterTensorCoalesced() {
  if constexpr (requires { E::REDUCE_SCATTER_TENSOR_COALESCED; }) {
    return E::REDUCE_SCATTER_TENSOR_COALESCED;
  } else {
    return E::COALESCED;
  }
}

} // namespace smddp::compat
