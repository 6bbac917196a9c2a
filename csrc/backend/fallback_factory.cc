#include "backend/fallback_factory.h"

#include <mutex>

namespace smddp {

namespace {
std::mutex gMu;
FallbackFactory gFactory;
} // namespace

void setFallbackFactory(FallbackFactory factory) {
  std::lock_guard<std::mutex> lock(gMu);
  gFactory = std::move(factory);
}

FallbackList makeFallbacks(
    const c10::intrusive_ptr<::c10d::Store>& store,
    int rank,
    int size,
    std::chrono::milliseconds timeout,
    const std::string& mode) {
  FallbackFactory factory;
  {
    std::lock_guard<std::mutex> lock(gMu);
    factory = gFactory;
  }
  return factory ? factory(store, rank, size, timeout, mode) : FallbackList{};
}

} // namespace smddp
