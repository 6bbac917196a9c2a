// The multi-node schedules (hierarchical and flat ring) over emulated nodes:
// forked ranks, a real arena per node and real sockets on loopback. Every
// op (AllGather, ReduceScatter and AllReduce, each in place and not),
// several shapes and sizes, exact results (integer-valued floats), and both
// schedules give the same bits on integers.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>

#include "algorithm/communicator.h"
#include "harness.h"
#include "topology/topology.h"

using namespace smddp;
using algorithm::OpArgs;

namespace {

Config configWith(std::map<std::string, std::string> env) {
  env.emplace("SMDDP_SHM_SLOT_BYTES", "4096");
  env.emplace("SMDDP_CHUNK_BYTES", "4096");
  return Config::fromEnv([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

float value(int rank, size_t i) {
  return static_cast<float>((rank * 131 + static_cast<int>(i % 1009) * 7) % 2003);
}

OpArgs opArgs(CollectiveKind kind, algorithm::ReduceSpec spec, const void* in, void* out, size_t n, uint64_t& seq,
              const Deadline& dl) {
  OpArgs a;
  a.kind = kind;
  a.reduce = spec;
  a.in = in;
  a.out = out;
  a.count = n;
  a.seq = seq++;
  a.deadline = dl;
  return a;
}

// One AllGather of n floats per rank from `in` into `out` (which may hold
// `in` as this rank's block), checked block by block.
void allGatherChecked(algorithm::Communicator& comm, int world, uint64_t& seq, const Deadline& dl,
                      const float* in, float* out, size_t n, const std::function<void(const std::string&)>& bad) {
  comm.allGather(opArgs(CollectiveKind::kAllGather, {}, in, out, n, seq, dl));
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < n; ++i) {
      if (out[static_cast<size_t>(r) * n + i] != value(r, i)) {
        bad(str("allgather n=", n, " block ", r, " elem ", i, ": ", out[static_cast<size_t>(r) * n + i]));
        return;
      }
    }
  }
}

// AllGather of n floats of value(rank, i) per rank, out of place, then in
// place (the input is this rank's block of the output), both checked.
void allGatherBothWays(algorithm::Communicator& comm, int rank, int world, uint64_t& seq, const Deadline& dl,
                       size_t n, const std::function<void(const std::string&)>& bad) {
  const size_t W = static_cast<size_t>(world);
  std::vector<float> in(n), out(n * W, -1.f);
  for (size_t i = 0; i < n; ++i) {
    in[i] = value(rank, i);
  }
  allGatherChecked(comm, world, seq, dl, in.data(), out.data(), n, bad);
  std::vector<float> whole(n * W, -1.f);
  float* mine = whole.data() + static_cast<size_t>(rank) * n;
  std::copy(in.begin(), in.end(), mine);
  allGatherChecked(comm, world, seq, dl, mine, whole.data(), n, bad);
}

// One ReduceScatter of world blocks of n floats at `in` into `out` (which
// may be this rank's block of `in`), checked; `in` holds value(rank, i).
void reduceScatterChecked(algorithm::Communicator& comm, int rank, int world, uint64_t& seq, const Deadline& dl,
                          ReduceOp op, const float* in, float* out, size_t n,
                          const std::function<void(const std::string&)>& bad) {
  comm.reduceScatter(opArgs(CollectiveKind::kReduceScatter, {DataType::kFloat32, op, 1.0, static_cast<double>(world)},
                            in, out, n, seq, dl));
  for (size_t i = 0; i < n; ++i) {
    float want = 0;
    for (int r = 0; r < world; ++r) {
      want += value(r, static_cast<size_t>(rank) * n + i);
    }
    if (op == ReduceOp::kAvg) {
      want /= static_cast<float>(world);
    }
    if (std::abs(out[i] - want) > 1e-3f * std::abs(want)) {
      bad(str("reduce_scatter ", reduceOpName(op), " n=", n, " elem ", i, ": ", out[i], " vs ", want));
      return;
    }
  }
}

bool runOps(int rank, int world, algorithm::Communicator& comm, uint64_t& seq) {
  const size_t sizes[] = {0, 1, 5, 1000, 4099, 3 * 4096 + 7};
  bool ok = true;
  std::function<void(const std::string&)> bad = [&](const std::string& what) {
    ::smddp::test::fail(__FILE__, __LINE__, str("rank ", rank, ": ", what));
    ok = false;
  };
  const size_t W = static_cast<size_t>(world);
  for (size_t n : sizes) {
    Deadline dl = Deadline::after(std::chrono::seconds(30));
    allGatherBothWays(comm, rank, world, seq, dl, n, bad);
    {  // ReduceScatter SUM and AVG, then SUM in place (the output is this
       // rank's block of the input)
      std::vector<float> in(n * W), out(n, -1.f);
      for (size_t i = 0; i < in.size(); ++i) {
        in[i] = value(rank, i);
      }
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        reduceScatterChecked(comm, rank, world, seq, dl, op, in.data(), out.data(), n, bad);
      }
      float* mine = in.data() + static_cast<size_t>(rank) * n;
      reduceScatterChecked(comm, rank, world, seq, dl, ReduceOp::kSum, in.data(), mine, n, bad);
    }
    {  // AllReduce in place, int64 SUM (exact) and float MAX
      std::vector<int64_t> t(n);
      for (size_t i = 0; i < n; ++i) {
        t[i] = static_cast<int64_t>(value(rank, i)) * 1000003;
      }
      OpArgs a;
      a.kind = CollectiveKind::kAllReduce;
      a.reduce = {DataType::kInt64, ReduceOp::kSum, 1.0, static_cast<double>(world)};
      a.in = t.data();
      a.out = t.data();
      a.count = n;
      a.seq = seq++;
      a.deadline = dl;
      comm.allReduce(a);
      for (size_t i = 0; i < n; ++i) {
        int64_t want = 0;
        for (int r = 0; r < world; ++r) {
          want += static_cast<int64_t>(value(r, i)) * 1000003;
        }
        if (t[i] != want) {
          bad(str("allreduce n=", n, " elem ", i, ": ", t[i], " vs ", want));
          break;
        }
      }
    }
    {  // AllReduce AVG out of place
      std::vector<float> in(n), out(n, -1.f);
      for (size_t i = 0; i < n; ++i) {
        in[i] = value(rank, i);
      }
      comm.allReduce(opArgs(CollectiveKind::kAllReduce, {DataType::kFloat32, ReduceOp::kAvg, 1.0, static_cast<double>(world)},
                            in.data(), out.data(), n, seq, dl));
      for (size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int r = 0; r < world; ++r) {
          want += value(r, i);
        }
        want /= static_cast<float>(world);
        if (std::abs(out[i] - want) > 1e-3f * std::abs(want) || in[i] != value(rank, i)) {
          bad(str("allreduce avg n=", n, " elem ", i, ": ", out[i], " vs ", want, " (input now ", in[i], ")"));
          break;
        }
      }
    }
    {  // Broadcast from every root
      for (int root = 0; root < world; ++root) {
        std::vector<float> t(n);
        for (size_t i = 0; i < n; ++i) {
          t[i] = value(rank, i);
        }
        OpArgs a;
        a.kind = CollectiveKind::kBroadcast;
        a.reduce.dtype = DataType::kFloat32;
        a.in = t.data();
        a.out = t.data();
        a.count = n;
        a.root = root;
        a.seq = seq++;
        a.deadline = dl;
        comm.broadcast(a);
        for (size_t i = 0; i < n; ++i) {
          if (t[i] != value(root, i)) {
            bad(str("broadcast root ", root, " n=", n, " elem ", i));
            break;
          }
        }
      }
    }
    OpArgs b;
    b.kind = CollectiveKind::kBarrier;
    b.seq = seq++;
    b.deadline = dl;
    comm.barrier(b);
  }
  return ok;
}

