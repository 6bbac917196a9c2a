// The flight recorder (common/flight_recorder.h): states in order, only the
// last entries kept, a dump that is valid JSON written whole, and file names
// made safe.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "common/flight_recorder.h"
#include "harness.h"

using namespace smddp;

SMDDP_TEST(entries_follow_their_calls) {
  FlightRecorder r(8);
  const uint64_t a = r.issued("allreduce", "float32, 1024 elements, SUM");
  const uint64_t b = r.issued("allgather_into_tensor", "bfloat16, 7 elements, cuda:1");
  const uint64_t c = r.issued("barrier", "");
  r.started(a, 10);
  r.completed(a);
  r.started(b, 11);
  r.enqueued(b);
  r.started(c, 12);
  r.failed(c, "timed out waiting for rank 3");
  auto e = r.entries();
  EXPECT_EQ(e.size(), size_t{3});
  EXPECT_TRUE(e[0].state == FlightRecorder::State::kCompleted && e[0].seq == 10 && e[0].ended_ns >= e[0].started_ns);
  EXPECT_TRUE(e[1].state == FlightRecorder::State::kEnqueued && e[1].seq == 11);
  EXPECT_TRUE(e[2].state == FlightRecorder::State::kFailed && e[2].error == "timed out waiting for rank 3");
  // A device call that completes after its failure was recorded stays failed.
  r.failed(b, "watchdog");
  r.completed(b);
  EXPECT_TRUE(r.entries()[1].state == FlightRecorder::State::kFailed);
}

SMDDP_TEST(only_the_last_entries_are_kept) {
  FlightRecorder r(4);
  uint64_t first = 0;
  for (int i = 0; i < 10; ++i) {
    const uint64_t id = r.issued("allreduce", str("call ", i));
    if (i == 0) {
      first = id;
    }
  }
  // Updates of an overwritten entry are dropped, not misapplied.
  r.failed(first, "late");
  auto e = r.entries();
  EXPECT_EQ(e.size(), size_t{4});
  EXPECT_EQ(e.front().detail, std::string("call 6"));
  EXPECT_EQ(e.back().detail, std::string("call 9"));
  for (const auto& x : e) {
    EXPECT_TRUE(x.state == FlightRecorder::State::kIssued);
  }
}

SMDDP_TEST(dump_is_json_written_whole) {
  FlightRecorder r(4);
  const uint64_t a = r.issued("reduce_scatter_tensor", "float16 \"quoted\"\n, 3 elements");
  r.started(a, 5);
  r.failed(a, "peer lost: rank 1 (pid 42) exited");
  const std::string dir = test::tempDir();
  const std::string path = flightDumpPath(dir + "/dump", "my group/1", 3);
  EXPECT_EQ(path, dir + "/dump.my_group_1.3.json");
  EXPECT_TRUE(r.dump(path, "my group/1", 3, 4, "ProcessGroupSMDDP reduce_scatter_tensor #5 failed"));
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(text.find("\"rank\": 3") != std::string::npos);
  EXPECT_TRUE(text.find("\"size\": 4") != std::string::npos);
  EXPECT_TRUE(text.find("\"seq\": 5") != std::string::npos);
  EXPECT_TRUE(text.find("\"state\": \"failed\"") != std::string::npos);
  EXPECT_TRUE(text.find("float16 \\\"quoted\\\"\\n, 3 elements") != std::string::npos);
  // No temporary file is left beside it.
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 1);
  // An empty recorder dumps an empty list.
  FlightRecorder empty;
  EXPECT_TRUE(empty.toJson("g", 0, 1, "r").find("\"collectives\": []") != std::string::npos);
}
