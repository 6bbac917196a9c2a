#include "backend/device_path.h"

#include <mutex>

#include "common/log.h"

namespace smddp {

namespace {

struct Registry {
  std::mutex mu;
  DevicePathFactory factory;
  std::function<std::string()> loader;
  bool tried = false;
  std::string why;
};

Registry& registry() {
  static Registry* r = new Registry();  // outlives every group, also at exit
  return *r;
}

} // namespace

void registerDevicePathFactory(DevicePathFactory factory) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factory = std::move(factory);
}

void setDevicePathLoader(std::function<std::string()> loader) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.loader = std::move(loader);
}

DevicePathFactory devicePathFactory(std::string* why) {
  Registry& r = registry();
  std::function<std::string()> loader;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.factory || r.tried) {
      *why = r.why;
      return r.factory;
    }
    r.tried = true;
    loader = r.loader;
  }
  // Outside the lock: the loader imports the module, whose initialization
  // registers the factory.
  std::string failure = loader ? loader() : std::string("no loader for the CUDA module is set");
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.factory && failure.empty()) {
    failure = "the CUDA module registered no device path";
  }
  if (!r.factory) {
    r.why = failure;
    SMDDP_LOG(kWarn, "the CUDA path is unavailable: ", failure,
              "; CUDA tensors use the fallback backend (nccl) for every collective");
  }
  *why = r.why;
  return r.factory;
}

} // namespace smddp