// What every rank runs on the communicator (default: runOps).
using Ops = std::function<void(int rank, int world, algorithm::Communicator& comm, uint64_t& seq)>;

void runShape(int nodes, int per_node, std::map<std::string, std::string> env, const std::string& expect,
              const Ops& ops = nullptr, const std::function<void(int rank, Config&)>& tweak = nullptr) {
  const int world = nodes * per_node;
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(
      world,
      [&](int rank) {
        ::smddp::test::DirStore store(dir);
        Config cfg = configWith(env);
        if (tweak) {
          tweak(rank, cfg);
        }
        std::vector<std::string> keys;
        for (int r = 0; r < world; ++r) {
          keys.push_back(topology::nodeKey("host", r, per_node));
        }
        topology::Topology topo(rank, keys);
        algorithm::NetOptions net;
        net.store_host = "127.0.0.1";
        auto comm = algorithm::createCommunicator(store, topo, cfg, net, std::chrono::seconds(30));
        if (comm->describe().find(expect) != 0) {
          ::smddp::test::fail(__FILE__, __LINE__, str("expected a ", expect, " communicator, got ", comm->describe()));
        }
        uint64_t seq = 0;
        if (ops) {
          ops(rank, world, *comm, seq);
        } else {
          runOps(rank, world, *comm, seq);
        }
      },
      std::chrono::seconds(120));
}

