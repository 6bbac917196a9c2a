// The core's Store over a c10d::Store (TCPStore, FileStore, PrefixStore...).
#pragma once

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>

#include "common/error.h"
#include "common/store.h"

namespace smddp {

class C10dStoreAdapter : public Store {
 public:
  C10dStoreAdapter(c10::intrusive_ptr<::c10d::Store> store, std::chrono::milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    store_->set(key, value);
  }

  std::vector<uint8_t> get(const std::string& key) override {
    return std::move(getAll({key})[0]);
  }

  std::vector<std::vector<uint8_t>> getAll(const std::vector<std::string>& keys) override {
    if (keys.empty()) {
      return {};
    }
    try {
      store_->wait(keys, timeout_);
    } catch (const std::exception& e) {
      // Only on this path: which keys are missing, for the message.
      std::string missing;
      int named = 0;
      for (const auto& key : keys) {
        bool there = false;
        try {
          there = store_->check({key});
        } catch (const std::exception&) {
        }
        if (!there && named < 8) {
          missing += str(named++ > 0 ? ", '" : "'", key, "'");
        }
      }
      SMDDP_THROW(
          kTimeout,
          "the store did not provide ",
          missing.empty() ? std::string("every key") : missing,
          " within ",
          timeout_.count(),
          " ms (did every rank create the group?): ",
          reason(e));
    }
    // TCPStore answers all of them in one round trip; other stores ask for
    // each.
    return store_->multiGet(keys);
  }

  int64_t add(const std::string& key, int64_t delta) override {
    return store_->add(key, delta);
  }

  bool check(const std::string& key) override {
    return store_->check({key});
  }

 private:
  // A store's error without the C++ backtrace torch appends to it.
  static std::string reason(const std::exception& e) {
    if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) {
      return c10->what_without_backtrace();
    }
    return e.what();
  }

  c10::intrusive_ptr<::c10d::Store> store_;
  std::chrono::milliseconds timeout_;
};

// The host of the TCPStore under any prefixes: the inter-node sockets listen
// on the address that routes there (unless SMDDP_SOCKET_IFNAME says).
inline std::string storeHost(const c10::intrusive_ptr<::c10d::Store>& store) {
  c10::intrusive_ptr<::c10d::Store> s = store;
  for (int depth = 0; depth < 16 && s; ++depth) {
    if (auto* tcp = dynamic_cast<::c10d::TCPStore*>(s.get())) {
      return tcp->getHost();
    }
    auto* prefix = dynamic_cast<::c10d::PrefixStore*>(s.get());
    if (prefix == nullptr) {
      break;
    }
    s = prefix->getUnderlyingStore();
  }
  return "";
}


} // namespace smddp
