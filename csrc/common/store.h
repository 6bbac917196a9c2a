// The key-value store the ranks of a group meet through (the torch store in
// production, a directory of files in the native tests).
//
// Every blocking call is bounded by the timeout the store was created with
// and throws Error(kTimeout) naming the key when it expires.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"

namespace smddp {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Blocks until the key exists.
  virtual std::vector<uint8_t> get(const std::string& key) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Whether the key exists now, without waiting: for a long wait outside the
  // store (sockets) to notice, now and then, a key that says to give up.
  virtual bool check(const std::string& key) = 0;
  // Blocks until every key exists; their values, in order. A store that can
  // fetch many keys in one round trip does (an all-gather of N ranks then
  // costs each rank two round trips, not 2N).
  virtual std::vector<std::vector<uint8_t>> getAll(const std::vector<std::string>& keys) {
    std::vector<std::vector<uint8_t>> values;
    values.reserve(keys.size());
    for (const auto& key : keys) {
      values.push_back(get(key));
    }
    return values;
  }
};

// What a rank publishes for others to await: a value, or in its place why
// it has none, so that the ranks awaiting it fail at once, naming it,
// instead of waiting until the store's timeout. Tagged, so that any value
// can travel and a failure is never mistaken for one.
std::vector<uint8_t> taggedValue(const std::vector<uint8_t>& value);
std::vector<uint8_t> taggedFailure(const std::string& why);
// The value of a tagged entry; false, with `why` set, if it is a failure.
bool untag(const std::vector<uint8_t>& entry, std::vector<uint8_t>* value, std::string* why);

// Each rank publishes `mine` under prefix/<rank> and receives everybody's,
// indexed by rank. A rank that failed before the exchange publishes its
// error instead (storeAllGatherFailed) and raises its own; the others then
// throw Error(`peer_failed`) at once, naming it, instead of waiting for its
// part until the store's timeout. `name_of` names a rank in that error
// ("rank R" if not given).
std::vector<std::vector<uint8_t>> storeAllGather(
    Store& store,
    const std::string& prefix,
    int rank,
    int size,
    const std::vector<uint8_t>& mine,
    ErrorKind peer_failed = ErrorKind::kComm,
    const std::function<std::string(int)>& name_of = nullptr);
void storeAllGatherFailed(Store& store, const std::string& prefix, int rank, const std::string& failure);

// Sets `key` unless a rank set it first through this call (the first value
// is kept: later ones are often its consequences); whether this one did.
bool storeSetFirst(Store& store, const std::string& key, const std::vector<uint8_t>& value);

// Why one of the ranks of a set-up step failed, published under a key for
// the others, who wait for it outside the store (sockets, shared memory):
// they look for it now and then, seldom enough not to load the store, and
// raise it, so that all fail at once naming the cause, not at the timeout.
class FailureBoard {
 public:
  FailureBoard(Store& store, std::string key, std::chrono::milliseconds every)
      : store_(store), key_(std::move(key)), every_(every) {}
  // Publishes `why` unless a rank did first (the first is kept: later ones
  // are often its consequences); the store failing too is ignored, as this
  // rank's own error is the one to raise.
  void publish(const std::string& why);
  // Throws Error(kComm) with the published failure, if any; looks at most
  // every `every` unless `now`.
  void check(bool now = false);
  // Whether check() found one.
  bool seen() const {
    return seen_;
  }

 private:
  Store& store_;
  std::string key_;
  std::chrono::milliseconds every_;
  std::chrono::steady_clock::time_point last_{};
  bool seen_ = false;
};

// All `size` ranks arrive before any returns. The key may be used again
// (a group re-created on the same store): each `size` arrivals are a round
// of their own. A rank that arrives with a `failure` makes the call return
// it on every rank (the first if several fail); "" when nobody failed.
std::string storeBarrier(Store& store, const std::string& key, int size, const std::string& failure = "");
// Arrives at the barrier with `failure` and returns at once: a rank that
// cannot go on raises its own error, and the others, waiting there, return
// this one instead of waiting for it until the store's timeout.
void storeBarrierFailed(Store& store, const std::string& key, int size, const std::string& failure);

std::vector<uint8_t> toBytes(const std::string& s);
std::string toString(const std::vector<uint8_t>& b);

} // namespace smddp
