// The fallback backends (gloo for CPU tensors, nccl for CUDA tensors) are
// made by the Python layer, which knows how to build them on every torch
// version; it registers a factory here at import. The backend asks it for a
// group's fallbacks when the group is created, also for groups created from
// C++ (split).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/store.h"

namespace smddp {

using FallbackList =
    std::vector<std::pair<c10::DeviceType, c10::intrusive_ptr<::c10d::Backend>>>;

// mode: SMDDP_FALLBACK ("auto" or "gloo").
using FallbackFactory = std::function<FallbackList(
    const c10::intrusive_ptr<::c10d::Store>& store,
    int rank,
    int size,
    std::chrono::milliseconds timeout,
    const std::string& mode)>;

void setFallbackFactory(FallbackFactory factory);

// The fallbacks of a new group; none if no factory is registered.
FallbackList makeFallbacks(
    const c10::intrusive_ptr<::c10d::Store>& store,
    int rank,
    int size,
    std::chrono::milliseconds timeout,
    const std::string& mode);

// Collective over the group: its fallbacks, made on `store`, returned only
// once every member has connected its own. A member that destroyed the
// group at once would close its sockets while a peer still completes the
// connection, and gloo fails that peer's set-up as if this rank had
// crashed. A rank whose fallback failed still arrives at the barrier (under
// `barrier_key` of `sync`), so that every rank fails now, naming it, rather
// than at the timeout: DistBackendError beginning with `who`.
FallbackList connectFallbacks(
    const c10::intrusive_ptr<::c10d::Store>& store,
    Store& sync,
    const std::string& barrier_key,
    int rank,
    int size,
    std::chrono::milliseconds timeout,
    const std::string& mode,
    const std::string& who);

} // namespace smddp
