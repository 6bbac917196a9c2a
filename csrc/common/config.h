// Every SMDDP_* knob, declared once.
//
// Each line of SMDDP_CONFIG_KNOBS is one environment variable: its field in
// Config, its kind, its default and what it means. Config::fromEnv() reads and
// validates all of them; a bad value throws kConfig naming the variable and
// the accepted values. smddp/config.py mirrors this table (a test checks the
// two agree) and the README documents it.
//
// A process group snapshots the configuration when it is created, so a test
// can create groups with different settings in one process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/store.h"

namespace smddp {

enum class Algo { kAuto, kRing, kHierarchical };
enum class Tristate { kAuto, kOn, kOff };
enum class HugePageMode { kAuto, kAdvise, kOff };
constexpr size_t kAutoBytes = static_cast<size_t>(-1);

// What the knobs' "auto" values resolve to, and the fixed sizes their help
// names: defined once here, used by the code that applies them, and
// interpolated into the help ({kName} in a help text), so that what the
// documentation says is what the code does.
namespace autos {
// SMDDP_SINGLE_COPY_MIN_BYTES: a cross-memory read of a peer's buffer
// replaces two copies through the staging slots from this size per rank;
// with more ranks than CPUs its system calls and page pinning cost more.
constexpr size_t kSingleCopyMinBytes = size_t{32} << 10;
constexpr size_t kSingleCopyMinBytesOversubscribed = size_t{1} << 20;
// AllReduce reads twice what it writes: its single-copy path starts here.
constexpr size_t kAllReduceSingleCopyMinBytes = size_t{128} << 10;
// SMDDP_PIPELINE=auto: rail data up to this runs its stages in sequence.
constexpr size_t kSequentialRailBytes = size_t{512} << 10;
// The rails cut no chunk under this (SMDDP_CHUNK_BYTES).
constexpr size_t kMinRailChunkBytes = size_t{256} << 10;
// SMDDP_SOCKET_RCVBUF_BYTES=auto where the host's ranks outnumber its CPUs.
constexpr size_t kSocketRcvbufBytes = size_t{1} << 20;
// SMDDP_SPIN_US / SMDDP_YIELD_US=auto, and where ranks outnumber CPUs.
constexpr int kSpinUs = 20;
constexpr int kSpinUsOversubscribed = 0;
constexpr int kYieldUs = 20;
constexpr int kYieldUsOversubscribed = 2000;
} // namespace autos

// X(field, ENV_NAME, agree, kind, default, domain, help)
// agree: every rank of a group must have the same value (it shapes the
// schedules); checked when a group is created.
// kinds and their domain: choice ('|'-separated values), bytes (integer with
// an optional K/M/G suffix, domain "lo..hi"), int (domain "lo..hi"), bool
// (0/1/true/false/on/off), string (any), autoint ("auto", stored as -1, or
// an int in the domain), autobytes ("auto", stored as kAutoBytes, or bytes).
#define SMDDP_CONFIG_KNOBS(X)                                                  \
  X(algo, "SMDDP_ALGO", true, choice, "auto", "auto|ring|hierarchical",              \
    "Schedule of AllGather/ReduceScatter/AllReduce: auto picks from the "     \
    "topology (one node: the node schedules; uniform nodes: hierarchical; "    \
    "otherwise the flat ring), and each schedule its path from the message "   \
    "size; ring forces the flat ring; hierarchical forces rails + node.")      \
  X(chunk_bytes, "SMDDP_CHUNK_BYTES", true, bytes, "1M", "4K..1G",                   \
    "Pipeline chunk of the hierarchical and ring schedules (the rails of the " \
    "hierarchical AllGather and ReduceScatter take at most half a block, but "\
    "not under {kMinRailChunkBytes}).")                                                       \
  X(ranks_per_node, "SMDDP_RANKS_PER_NODE", true, int, "0", "0..1048576",            \
    "Emulate nodes: consecutive groups of this many ranks of one host act as " \
    "separate nodes (0: a node is a host).")                                   \
  X(fallback, "SMDDP_FALLBACK", true, choice, "auto", "auto|gloo|none",              \
    "Backend for the collectives smddp does not implement natively: auto "     \
    "(gloo for CPU tensors, nccl for CUDA tensors), gloo, or none (raise).")   \
  X(log_level, "SMDDP_LOG_LEVEL", false, choice, "warn", "debug|info|warn|error|off", \
    "Verbosity of smddp's messages on stderr.")                                \
  X(shm, "SMDDP_SHM", true, bool, "1", "",                                           \
    "Use shared memory between ranks of one node (0: sockets everywhere).")    \
  X(single_copy, "SMDDP_SINGLE_COPY", true, choice, "auto", "auto|on|off",           \
    "Read peers' buffers directly (cross-memory attach) instead of staging "   \
    "through shared memory; auto chooses by message size.")                    \
  X(single_copy_min_bytes, "SMDDP_SINGLE_COPY_MIN_BYTES", true, autobytes, "auto",   \
    "0..1T",                                                                   \
    "With SMDDP_SINGLE_COPY=auto, the per-rank message size from which the "   \
    "single-copy path is used (AllReduce: at least {kAllReduceSingleCopyMinBytes} per rank); auto: {kSingleCopyMinBytes}, "\
    "or {kSingleCopyMinBytesOversubscribed} when the host's ranks outnumber its CPUs.")                         \
  X(pipeline, "SMDDP_PIPELINE", true, choice, "auto", "auto|on|off",                 \
    "Hierarchical AllGather/ReduceScatter/AllReduce: run the rail and node "   \
    "stages at once, chunk by chunk, on two threads (on) or one after the "    \
    "other on the calling thread (off); auto: pipelined when a block of the "  \
    "rail exceeds SMDDP_CHUNK_BYTES or a rail's data {kSequentialRailBytes}, unless the host's " \
    "ranks outnumber its CPUs (AllReduce: on its single-copy path).")          \
  X(shm_slot_bytes, "SMDDP_SHM_SLOT_BYTES", true, bytes, "1M", "4K..1G",             \
    "Staging buffer of each rank in the node's shared-memory segment: every "  \
    "group takes two per local rank from /dev/shm (8 ranks: 16M at 1M).")      \
  X(spin_us, "SMDDP_SPIN_US", false, autoint, "auto", "0..1000000",                   \
    "Microseconds a waiting rank spins before it yields its CPU; auto: {kSpinUs}, "   \
    "or {kSpinUsOversubscribed} when the host's ranks outnumber its CPUs.")   \
  X(yield_us, "SMDDP_YIELD_US", false, autoint, "auto", "0..1000000",                 \
    "Microseconds a waiting rank then yields its CPU to runnable peers before "\
    "it sleeps on a futex; auto: {kYieldUs}, or {kYieldUsOversubscribed} when the host's ranks outnumber " \
    "its CPUs.")                                                               \
  X(huge_pages, "SMDDP_HUGE_PAGES", false, choice, "auto", "auto|advise|off",         \
    "Transparent huge pages for the large CPU buffers of collectives: advise " \
    "asks for them where pages are not yet touched (madvise MADV_HUGEPAGE); "  \
    "auto also collapses a reused buffer's pages into huge ones once (Linux "  \
    "6.7+); off leaves the memory as it is (and a buffer's own "               \
    "MADV_NOHUGEPAGE, which the advice overrides). Nothing is done where THP " \
    "is disabled (never, or prctl PR_SET_THP_DISABLE).")                       \
  X(huge_pages_min_bytes, "SMDDP_HUGE_PAGES_MIN_BYTES", false, bytes, "4M",          \
    "2M..1T",                                                                  \
    "Smallest 2 MiB-aligned part of a buffer that SMDDP_HUGE_PAGES acts on.")  \
  X(socket_ifname, "SMDDP_SOCKET_IFNAME", false, string, "", "",                      \
    "Network interfaces (names) or addresses of the inter-node sockets, "      \
    "comma-separated: local rank l of a host's L ranks (LOCAL_RANK from the "  \
    "launcher) uses entry l*K/L of the K listed and binds every connection "   \
    "to it, so that each rail has its own NIC; empty: the address this host "  \
    "uses to reach the store.")                                                \
  X(socket_ports, "SMDDP_SOCKET_PORTS", false, string, "", "",                        \
    "Ports the inter-node sockets listen on, LOW-HIGH, for hosts whose "      \
    "firewall admits TCP between them only there: each rank takes a free "    \
    "port of the range while a group is being created (its listener closes "  \
    "once its peers have connected), so a host needs at least as many as "    \
    "ranks creating groups at once; the connecting ends' ports stay "         \
    "ephemeral, and NCCL's (the CUDA rails') are NCCL's; empty: an "          \
    "ephemeral port.")                                                        \
  X(socket_streams, "SMDDP_SOCKET_STREAMS", true, int, "2", "1..16",                 \
    "TCP connections per peer pair; large transfers are striped over them.")   \
  X(socket_rcvbuf_bytes, "SMDDP_SOCKET_RCVBUF_BYTES", false, autobytes, "auto",      \
    "0..1G",                                                                   \
    "Receive buffer of each inter-node TCP connection (SO_RCVBUF, which the "  \
    "kernel doubles for its bookkeeping and caps at net.core.rmem_max); 0 "    \
    "keeps the kernel's autotuning; auto: {kSocketRcvbufBytes} when the host's ranks outnumber " \
    "its CPUs and rmem_max allows it (what a peer sends then stays in cache "  \
    "until the receiver runs), else 0.")                                       \
  X(cuda_ranks_per_gpu, "SMDDP_CUDA_RANKS_PER_GPU", true, int, "1", "1..64",         \
    "Ranks that share one GPU (tests on a single GPU): their CUDA fallback is "  \
    "gloo, since nccl needs a GPU per rank.")                                   \
  X(cuda_staging_bytes, "SMDDP_CUDA_STAGING_BYTES", true, bytes, "32M", "1M..4G",   \
    "Device staging buffer of each rank for the CUDA IPC collectives.")         \
  X(cuda_reduce_blocks, "SMDDP_CUDA_REDUCE_BLOCKS", false, int, "32", "1..4096",    \
    "Thread blocks (of 512 threads) the reduction kernels may use.")            \
  X(cuda_inter_node, "SMDDP_CUDA_INTER_NODE", true, choice, "auto", "auto|nccl|host", \
    "Inter-node stage of CUDA collectives: NCCL rails (auto: when every rank "  \
    "has a GPU of its own) or staging through host memory and sockets. nccl "   \
    "with SMDDP_CUDA_RANKS_PER_GPU above 1 makes each process a host of its "  \
    "own to NCCL (NCCL_HOSTID, unless set), so that ranks sharing a GPU form "  \
    "rails over NCCL's network transport (the rails schedules on one GPU).")   \
  X(cuda_ipc, "SMDDP_CUDA_IPC", true, bool, "1", "",                                  \
    "Map the node peers' device memory with CUDA IPC (0: CUDA collectives "      \
    "stage through host memory). Where a rank cannot map it (a sandboxed "       \
    "runtime), every rank stages through host memory, with a warning naming "    \
    "that rank.")                                                               \
  X(cuda_sync, "SMDDP_CUDA_SYNC", true, choice, "host", "host|device|memops",          \
    "How the ranks of a node meet between the steps of a CUDA collective: "    \
    "host (events, and rounds of the host threads), device (flags written "    \
    "and awaited by kernels on the stream) or memops (flags written and "      \
    "awaited by the stream's own memory operations, no kernel: a waiting "     \
    "rank leaves the GPU to the others). With device and memops the host "     \
    "only enqueues, and a collective can be captured in a CUDA graph; nodes "  \
    "of at most 16 ranks, larger ones meet in host rounds.")                   \
  X(cuda_batch_memops, "SMDDP_CUDA_BATCH_MEMOPS", false, bool, "0", "",                \
    "With SMDDP_CUDA_SYNC=memops: each step's writes and waits go to the "      \
    "stream in one driver call (cuStreamBatchMemOp), in the same order, "       \
    "instead of one call per operation (five per node peer in the middle "      \
    "step of an exchange), in a CUDA graph too.")                              \
  X(cuda_batch_copies, "SMDDP_CUDA_BATCH_COPIES", false, bool, "0", "",                \
    "Copy to or from every node peer at once, in one batch the copy engines "   \
    "may run side by side (cudaMemcpyBatchAsync, CUDA 12.8 or later; not in "  \
    "a CUDA graph), instead of one copy after another.")                      \
  X(cuda_oneshot_bytes, "SMDDP_CUDA_ONESHOT_BYTES", true, bytes, "0", "0..4G",        \
    "A one-node AllReduce of at most this size (and of the staging buffer) "   \
    "reduces every peer's whole input on every rank: one step between the "    \
    "ranks instead of two (a ReduceScatter, then an AllGather), for L times "  \
    "the reads; the bits are the same. 0: always two steps.")                  \
  X(cuda_pipeline, "SMDDP_CUDA_PIPELINE", true, bool, "0", "",                        \
    "Rails AllGather, ReduceScatter and AllReduce: the rail's transfers on " \
    "a stream of their own, a rail call per chunk, each waiting only for "  \
    "the node-stage chunk it needs (and the reverse), so that one chunk "   \
    "crosses the node while another is on the network, at the price of "    \
    "the rail's latency once per chunk (0: one rail call per collective, "  \
    "the rail stage and the node stage one after the other on the "          \
    "collective's stream).")                                                  \
  X(cuda_rail_allgather, "SMDDP_CUDA_RAIL_ALLGATHER", true, choice, "sendrecv",        \
    "sendrecv|nccl",                                                           \
    "Rail stage of a rails AllGather: sendrecv (the rank's block to every "    \
    "other node in one group of NCCL sends and receives, straight into the "  \
    "output: one step) or nccl (ncclAllGather on the rail's communicator "    \
    "into a buffer of the rank's own, with the algorithm NCCL picks for one " \
    "rank per node, then one copy of the blocks to their places).")           \
  X(cuda_zero_copy, "SMDDP_CUDA_ZERO_COPY", true, bool, "0", "",                      \
    "CUDA AllGather, ReduceScatter and AllReduce inside a node (on one node, " \
    "and the node stage of the rails): the node's ranks "                     \
    "map each other's tensors (CUDA IPC of the caching allocator's segments, " \
    "cached per segment) and read them directly, without the staging copies; " \
    "a call whose tensors cannot be mapped (torch's expandable segments, "    \
    "memory not from its caching allocator, a graph being captured) goes "    \
    "through the staging buffers (0: always "                                 \
    "staged). Before torch frees a segment the peers map, they close their "  \
    "mappings (torch's allocator trace hook), as CUDA IPC requires.")          \
  X(debug_dump, "SMDDP_DEBUG_DUMP", false, string, "", "",                            \
    "Path prefix of a dump of each rank's last collectives (op, size, sequence " \
    "number, state, times), written to <prefix>.<group>.<rank>.json when a "     \
    "collective fails or outlives the group's timeout; empty: no dump.")

struct Config {
  Algo algo = Algo::kAuto;
  size_t chunk_bytes = 0;
  int ranks_per_node = 0;
  std::string fallback;
  std::string log_level;
  bool shm = true;
  Tristate single_copy = Tristate::kAuto;
  size_t single_copy_min_bytes = kAutoBytes;
  Tristate pipeline = Tristate::kAuto;
  size_t shm_slot_bytes = 0;
  int spin_us = -1;
  int yield_us = -1;
  HugePageMode huge_pages = HugePageMode::kAuto;
  size_t huge_pages_min_bytes = 0;
  std::string socket_ifname;
  std::string socket_ports;
  int socket_streams = 0;
  size_t socket_rcvbuf_bytes = kAutoBytes;
  int cuda_ranks_per_gpu = 0;
  size_t cuda_staging_bytes = 0;
  int cuda_reduce_blocks = 0;
  std::string cuda_inter_node;
  bool cuda_ipc = true;
  std::string cuda_sync;
  bool cuda_batch_memops = false;
  bool cuda_batch_copies = false;
  size_t cuda_oneshot_bytes = 0;
  bool cuda_pipeline = false;
  std::string cuda_rail_allgather;
  bool cuda_zero_copy = false;
  std::string debug_dump;