// Floats of many magnitudes, which differ between ranks: sums of three or
// more round differently in different orders.
float noisy(int rank, size_t i) {
  uint64_t x = (static_cast<uint64_t>(rank) + 1) * 0x9E3779B97F4A7C15ull ^ (i * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  const float u = static_cast<float>(x >> 40) / static_cast<float>(1 << 24);
  return (u * 2.f - 1.f) * static_cast<float>(1 << ((i + 3 * static_cast<size_t>(rank)) % 11));
}

// Inputs of the same-bits tests: noisy values in the dtype; for floats
// also +0 and -0 (which MIN/MAX pick by operand order) and, at other
// elements, +inf on rank 0, -inf on rank 1 and a quiet NaN elsewhere, so
// that two NaNs of different bits meet in a sum (x86 keeps the first
// operand's). PRODUCT gets values near 1.
void fillInputs(DataType dt, ReduceOp op, int rank, size_t n, std::vector<uint8_t>& buf) {
  const size_t es = elementSize(dt);
  buf.assign(n * es, 0);
  for (size_t i = 0; i < n; ++i) {
    float v = noisy(rank, i);
    if (op == ReduceOp::kProduct) {
      v = 1.f + v * 1e-3f;
    }
    if (i % 97 == 5) {
      v = rank % 2 == 1 ? -0.f : 0.f;
    } else if (i % 89 == 3) {
      v = rank == 0 ? INFINITY : rank == 1 ? -INFINITY : NAN;
    }
    uint8_t* at = buf.data() + i * es;
    switch (dt) {
      case DataType::kFloat32:
        std::memcpy(at, &v, 4);
        break;
      case DataType::kFloat64: {
        const double d = static_cast<double>(v) * (1.0 + 1e-9 * static_cast<double>(i));
        std::memcpy(at, &d, 8);
        break;
      }
      case DataType::kFloat16: {
        const _Float16 h = static_cast<_Float16>(v);
        std::memcpy(at, &h, 2);
        break;
      }
      case DataType::kBFloat16: {
        uint32_t u = 0;
        std::memcpy(&u, &v, 4);
        const uint16_t h = static_cast<uint16_t>(u >> 16);
        std::memcpy(at, &h, 2);
        break;
      }
      case DataType::kInt64: {
        int64_t x = static_cast<int64_t>(noisy(rank, i) * 1000.f) + static_cast<int64_t>(i) * 7;
        if (op == ReduceOp::kProduct) {
          x = static_cast<int64_t>(i % 3) + 1 + rank;
        }
        std::memcpy(at, &x, 8);
        break;
      }
      case DataType::kInt32: {
        const int32_t x = static_cast<int32_t>(noisy(rank, i) * 1000.f);
        std::memcpy(at, &x, 4);
        break;
      }
      default:
        break;
    }
  }
}

// Every reduction's output bytes on this rank, appended to `file`: for each
// dtype and op, and counts that leave slices and blocks empty, unequal or
// cut into unequal numbers of chunks, an AllReduce and a ReduceScatter out
// of place (the input must not change) and in place (the same bits).
void reductionBits(int rank, int world, algorithm::Communicator& comm, uint64_t& seq, const std::string& file) {
  struct Case {
    DataType dtype;
    ReduceOp op;
  };
  const Case cases[] = {
      {DataType::kFloat32, ReduceOp::kSum},     {DataType::kFloat32, ReduceOp::kAvg},
      {DataType::kFloat32, ReduceOp::kProduct}, {DataType::kFloat32, ReduceOp::kMin},
      {DataType::kFloat32, ReduceOp::kMax},     {DataType::kFloat32, ReduceOp::kPremulSum},
      {DataType::kFloat64, ReduceOp::kAvg},     {DataType::kFloat16, ReduceOp::kSum},
      {DataType::kBFloat16, ReduceOp::kAvg},    {DataType::kBFloat16, ReduceOp::kPremulSum},
      {DataType::kInt64, ReduceOp::kSum},       {DataType::kInt64, ReduceOp::kProduct},
      {DataType::kInt32, ReduceOp::kMax},
  };
  const size_t W = static_cast<size_t>(world);
  const size_t counts[] = {0, 1, 2, 3, 7, W - 1, W + 1, 2 * W + 1, 1000, 4099, W * 512 + 1, W * 1024 + W - 1,
                           W * 2048 + 1};
  std::string bits;
  auto keep = [&](const std::vector<uint8_t>& v, size_t from, size_t len) {
    bits.append(reinterpret_cast<const char*>(v.data()) + from, len);
  };
  for (const Case& k : cases) {
    const size_t es = elementSize(k.dtype);
    const algorithm::ReduceSpec spec{k.dtype, k.op, 0.37, static_cast<double>(world)};
    for (size_t n : counts) {
      const Deadline dl = Deadline::after(std::chrono::seconds(30));
      const std::string what = str("dtype ", dataTypeName(k.dtype), " ", reduceOpName(k.op), " n=", n);
      std::vector<uint8_t> in, out(n * es, 0xAB);
      fillInputs(k.dtype, k.op, rank, n, in);
      const std::vector<uint8_t> pristine = in;
      comm.allReduce(opArgs(CollectiveKind::kAllReduce, spec, in.data(), out.data(), n, seq, dl));
      EXPECT_TRUE(in == pristine);
      keep(out, 0, out.size());
      comm.allReduce(opArgs(CollectiveKind::kAllReduce, spec, in.data(), in.data(), n, seq, dl));
      if (in != out) {
        ::smddp::test::fail(__FILE__, __LINE__, str("rank ", rank, ": allreduce in place differs, ", what));
      }
      fillInputs(k.dtype, k.op, rank, n * W, in);
      const std::vector<uint8_t> whole = in;
      comm.reduceScatter(opArgs(CollectiveKind::kReduceScatter, spec, in.data(), out.data(), n, seq, dl));
      EXPECT_TRUE(in == whole);
      keep(out, 0, out.size());
      const size_t mine = static_cast<size_t>(rank) * n * es;
      comm.reduceScatter(opArgs(CollectiveKind::kReduceScatter, spec, in.data(), in.data() + mine, n, seq, dl));
      if (n > 0 && std::memcmp(in.data() + mine, out.data(), n * es) != 0) {
        ::smddp::test::fail(__FILE__, __LINE__, str("rank ", rank, ": reduce_scatter in place differs, ", what));
      }
    }
  }
  std::FILE* f = std::fopen(file.c_str(), "wb");
  EXPECT_TRUE(f != nullptr && std::fwrite(bits.data(), 1, bits.size(), f) == bits.size());
  if (f != nullptr) {
    std::fclose(f);
  }
}

std::string readAll(const std::string& file) {
  std::string data;
  if (std::FILE* f = std::fopen(file.c_str(), "rb")) {
    char buf[65536];
    size_t got = 0;
    while ((got = std::fread(buf, 1, sizeof(buf), f)) > 0) {
      data.append(buf, got);
    }
    std::fclose(f);
  }
  return data;
}

} // namespace

