#include "common/store.h"

#include "common/error.h"

namespace smddp {

namespace {

// A tagged entry's first byte.
constexpr uint8_t kValue = 0;
constexpr uint8_t kFailure = 1;

std::string partKey(const std::string& prefix, int rank) {
  return str(prefix, "/", rank);
}

} // namespace

std::vector<uint8_t> taggedValue(const std::vector<uint8_t>& value) {
  std::vector<uint8_t> entry{kValue};
  entry.insert(entry.end(), value.begin(), value.end());
  return entry;
}

std::vector<uint8_t> taggedFailure(const std::string& why) {
  std::vector<uint8_t> entry{kFailure};
  entry.insert(entry.end(), why.begin(), why.end());
  return entry;
}

bool untag(const std::vector<uint8_t>& entry, std::vector<uint8_t>* value, std::string* why) {
  SMDDP_ASSERT(!entry.empty() && (entry[0] == kValue || entry[0] == kFailure), "an untagged store entry");
  if (entry[0] == kFailure) {
    why->assign(entry.begin() + 1, entry.end());
    return false;
  }
  value->assign(entry.begin() + 1, entry.end());
  return true;
}

void storeAllGatherFailed(Store& store, const std::string& prefix, int rank, const std::string& failure) {
  store.set(partKey(prefix, rank), taggedFailure(failure));
}

std::vector<std::vector<uint8_t>> storeAllGather(
    Store& store,
    const std::string& prefix,
    int rank,
    int size,
    const std::vector<uint8_t>& mine,
    ErrorKind peer_failed,
    const std::function<std::string(int)>& name_of) {
  store.set(partKey(prefix, rank), taggedValue(mine));
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
    std::string why;
    if (!untag(theirs[static_cast<size_t>(i++)], &all[static_cast<size_t>(r)], &why)) {
      throw Error(peer_failed, str(name_of ? name_of(r) : str("rank ", r), " could not set up the group: ", why));
    }
  }
  return all;
}

bool storeSetFirst(Store& store, const std::string& key, const std::vector<uint8_t>& value) {
  if (store.add(key + "/writers", 1) != 1) {
    return false;
  }
  store.set(key, value);
  return true;
}

void FailureBoard::publish(const std::string& why) {
  try {
    storeSetFirst(store_, key_, toBytes(why));
  } catch (const std::exception&) {
  }
}

void FailureBoard::check(bool now) {
  const auto t = std::chrono::steady_clock::now();
  if (!now && t - last_ < every_) {
    return;
  }
  last_ = t;
  if (store_.check(key_)) {
    seen_ = true;
    SMDDP_THROW(kComm, toString(store_.get(key_)));
  }
}

namespace {

// Counts this rank into the current round of the barrier (with its failure,
// if any); the round's key prefix.
std::string arrive(Store& store, const std::string& key, int size, const std::string& failure) {
  // A round cannot end without this rank, so the count before its arrival
  // names the round it belongs to.
  const int64_t round = store.add(key + "/arrived", 0) / size;
  const std::string at = key + "/" + std::to_string(round);
  if (!failure.empty()) {
    // Written before this rank arrives, so before the round is done.
    storeSetFirst(store, at + "/failure", toBytes(failure));
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
  return store.check(at + "/failure") ? toString(store.get(at + "/failure")) : std::string();
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