  // Not knobs: how many ranks of the job run on this host and the fewest
  // CPUs any of them may use, set alike on every rank of a host by the
  // backend when it creates a group; they resolve the "auto" values.
  int host_ranks = 0;
  int host_cpus = 0;
  // SMDDP_SOCKET_PORTS parsed (0, 0: ephemeral ports).
  int socket_port_low = 0;
  int socket_port_high = 0;
  bool oversubscribed() const {
    return host_cpus > 0 && host_ranks > host_cpus;
  }

  // Reads every knob from the environment (getenv by default); unset or
  // empty means the default. Throws Error(kConfig) naming the first bad
  // variable and what it accepts.
  static Config fromEnv(
      const std::function<const char*(const char*)>& getenv = nullptr);

  // "SMDDP_ALGO=auto;SMDDP_CHUNK_BYTES=1048576;..." over the knobs whose
  // values must agree between ranks, canonical (parsed) values.
  std::string agreementString() const;
  // Human-readable differences between two agreementString()s ("" if none):
  // "SMDDP_ALGO is 'ring' on one and 'auto' on the other".
  static std::string describeDifference(const std::string& a, const std::string& b);
  // Collective over a group: every rank must run the same schedules, so
  // their agreed settings must be equal. Throws Error(kConfig) on every
  // rank, naming the two ranks and the knobs that differ.
  void checkAgreement(Store& store, const std::string& key, int rank, int size,
                      const std::function<std::string(int)>& name_of = nullptr) const;
  // The same exchange for a rank that could not read its settings: it
  // publishes `failure` (the error) in their place, so that every rank
  // throws Error(kConfig) at once, naming it, instead of waiting for it.
  static void failAgreement(Store& store, const std::string& key, int rank, const std::string& failure);
};

struct KnobInfo {
  std::string name;
  bool agree;
  std::string kind;
  std::string default_value;
  std::string domain;
  std::string help;
};

// The table above, for the Python mirror and the README.
std::vector<KnobInfo> describeKnobs();

// Parses "4096", "64K", "1M", "2G", "1T" (powers of 1024). Throws kConfig
// naming `name`.
size_t parseBytes(const std::string& name, const std::string& value);

} // namespace smddp