SMDDP_TEST(hierarchical_shapes) {
  for (auto [nodes, per] : std::vector<std::pair<int, int>>{{2, 1}, {4, 1}, {2, 2}, {2, 3}, {3, 2}, {2, 4}}) {
    std::fprintf(stderr, "  %dx%d\n", nodes, per);
    runShape(nodes, per, {}, "hierarchical");
  }
  // The node stage of small messages by single-copy reads (by default they
  // go through the slots).
  runShape(2, 2, {{"SMDDP_SINGLE_COPY", "on"}}, "hierarchical");
  // Every size pipelined, and every size one stage after the other (through
  // many rounds of the 4K slots).
  runShape(2, 2, {{"SMDDP_PIPELINE", "on"}}, "hierarchical");
  runShape(2, 2, {{"SMDDP_PIPELINE", "off"}}, "hierarchical");
}

// Whether every rank's bits in `dir` are those of path 0.
void expectSameBits(const std::string& dir, int world, size_t paths, const std::string& what) {
  for (int r = 0; r < world; ++r) {
    const std::string first = readAll(str(dir, "/0-", r));
    EXPECT_TRUE(!first.empty());
    for (size_t p = 1; p < paths; ++p) {
      const std::string other = readAll(str(dir, "/", p, "-", r));
      if (other != first) {
        size_t at = 0;
        while (at < first.size() && at < other.size() && first[at] == other[at]) {
          ++at;
        }
        ::smddp::test::fail(__FILE__, __LINE__, str(what, " rank ", r, ": path ", p, " gives other bits than path 0 (from byte ", at, ")"));
      }
    }
  }
}

