#include "common/store.h"

#include "common/error.h"

namespace smddp {

std::vector<std::vector<uint8_t>> storeAllGather(
    Store& store,
    const std::string& prefix,
    int rank,
    int size,
    const std::vector<uint8_t>& mine) {
  store.set(str(prefix, "/", rank), mine);
  std::vector<std::vector<uint8_t>> all(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    all[static_cast<size_t>(r)] =
        r == rank ? mine : store.get(str(prefix, "/", r));
  }
  return all;
}

void storeBarrier(Store& store, const std::string& key, int size) {
  int64_t arrived = store.add(key + "/arrived", 1);
  if (arrived == size) {
    store.set(key + "/done", {1});
  }
  store.get(key + "/done");
}

std::vector<uint8_t> toBytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string toString(const std::vector<uint8_t>& b) {
  return std::string(b.begin(), b.end());
}

} // namespace smddp
