// A minimal test harness for the native core: self-registering tests,
// expectations that report file:line, a Store over a directory of files, and
// runRanks() to run a test body in N forked processes, bounded in time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/store.h"
#include "transport/channel.h"
#include "transport/shm/node_arena.h"

namespace smddp::test {

struct TestCase {
  const char* name;
  void (*fn)();
};

int registerTest(const char* name, void (*fn)());
void fail(const char* file, int line, const std::string& msg);
int failures();

// A store that lives in a directory (shared by forked processes).
class DirStore : public Store {
 public:
  explicit DirStore(std::string dir, std::chrono::milliseconds timeout = std::chrono::seconds(30));
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::string& key) override;

 private:
  std::string path(const std::string& key) const;
  std::string dir_;
  std::chrono::milliseconds timeout_;
};

// A store that answers `key` with `value` at once, as if this rank had been
// handed something else there (a wrong address, a segment it cannot map);
// every other key is the inner store's.
class LyingStore : public Store {
 public:
  LyingStore(Store& inner, std::string key, std::vector<uint8_t> value)
      : inner_(inner), key_(std::move(key)), value_(std::move(value)) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    inner_.set(key, value);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    return key == key_ ? value_ : inner_.get(key);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return inner_.add(key, delta);
  }
  bool check(const std::string& key) override {
    return key == key_ || inner_.check(key);
  }

 private:
  Store& inner_;
  std::string key_;
  std::vector<uint8_t> value_;
};

// A fresh temporary directory (removed at exit of the test binary).
std::string tempDir();

// The tag of an AllGather of `count` bytes, collective `seq`.
inline transport::MessageTag gatherTag(uint64_t seq, uint64_t count) {
  transport::MessageTag t;
  t.seq = seq;
  t.kind = CollectiveKind::kAllGather;
  t.dtype = DataType::kUInt8;
  t.count = count;
  return t;
}

// 0, 1, ..., n-1: the group ranks of a one-node test's arena.
std::vector<int> iota(int n);

// Arena options with 4 KiB slots: a few KiB already take many rounds.
transport::NodeArena::Options smallSlots();

// Runs body(rank) in `n` forked processes sharing `store_dir`; returns when
// all exit. Fails the test if a rank fails an expectation, throws, crashes
// or runs past `timeout`. With `expect_exit`, ranks for which it returns
// true may exit or be killed on purpose (their status is ignored).
void runRanks(
    int n,
    const std::function<void(int rank)>& body,
    std::chrono::seconds timeout = std::chrono::seconds(60),
    const std::function<bool(int rank)>& may_die = nullptr);

} // namespace smddp::test

#define SMDDP_TEST(name)                                                  \
  static void smddp_test_##name();                                         \
  static int smddp_test_reg_##name =                                       \
      ::smddp::test::registerTest(#name, &smddp_test_##name);              \
  static void smddp_test_##name()

#define EXPECT_TRUE(cond)                                                  \
  do {                                                                     \
    if (!(cond)) {                                                         \
      ::smddp::test::fail(__FILE__, __LINE__, "expected: " #cond);         \
    }                                                                      \
  } while (0)

#define EXPECT_EQ(a, b)                                                    \
  do {                                                                     \
    auto smddp_a_ = (a);                                                   \
    auto smddp_b_ = (b);                                                   \
    if (!(smddp_a_ == smddp_b_)) {                                         \
      std::ostringstream smddp_os_;                                        \
      smddp_os_ << "expected " #a " == " #b ", got " << smddp_a_ << " and " << smddp_b_; \
      ::smddp::test::fail(__FILE__, __LINE__, smddp_os_.str());            \
    }                                                                      \
  } while (0)

// `expr` throws smddp::Error of `error_kind` whose message contains `substr`.
#define EXPECT_THROWS(expr, error_kind, substr)                                  \
  do {                                                                     \
    bool smddp_thrown_ = false;                                            \
    try {                                                                  \
      expr;                                                                \
    } catch (const ::smddp::Error& e) {                                    \
      smddp_thrown_ = true;                                                \
      if (e.kind() != ::smddp::ErrorKind::error_kind ||                          \
          std::string(e.what()).find(substr) == std::string::npos) {       \
        ::smddp::test::fail(__FILE__, __LINE__,                            \
                            std::string("wrong error: ") + e.what());      \
      }                                                                    \
    }                                                                      \
    if (!smddp_thrown_) {                                                  \
      ::smddp::test::fail(__FILE__, __LINE__, "expected " #expr " to throw"); \
    }                                                                      \
  } while (0)
