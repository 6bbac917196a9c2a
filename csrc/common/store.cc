#include "common/store.h"

#include "common/error.h"

namespace smddp {

namespace {

// Every published part starts with one of these, so that any payload can
// travel and a failure is never mistaken for one.
constexpr uint8_t kPart = 0;
constexpr uint8_t kFailed = 1;

std::string partKey(const std::string& prefix, int rank) {
  return str(prefix, "/", rank);
}

} // namespace

void storeAllGatherFailed(Store& store, const std::string& prefix, int rank, const std::string& failure) {
  std::vector<uint8_t> part{kFailed};
  part.insert(part.end(), failure.begin(), failure.end());
  store.set(partKey(prefix, rank), part);
}

std::vector<std::vector<uint8_t>> storeAllGather(
    Store& store,
    const std::string& prefix,
    int rank,
    int size,
    const std::vector<uint8_t>& mine,
    ErrorKind peer_failed) {
  std::vector<uint8_t> part{kPart};
  part.insert(part.end(), mine.begin(), mine.end());
  store.set(partKey(prefix, rank), part);
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    if (r != rank) {
      keys.push_back(partKey(prefix, r));
    }
  }
  std::vector<std::vector<uint8_t>> theirs = store.getAll(keys);
  SMDDP_ASSERT(theirs.size() == keys.size(), "the store returned ", theirs.size(), " values for ", keys.size(), " keys");
  std::vector<std::vector<uint8_t>> all(static_cast<size_t>(size));
  for (int r = 0, i = 0; r < size; ++r) {
    if (r == rank) {
      all[static_cast<size_t>(r)] = mine;
      continue;
    }
    std::vector<uint8_t>& got = theirs[static_cast<size_t>(i++)];
    SMDDP_ASSERT(!got.empty(), "rank ", r, "'s part of ", prefix, " is empty");
    if (got[0] == kFailed) {
      throw Error(peer_failed, str("rank ", r, " could not set up the group: ", std::string(got.begin() + 1, got.end())));
    }
    all[static_cast<size_t>(r)].assign(got.begin() + 1, got.end());
  }
  return all;
}

namespace {

// Counts this rank into the current round of the barrier (with its failure,
// if any); the round's key prefix.
std::string arrive(Store& store, const std::string& key, int size, const std::string& failure) {
  // A round cannot end without this rank, so the count before its arrival
  // names the round it belongs to.
  const int64_t round = store.add(key + "/arrived", 0) / size;
  const std::string at = key + "/" + std::to_string(round);
  if (!failure.empty() && store.add(at + "/failures", 1) == 1) {
    // The first failure is kept (the others are often its consequences),
    // written before this rank arrives, so before the round is done.
    store.set(at + "/failure", toBytes(failure));
  }
  if (store.add(key + "/arrived", 1) == (round + 1) * size) {
    store.set(at + "/done", {1});
  }
  return at;
}

} // namespace

std::string storeBarrier(Store& store, const std::string& key, int size, const std::string& failure) {
  const std::string at = arrive(store, key, size, failure);
  store.get(at + "/done");
  return store.add(at + "/failures", 0) > 0 ? toString(store.get(at + "/failure")) : std::string();
}

void storeBarrierFailed(Store& store, const std::string& key, int size, const std::string& failure) {
  arrive(store, key, size, failure);
}

std::vector<uint8_t> toBytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string toString(const std::vector<uint8_t>& b) {
  return std::string(b.begin(), b.end());
}

} // namespace smddp
