#include "backend/fallback_factory.h"

#include <c10/util/Exception.h>

#include <mutex>

#include "common/error.h"

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

FallbackList connectFallbacks(
    const c10::intrusive_ptr<::c10d::Store>& store,
    Store& sync,
    const std::string& barrier_key,
    int rank,
    int size,
    std::chrono::milliseconds timeout,
    const std::string& mode,
    const std::string& who) {
  FallbackList out;
  std::exception_ptr mine;
  std::string failure;
  try {
    out = makeFallbacks(store, rank, size, timeout, mode);
  } catch (const std::exception& e) {
    mine = std::current_exception();
    failure = str("rank ", rank, ": ", e.what());
  }
  try {
    failure = storeBarrier(sync, barrier_key, size, failure);
  } catch (const std::exception& e) {
    failure = str("the ranks did not all arrive: ", e.what());
  }
  if (mine) {
    std::rethrow_exception(mine);
  }
  TORCH_CHECK_WITH(
      DistBackendError,
      failure.empty(),
      who,
      "creating the fallback group (SMDDP_FALLBACK=",
      mode,
      ") failed: ",
      failure,
      ". Fix that rank's error, or set SMDDP_FALLBACK=none on every rank if only smddp's native "
      "collectives are needed.");
  return out;
}

} // namespace smddp