// The hierarchical schedules reduce in one order whatever the path (the
// node stage pipelined or not, staged or by single-copy reads, any chunk):
// the same bits, with three operands per reduction where the order shows.
SMDDP_TEST(hierarchical_paths_give_the_same_bits) {
  const std::vector<std::map<std::string, std::string>> paths = {
      {{"SMDDP_PIPELINE", "off"}, {"SMDDP_SINGLE_COPY", "on"}},
      {{"SMDDP_PIPELINE", "on"}, {"SMDDP_SINGLE_COPY", "on"}},
      {{"SMDDP_PIPELINE", "on"}, {"SMDDP_SINGLE_COPY", "on"}, {"SMDDP_CHUNK_BYTES", "4100"}},
      {{"SMDDP_PIPELINE", "off"}},
  };
  for (auto [nodes, per] : std::vector<std::pair<int, int>>{{2, 2}, {2, 3}, {3, 2}}) {
    std::fprintf(stderr, "  %dx%d\n", nodes, per);
    const std::string dir = ::smddp::test::tempDir();
    for (size_t p = 0; p < paths.size(); ++p) {
      runShape(nodes, per, paths[p], "hierarchical", [&](int rank, int world, algorithm::Communicator& comm,
                                                         uint64_t& seq) {
        reductionBits(rank, world, comm, seq, str(dir, "/", p, "-", rank));
      });
    }
    expectSameBits(dir, nodes * per, paths.size(), str(nodes, "x", per));
  }
}

// Rail peers on hosts that choose their path differently (one pipelines,
// one runs the stages one after the other for want of cores) exchange the
// same messages: the calls complete, with the bits of a single path.
SMDDP_TEST(hierarchical_hosts_that_choose_differently) {
  for (auto [nodes, per] : std::vector<std::pair<int, int>>{{2, 2}, {3, 2}}) {
    std::fprintf(stderr, "  %dx%d\n", nodes, per);
    const std::string dir = ::smddp::test::tempDir();
    for (size_t p = 0; p < 2; ++p) {
      runShape(
          nodes, per, {{"SMDDP_SINGLE_COPY", "on"}}, "hierarchical",
          [&](int rank, int world, algorithm::Communicator& comm, uint64_t& seq) {
            reductionBits(rank, world, comm, seq, str(dir, "/", p, "-", rank));
          },
          [&](int rank, Config& cfg) {
            // Path 0: every host short of cores; path 1: only node 1's.
            if (p == 0 || rank / per == 1) {
              cfg.host_ranks = 8;
              cfg.host_cpus = 1;
            }
          });
    }
    expectSameBits(dir, nodes * per, 2, str(nodes, "x", per));
  }
}

