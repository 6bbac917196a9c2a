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

} // namespace smddp
