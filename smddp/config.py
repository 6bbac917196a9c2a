"""The SMDDP_* environment variables.

The native core declares each knob once (csrc/common/config.h); this module
mirrors that table for Python users and the README (a test checks that the
two agree). Values are read when a process group is created, so set them
before ``init_process_group`` / ``new_group``; a bad value is an error naming
the variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Knob:
    name: str
    agree: bool  # must be the same on every rank of a group
    kind: str  # choice, bytes, int, autoint / autobytes ("auto" or a value), bool or string
    default: str
    domain: str  # choices ("a|b") or range ("lo..hi")
    help: str


KNOBS: tuple[Knob, ...] = (
    Knob("SMDDP_ALGO", True, "choice", "auto", "auto|ring|hierarchical",
         "Schedule of AllGather/ReduceScatter/AllReduce: auto picks from the topology (one node: "
         "the node schedules; uniform nodes: hierarchical; otherwise the flat ring), and each "
         "schedule its path from the message size; ring forces the flat ring; hierarchical forces "
         "rails + node."),
    Knob("SMDDP_CHUNK_BYTES", True, "bytes", "1M", "4K..1G",
         "Pipeline chunk of the hierarchical and ring schedules (the rails of the hierarchical "
         "AllGather and ReduceScatter take at most half a block, but not under 256K)."),
    Knob("SMDDP_RANKS_PER_NODE", True, "int", "0", "0..1048576",
         "Emulate nodes: consecutive groups of this many ranks of one host act as separate "
         "nodes (0: a node is a host)."),
    Knob("SMDDP_FALLBACK", True, "choice", "auto", "auto|gloo|none",
         "Backend for the collectives smddp does not implement natively: auto (gloo for CPU "
         "tensors, nccl for CUDA tensors), gloo, or none (raise)."),
    Knob("SMDDP_LOG_LEVEL", False, "choice", "warn", "debug|info|warn|error|off",
         "Verbosity of smddp's messages on stderr."),
    Knob("SMDDP_SHM", True, "bool", "1", "",
         "Use shared memory between ranks of one node (0: sockets everywhere)."),
    Knob("SMDDP_SINGLE_COPY", True, "choice", "auto", "auto|on|off",
         "Read peers' buffers directly (cross-memory attach) instead of staging through "
         "shared memory; auto chooses by message size."),
    Knob("SMDDP_SINGLE_COPY_MIN_BYTES", True, "autobytes", "auto", "0..1T",
         "With SMDDP_SINGLE_COPY=auto, the per-rank message size from which the single-copy "
         "path is used (AllReduce: at least 128K per rank); auto: 32K, or 1M when the host's "
         "ranks outnumber its CPUs."),
    Knob("SMDDP_PIPELINE", True, "choice", "auto", "auto|on|off",
         "Hierarchical AllGather/ReduceScatter/AllReduce: run the rail and node stages at once, "
         "chunk by chunk, on two threads (on) or one after the other on the calling thread "
         "(off); auto: pipelined when a block of the rail exceeds SMDDP_CHUNK_BYTES or a rail's "
         "data 512K, unless the host's ranks outnumber its CPUs (AllReduce: on its single-copy "
         "path)."),
    Knob("SMDDP_SHM_SLOT_BYTES", True, "bytes", "1M", "4K..1G",
         "Staging buffer of each rank in the node's shared-memory segment."),
    Knob("SMDDP_SPIN_US", False, "autoint", "auto", "0..1000000",
         "Microseconds a waiting rank spins before it yields its CPU; auto: 20, or 0 when the "
         "host's ranks outnumber its CPUs."),
    Knob("SMDDP_YIELD_US", False, "autoint", "auto", "0..1000000",
         "Microseconds a waiting rank then yields its CPU to runnable peers before it sleeps on "
         "a futex; auto: 20, or 2000 when the host's ranks outnumber its CPUs."),
    Knob("SMDDP_HUGE_PAGES", False, "choice", "auto", "auto|advise|off",
         "Transparent huge pages for the large CPU buffers of collectives: advise asks for them "
         "where pages are not yet touched (madvise MADV_HUGEPAGE); auto also collapses a reused "
         "buffer's pages into huge ones once (Linux 6.7+); off leaves the memory as it is (and a "
         "buffer's own MADV_NOHUGEPAGE, which the advice overrides). Nothing is done where THP is "
         "disabled (never, or prctl PR_SET_THP_DISABLE)."),
    Knob("SMDDP_HUGE_PAGES_MIN_BYTES", False, "bytes", "4M", "2M..1T",
         "Smallest 2 MiB-aligned part of a buffer that SMDDP_HUGE_PAGES acts on."),
    Knob("SMDDP_SOCKET_IFNAME", False, "string", "", "",
         "Network interfaces (names) or addresses of the inter-node sockets, "
         "comma-separated: local rank l of a host's L ranks (LOCAL_RANK from the launcher) "
         "uses entry l*K/L of the K listed and binds every connection to it, so that each "
         "rail has its own NIC; empty: the address this host uses to reach the store."),
    Knob("SMDDP_SOCKET_STREAMS", True, "int", "2", "1..16",
         "TCP connections per peer pair; large transfers are striped over them."),
    Knob("SMDDP_SOCKET_RCVBUF_BYTES", False, "autobytes", "auto", "0..1G",
         "Receive buffer of each inter-node TCP connection (SO_RCVBUF, which the kernel doubles "
         "for its bookkeeping and caps at net.core.rmem_max); 0 keeps the kernel's autotuning; "
         "auto: 1M when the host's ranks outnumber its CPUs and rmem_max allows it (what a peer "
         "sends then stays in cache until the receiver runs), else 0."),
    Knob("SMDDP_CUDA_RANKS_PER_GPU", True, "int", "1", "1..64",
         "Ranks that share one GPU (tests on a single GPU): their CUDA fallback is gloo, since "
         "nccl needs a GPU per rank."),
    Knob("SMDDP_CUDA_STAGING_BYTES", True, "bytes", "32M", "1M..4G",
         "Device staging buffer of each rank for the CUDA IPC collectives."),
    Knob("SMDDP_CUDA_REDUCE_BLOCKS", False, "int", "32", "1..4096",
         "Thread blocks (of 512 threads) the reduction kernels may use."),
    Knob("SMDDP_CUDA_INTER_NODE", True, "choice", "auto", "auto|nccl|host",
         "Inter-node stage of CUDA collectives: NCCL rails (auto: when every rank has a GPU of "
         "its own) or staging through host memory and sockets."),
    Knob("SMDDP_CUDA_IPC", True, "bool", "1", "",
         "Map the node peers' device memory with CUDA IPC (0: CUDA collectives stage through "
         "host memory). Where a rank cannot map it (a sandboxed runtime), every rank stages "
         "through host memory, with a warning naming that rank."),
    Knob("SMDDP_DEBUG_DUMP", False, "string", "", "",
         "Path prefix of a dump of each rank's last collectives (op, size, sequence number, "
         "state, times), written to <prefix>.<group>.<rank>.json when a collective fails or "
         "outlives the group's timeout; empty: no dump."),
)


def knob(name: str) -> Knob:
    """The knob called ``name`` (KeyError if there is none)."""
    for k in KNOBS:
        if k.name == name:
            return k
    raise KeyError(name)


def current() -> dict[str, str]:
    """Every knob's value as this process sees it (the default if unset)."""
    return {k.name: (os.environ.get(k.name) or k.default) for k in KNOBS}


def check() -> None:
    """Raises ValueError naming the first SMDDP_* variable with a bad value."""
    from smddp import _C

    _C.check_config()


def apply_log_level() -> None:
    """Applies SMDDP_LOG_LEVEL to the native logger."""
    from smddp import _C

    level = (os.environ.get("SMDDP_LOG_LEVEL") or "warn").strip().lower()
    _C.set_log_level(level)


def markdown_table() -> str:
    """The README's table of knobs."""
    rows = ["| variable | default | values | agree | meaning |", "|---|---|---|---|---|"]
    for k in KNOBS:
        values = k.domain.replace("|", ", ") if k.kind == "choice" else (k.domain or k.kind)
        if k.kind == "bytes":
            values = f"bytes, {k.domain} (K/M/G suffixes)"
        elif k.kind == "autoint":
            values = f"auto, or {k.domain}"
        elif k.kind == "autobytes":
            values = f"auto, or bytes {k.domain} (K/M/G suffixes)"
        agree = "agree" if k.agree else ""
        rows.append(f"| `{k.name}` | `{k.default or '(empty)'}` | {values} | {agree} | {k.help} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