// The rail's AllGather and ReduceScatter cut blocks finer than
// SMDDP_CHUNK_BYTES (at most half a block, not under 256K), alike on every
// path: blocks of one, two and more such chunks, in and out of place, on
// hosts that pipeline, that do not, and on both kinds at once.
SMDDP_TEST(hierarchical_rail_chunks_across_hosts) {
  for (size_t p = 0; p < 3; ++p) {
    std::fprintf(stderr, "  hosts %zu\n", p);
    runShape(
        2, 2, {{"SMDDP_SINGLE_COPY", "on"}, {"SMDDP_CHUNK_BYTES", "1M"}, {"SMDDP_SHM_SLOT_BYTES", "1M"}},
        "hierarchical",
        [&](int rank, int world, algorithm::Communicator& comm, uint64_t& seq) {
          std::function<void(const std::string&)> bad = [&](const std::string& what) {
            ::smddp::test::fail(__FILE__, __LINE__, str("rank ", rank, " hosts ", p, ": ", what));
          };
          const size_t W = static_cast<size_t>(world);
          for (size_t n : {size_t{50000}, size_t{75001}, size_t{200000}, size_t{262147}, size_t{600001}}) {
            const Deadline dl = Deadline::after(std::chrono::seconds(30));
            allGatherBothWays(comm, rank, world, seq, dl, n, bad);
            std::vector<float> all(n * W), part(n, -1.f);
            for (size_t i = 0; i < all.size(); ++i) {
              all[i] = value(rank, i);
            }
            reduceScatterChecked(comm, rank, world, seq, dl, ReduceOp::kSum, all.data(), part.data(), n, bad);
            reduceScatterChecked(comm, rank, world, seq, dl, ReduceOp::kAvg, all.data(),
                                 all.data() + static_cast<size_t>(rank) * n, n, bad);
          }
        },
        [&](int rank, Config& cfg) {
          // Hosts 0: every one short of cores; 1: node 1's; 2: none.
          if (p == 0 || (p == 1 && rank / 2 == 1)) {
            cfg.host_ranks = 8;
            cfg.host_cpus = 1;
          } else {
            cfg.host_ranks = 1;
            cfg.host_cpus = 8;
          }
        });
  }
}

// Calls that differ between the ranks of a node, some small enough to go
// one stage after the other (rail first) and some pipelined (node first):
// every rank learns of the mismatch at once instead of waiting on a rail
// whose peer waits on its node.
SMDDP_TEST(hierarchical_mismatch_across_paths) {
  runShape(2, 2, {}, "hierarchical", [&](int rank, int world, algorithm::Communicator& comm, uint64_t& seq) {
    const size_t n = rank == 0 || rank == 3 ? 1 : size_t{1} << 16;
    std::vector<float> in(n, 1.f), out(n * static_cast<size_t>(world));
    const auto start = std::chrono::steady_clock::now();
    try {
      comm.allGather(opArgs(CollectiveKind::kAllGather, {}, in.data(), out.data(), n, seq,
                            Deadline::after(std::chrono::seconds(30))));
      ::smddp::test::fail(__FILE__, __LINE__, str("rank ", rank, ": no error"));
    } catch (const Error& e) {
      comm.abort(e.what());
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      // The first to see it says so; its node peers fail with its message.
      const bool says = e.kind() == ErrorKind::kMismatch || std::string(e.what()).find("disagree") != std::string::npos;
      if (!says || s > 10) {
        ::smddp::test::fail(__FILE__, __LINE__, str("rank ", rank, " after ", s, " s: ", e.what()));
      }
    }
  });
}

SMDDP_TEST(flat_ring_shapes) {
  for (auto [nodes, per] : std::vector<std::pair<int, int>>{{2, 2}, {3, 2}, {4, 1}}) {
    std::fprintf(stderr, "  %dx%d\n", nodes, per);
    runShape(nodes, per, {{"SMDDP_ALGO", "ring"}}, "ring (shm+tcp)");
  }
}

SMDDP_TEST(sockets_only) {
  runShape(1, 3, {{"SMDDP_SHM", "0"}, {"SMDDP_SOCKET_STREAMS", "1"}}, "ring (tcp)");
  runShape(1, 3, {{"SMDDP_SHM", "0"}}, "ring (tcp)");
  runShape(2, 2, {{"SMDDP_SHM", "0"}, {"SMDDP_SOCKET_STREAMS", "3"}}, "ring (tcp)");
}

SMDDP_TEST(non_uniform_falls_back_to_the_ring) {
  std::string dir = ::smddp::test::tempDir();
  ::smddp::test::runRanks(3, [&](int rank) {
    ::smddp::test::DirStore store(dir);
    Config cfg = configWith({});
    topology::Topology topo(rank, {"a", "a", "b"});
    algorithm::NetOptions net;
    auto comm = algorithm::createCommunicator(store, topo, cfg, net, std::chrono::seconds(30));
    EXPECT_TRUE(comm->describe().find("ring") == 0);
    uint64_t seq = 0;
    runOps(rank, 3, *comm, seq);
  });
}
