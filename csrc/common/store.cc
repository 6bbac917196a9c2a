#include "common/store.h"

#include "common/error.h"

namespace smddp {

std::string storeAllGatherKey(const std::string& prefix, int rank) {
  return str(prefix, "/", rank);
}

std::vector<std::vector<uint8_t>> storeAllGather(
    Store& store,
    const std::string& prefix,
    int rank,
    int size,
    const std::vector<uint8_t>& mine) {
  store.set(storeAllGatherKey(prefix, rank), mine);
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    if (r != rank) {
      keys.push_back(storeAllGatherKey(prefix, r));
    }
  }
  std::vector<std::vector<uint8_t>> theirs = store.getAll(keys);
  SMDDP_ASSERT(theirs.size() == keys.size(), "the store returned ", theirs.size(), " values for ", keys.size(), " keys");
  std::vector<std::vector<uint8_t>> all(static_cast<size_t>(size));
  for (int r = 0, i = 0; r < size; ++r) {
    all[static_cast<size_t>(r)] = r == rank ? mine : std::move(theirs[static_cast<size_t>(i++)]);
  }
  return all;
}

std::string storeBarrier(Store& store, const std::string& key, int size, const std::string& failure) {
  // A round cannot end without this rank, so the count before its arrival
  // names the round it belongs to.
  const int64_t round = store.add(key + "/arrived", 0) / size;
  const std::string at = key + "/" + std::to_string(round);
  if (!failure.empty()) {
    // Written before this rank arrives, so before the round is done.
    store.add(at + "/failures", 1);
    store.set(at + "/failure", toBytes(failure));
  }
  if (store.add(key + "/arrived", 1) == (round + 1) * size) {
    store.set(at + "/done", {1});
  }
  store.get(at + "/done");
  return store.add(at + "/failures", 0) > 0 ? toString(store.get(at + "/failure")) : std::string();
}

std::vector<uint8_t> toBytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string toString(const std::vector<uint8_t>& b) {
  return std::string(b.begin(), b.end());
}

} // namespace smddp
