#include "harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <thread>

namespace smddp::test {

namespace {

std::vector<TestCase>& registry() {
  static std::vector<TestCase> tests;
  return tests;
}

int gFailures = 0;
std::vector<std::string> gTempDirs;

} // namespace

int registerTest(const char* name, void (*fn)()) {
  registry().push_back({name, fn});
  return 0;
}

void fail(const char* file, int line, const std::string& msg) {
  ++gFailures;
  std::fprintf(stderr, "  FAIL [pid %d] %s:%d: %s\n", static_cast<int>(::getpid()), file, line, msg.c_str());
}

int failures() {
  return gFailures;
}

std::string tempDir() {
  char tmpl[] = "/tmp/smddp-native-XXXXXX";
  char* d = ::mkdtemp(tmpl);
  if (d == nullptr) {
    std::perror("mkdtemp");
    std::abort();
  }
  gTempDirs.emplace_back(d);
  return d;
}

DirStore::DirStore(std::string dir, std::chrono::milliseconds timeout)
    : dir_(std::move(dir)), timeout_(timeout) {}

std::string DirStore::path(const std::string& key) const {
  std::string safe;
  for (char c : key) {
    safe += c == '/' ? '%' : c;
  }
  return dir_ + "/" + safe;
}

void DirStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  std::string p = path(key);
  std::string tmp = p + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(reinterpret_cast<const char*>(value.data()), static_cast<std::streamsize>(value.size()));
  }
  std::rename(tmp.c_str(), p.c_str());
}

std::vector<uint8_t> DirStore::get(const std::string& key) {
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  std::string p = path(key);
  while (true) {
    std::ifstream f(p, std::ios::binary);
    if (f) {
      return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
    }
    if (std::chrono::steady_clock::now() > deadline) {
      SMDDP_THROW(kTimeout, "DirStore: no key ", key);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

bool DirStore::check(const std::string& key) {
  return ::access(path(key).c_str(), F_OK) == 0;
}

int64_t DirStore::add(const std::string& key, int64_t delta) {
  std::string lock = dir_ + "/.lock";
  int fd = ::open(lock.c_str(), O_CREAT | O_RDWR, 0600);
  ::flock(fd, LOCK_EX);
  int64_t value = 0;
  {
    std::ifstream f(path(key));
    if (f) {
      f >> value;
    }
  }
  value += delta;
  {
    std::ofstream f(path(key) + ".tmp");
    f << value;
  }
  std::rename((path(key) + ".tmp").c_str(), path(key).c_str());
  ::flock(fd, LOCK_UN);
  ::close(fd);
  return value;
}

void runRanks(
    int n,
    const std::function<void(int rank)>& body,
    std::chrono::seconds timeout,
    const std::function<bool(int rank)>& may_die) {
  std::vector<pid_t> pids;
  std::fflush(nullptr);
  for (int r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      try {
        body(r);
        code = gFailures == 0 ? 0 : 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "  FAIL rank %d threw: %s\n", r, e.what());
        code = 2;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<bool> done(static_cast<size_t>(n), false);
  int remaining = n;
  while (remaining > 0) {
    for (int r = 0; r < n; ++r) {
      if (done[r]) {
        continue;
      }
      int status = 0;
      pid_t got = ::waitpid(pids[r], &status, WNOHANG);
      if (got == pids[r]) {
        done[r] = true;
        --remaining;
        bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && !(may_die && may_die(r))) {
          fail(__FILE__, __LINE__,
               "rank " + std::to_string(r) +
                   (WIFEXITED(status) ? " exited with " + std::to_string(WEXITSTATUS(status))
                                      : " died of signal " + std::to_string(WTERMSIG(status))));
        }
      }
    }
    if (remaining > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r) {
        if (!done[r]) {
          ::kill(pids[r], SIGKILL);
          ::waitpid(pids[r], nullptr, 0);
          fail(__FILE__, __LINE__, "rank " + std::to_string(r) + " did not finish in time (killed)");
        }
      }
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::vector<int> iota(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    v[static_cast<size_t>(i)] = i;
  }
  return v;
}

transport::NodeArena::Options smallSlots() {
  transport::NodeArena::Options o;
  o.slot_bytes = 4096;
  return o;
}

} // namespace smddp::test

int main(int argc, char** argv) {
  using namespace smddp::test;
  int failed_tests = 0;
  int run = 0;
  for (const auto& t : registry()) {
    if (argc > 1 && std::strstr(t.name, argv[1]) == nullptr) {
      continue;
    }
    int before = failures();
    std::fprintf(stderr, "[ RUN  ] %s\n", t.name);
    try {
      t.fn();
    } catch (const std::exception& e) {
      fail(__FILE__, __LINE__, std::string("uncaught exception: ") + e.what());
    }
    bool ok = failures() == before;
    std::fprintf(stderr, "[ %s ] %s\n", ok ? " OK " : "FAIL", t.name);
    failed_tests += ok ? 0 : 1;
    ++run;
  }
  for (const auto& d : gTempDirs) {
    std::error_code ec;
    std::filesystem::remove_all(d, ec);
  }
  std::fprintf(stderr, "%d tests, %d failed\n", run, failed_tests);
  return failed_tests == 0 ? 0 : 1;
}
