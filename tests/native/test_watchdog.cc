// The watchdog of device work (common/watchdog.h): finished items leave
// quietly, the first item past its deadline or a probe's report fails
// everything once, later items fail at once, and the thread neither spins
// nor outlives stop().
#include <atomic>
#include <mutex>
#include <thread>

#include "common/watchdog.h"
#include "harness.h"

using namespace smddp;
using namespace std::chrono_literals;

namespace {

struct Failures {
  std::mutex mu;
  std::vector<std::string> items;
  std::vector<std::string> group;
  void item(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    items.push_back(why);
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu);
    return items.size();
  }
};

bool waitFor(const std::function<bool()>& cond, std::chrono::milliseconds bound) {
  const auto end = std::chrono::steady_clock::now() + bound;
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) {
      return true;
    }
    std::this_thread::sleep_for(5ms);
  }
  return cond();
}

} // namespace

SMDDP_TEST(finished_items_leave_without_a_failure) {
  std::atomic<int> on_failure{0};
  Watchdog dog(20ms, nullptr, [&](const std::string&) { ++on_failure; });
  std::atomic<bool> done{false};
  Failures f;
  dog.watch({"allreduce #1", Deadline::after(10s), [&] { return done.load(); },
             [&](const std::string& why) { f.item(why); }});
  EXPECT_EQ(dog.inFlight(), size_t{1});
  done = true;
  EXPECT_TRUE(waitFor([&] { return dog.inFlight() == 0; }, 2s));
  EXPECT_EQ(on_failure.load(), 0);
  EXPECT_EQ(f.count(), size_t{0});
  EXPECT_EQ(dog.failure(), std::string());
}

SMDDP_TEST(an_item_past_its_deadline_fails_everything_once) {
  std::atomic<int> on_failure{0};
  std::string group_why;
  std::mutex mu;
  Watchdog dog(20ms, nullptr, [&](const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    group_why = why;
    ++on_failure;
  });
  Failures f;
  const auto t0 = std::chrono::steady_clock::now();
  dog.watch({"allreduce #7 on cuda:1", Deadline::after(150ms), [] { return false; },
             [&](const std::string& why) { f.item(why); }});
  dog.watch({"allgather #8 on cuda:1", Deadline::after(10s), [] { return false; },
             [&](const std::string& why) { f.item(why); }});
  EXPECT_TRUE(waitFor([&] { return f.count() == 2; }, 3s));
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(took >= 150ms);
  EXPECT_TRUE(took < 1500ms);
  EXPECT_EQ(on_failure.load(), 1);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(group_why.find("allreduce #7 on cuda:1 did not finish") != std::string::npos);
  }
  // Both items were told the first failure's reason.
  {
    std::lock_guard<std::mutex> lock(f.mu);
    for (const auto& why : f.items) {
      EXPECT_TRUE(why.find("allreduce #7") != std::string::npos);
    }
  }
  // Later items fail at once, without the group being told again.
  dog.watch({"allreduce #9", Deadline::after(10s), [] { return true; }, [&](const std::string& why) { f.item(why); }});
  EXPECT_EQ(f.count(), size_t{3});
  EXPECT_EQ(on_failure.load(), 1);
}

SMDDP_TEST(a_probe_report_fails_the_work_in_flight) {
  std::atomic<int> polls{0};
  std::atomic<bool> broken{false};
  std::atomic<int> on_failure{0};
  Watchdog dog(
      20ms,
      [&]() -> std::string {
        ++polls;
        return broken ? "the NCCL rail of local rank 1: NCCL reported remote process exited" : "";
      },
      [&](const std::string&) { ++on_failure; });
  Failures f;
  dog.watch({"reduce_scatter #3", Deadline::after(10s), [] { return false; },
             [&](const std::string& why) { f.item(why); }});
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(f.count(), size_t{0});
  broken = true;
  EXPECT_TRUE(waitFor([&] { return f.count() == 1; }, 2s));
  EXPECT_EQ(on_failure.load(), 1);
  EXPECT_TRUE(dog.failure().find("remote process exited") != std::string::npos);
}

SMDDP_TEST(polls_at_its_period_and_sleeps_when_idle) {
  std::atomic<int> polls{0};
  Watchdog dog(50ms, nullptr, nullptr);
  std::atomic<bool> done{false};
  dog.watch({"allgather #1", Deadline::after(10s),
             [&] {
               ++polls;
               return done.load();
             },
             nullptr});
  std::this_thread::sleep_for(500ms);
  // About ten polls in half a second at 50 ms: never a busy loop.
  EXPECT_TRUE(polls.load() >= 3);
  EXPECT_TRUE(polls.load() <= 20);
  done = true;
  EXPECT_TRUE(waitFor([&] { return dog.inFlight() == 0; }, 2s));
  const int settled = polls.load();
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(polls.load(), settled);
}

SMDDP_TEST(stop_returns_with_work_in_flight) {
  auto dog = std::make_unique<Watchdog>(1000ms, nullptr, nullptr);
  dog->watch({"barrier #1", Deadline::after(60s), [] { return false; }, nullptr});
  const auto t0 = std::chrono::steady_clock::now();
  dog.reset();
  EXPECT_TRUE(std::chrono::steady_clock::now() - t0 < 500ms);
}

SMDDP_TEST(a_timeout_says_what_the_work_waits_on) {
  std::string group_why;
  std::mutex mu;
  Watchdog dog(20ms, nullptr, [&](const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    group_why = why;
  });
  Failures f;
  std::atomic<int> asked{0};
  dog.watch({"allgather #4 on cuda:0", Deadline::after(50ms), [] { return false; },
             [&](const std::string& why) { f.item(why); },
             [&] {
               ++asked;
               return std::string("it waits on rank 2 of its node");
             }});
  EXPECT_TRUE(waitFor([&] { return f.count() == 1; }, 3s));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(group_why, std::string("allgather #4 on cuda:0 did not finish within the group's timeout; it waits on "
                                   "rank 2 of its node"));
  // Asked only when it is needed, once.
  EXPECT_EQ(asked.load(), 1);
}
