"""The cost model: NCCL's flat ring against smddp's hierarchical schedule.

An alpha-beta model (a step that moves m bytes over a link of bandwidth B
costs alpha + m/B) of N nodes of G GPUs: the flat ring's P-1 steps over the
slowest link, against smddp's rail stage (each GPU over its own NIC share)
and node stage (over NVSwitch) as the machine's schedule runs them: the CUDA
path's (algorithm/cuda: one stage after the other on one stream, the node
stage in chunks of the staging buffer with an exchange per chunk) or the CPU
path's pipelined one (algorithm/hierarchical: both stages at once, chunk by
chunk). bench/README.md ("Cost model") gives the formulas and the source of
every preset's constant. Torch-free.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

import numpy as np

from smddp.bench import ops as _ops
from smddp.bench import cluster_run, record, views
from smddp.bench.units import HelpFormatter, SizeOptions, arg, at_least, choose, format_size
from smddp.bench.units import parse_counts, parse_size, parse_size_list, positive

MODEL_OPS = ("all_gather", "reduce_scatter", "all_reduce")
# smddp's schedules the model knows, by the code path that runs them.
SCHEDULES = ("cuda", "cuda-pipelined", "cuda-zero-copy", "cuda-zero-copy-pipelined", "cpu-pipelined")


@dataclass(frozen=True)
class Machine:
    """The constants of the model; every one can be overridden from the CLI."""

    name: str
    gpus_per_node: int
    nvlink_gbs: float  # GB/s per GPU per direction, through NVSwitch
    nics: int
    nic_gbps: float  # line rate of one NIC, Gb/s
    net_efficiency: float  # achieved / line rate
    alpha_intra_us: float  # latency of one ring step inside a node
    alpha_inter_us: float  # latency of one ring step across nodes
    ring_channels: int = 0  # rings NCCL runs side by side; 0: one per GPU of a node
    chunk_bytes: int = 1 << 20  # cpu-pipelined: the pipeline chunk (SMDDP_CHUNK_BYTES)
    node_gbps: float = 0.0  # effective network rate of a node; 0: nics*nic_gbps*net_efficiency
    # Which of smddp's schedules runs (SCHEDULES): cuda, the GPU path's node
    # and rails schedules (cuda-pipelined: with SMDDP_CUDA_PIPELINE,
    # cuda-zero-copy: with SMDDP_CUDA_ZERO_COPY, cuda-zero-copy-pipelined:
    # with both);
    # cpu-pipelined, the host path's stages side by side.
    schedule: str = "cpu-pipelined"
    staging_bytes: int = 32 << 20  # cuda: each rank's staging buffer (SMDDP_CUDA_STAGING_BYTES)
    copy_gbs: float = 0.0  # cuda: bytes/s of a copy inside one GPU, GB/s; 0: not modelled
    sync_us: float = 0.0  # cuda: GPU time of one exchange's two meetings of the node's ranks

    @property
    def node_net_gbps(self) -> float:
        return self.node_gbps or self.nics * self.nic_gbps * self.net_efficiency

    @property
    def node_net_gbs(self) -> float:
        return self.node_net_gbps / 8

    @property
    def nic_share_gbs(self) -> float:
        return self.node_net_gbs / self.gpus_per_node

    @property
    def channels(self) -> int:
        return self.ring_channels or self.gpus_per_node


# Sources in bench/README.md ("Cost model").
PRESETS: dict[str, Machine] = {
    "p4d": Machine("p4d.24xlarge (8 A100, NVSwitch, 4 x 100 Gb/s EFA)", gpus_per_node=8,
                   nvlink_gbs=300.0, nics=4, nic_gbps=100.0, net_efficiency=0.85,
                   alpha_intra_us=3.4, alpha_inter_us=14.0, schedule="cuda",
                   copy_gbs=777.5, sync_us=20.0),
    "p5": Machine("p5.48xlarge (8 H100, NVSwitch, 32 x 100 Gb/s EFA)", gpus_per_node=8,
                  nvlink_gbs=450.0, nics=32, nic_gbps=100.0, net_efficiency=0.85,
                  alpha_intra_us=3.4, alpha_inter_us=14.0, schedule="cuda",
                  copy_gbs=1675.0, sync_us=20.0),
}  # fmt: skip


def _check(op: str, nodes: int, m: Machine) -> None:
    if op not in MODEL_OPS:
        raise ValueError(f"the model covers {', '.join(MODEL_OPS)}, not {op!r}")
    if nodes < 1 or m.gpus_per_node < 1:
        raise ValueError("nodes and GPUs per node must be at least 1")
    if m.schedule not in SCHEDULES:
        raise ValueError(f"the model knows the schedules {', '.join(SCHEDULES)}, not {m.schedule!r}")


def pipeline_chunks(size: float, m: Machine) -> int:
    return max(1, math.ceil(size / m.gpus_per_node / m.chunk_bytes))


def ring_time(op: str, size: float, nodes: int, m: Machine) -> float:
    """Seconds of the flat ring for ``op`` on ``size`` bytes (nccl-tests size)."""
    _check(op, nodes, m)
    g = m.gpus_per_node
    p = nodes * g
    beta = m.nvlink_gbs if nodes == 1 else min(m.nvlink_gbs, min(m.channels, g) * m.nic_share_gbs)
    latency = (p - nodes) * m.alpha_intra_us * 1e-6 + (nodes - 1) * m.alpha_inter_us * 1e-6
    one_way = latency + (p - 1) * size / p / (beta * 1e9) if p > 1 else 0.0
    return one_way * (2 if op == "all_reduce" else 1)


def hierarchical_time(op: str, size: float, nodes: int, m: Machine) -> float:
    """Seconds of smddp's schedule for ``op`` on ``size`` bytes: the one
    ``m.schedule`` names."""
    _check(op, nodes, m)
    return pipelined_time(op, size, nodes, m) if m.schedule == "cpu-pipelined" else cuda_time(op, size, nodes, m)


def pipelined_time(op: str, size: float, nodes: int, m: Machine) -> float:
    """Seconds of the CPU path's pipelined hierarchical schedule
    (SMDDP_PIPELINE on): AllGather's rail stage, then its node stage
    (ReduceScatter: the other order), chunks in a pipeline, so the slower
    stage plus the faster one's latency and last chunk."""
    _check(op, nodes, m)
    g = m.gpus_per_node
    block = size / (nodes * g)
    # (latency, transfer) of each stage: every GPU over its own rail's NIC
    # share; the node's NVSwitch ring, N blocks per step.
    rail = ((nodes - 1) * m.alpha_inter_us * 1e-6, (nodes - 1) * block / (m.nic_share_gbs * 1e9))
    node = ((g - 1) * m.alpha_intra_us * 1e-6, (g - 1) * nodes * block / (m.nvlink_gbs * 1e9))
    slow, fast = (rail, node) if sum(rail) >= sum(node) else (node, rail)
    one_way = sum(slow) + fast[0] + fast[1] / pipeline_chunks(size, m)
    return one_way * (2 if op == "all_reduce" else 1)


def staged_chunks(op: str, size: float, nodes: int, m: Machine) -> int:
    """How many chunks the CUDA path's staging buffer (Z bytes) cuts a call
    into (algorithm/cuda): AllGather Z/N of each block, ReduceScatter
    Z/(N*G) of each block in whole 16-byte vectors, AllReduce Z/2 of the
    message."""
    n, g, z = nodes, m.gpus_per_node, m.staging_bytes
    block = size / (n * g)
    if op == "all_gather":
        return math.ceil(block / max(1, z // n))
    if op == "reduce_scatter":
        return math.ceil(block / max(16, z // (n * g) // 16 * 16))
    return math.ceil(size / max(16, z // 2 // 16 * 16))


def stages_time(fixed: float, node: float, rail: float, chunks: int) -> float:
    """Seconds of a CUDA schedule's stages after its fixed part: one after the
    other (chunks 0), or side by side in `chunks` chunks, so the slower stage
    plus one chunk of the faster."""
    if not chunks:
        return fixed + node + rail
    return fixed + max(node, rail) + min(node, rail) / chunks


def cuda_time(op: str, size: float, nodes: int, m: Machine) -> float:
    """Seconds of the CUDA path (algorithm/cuda): the node schedule on one
    node, the rails schedule on several. The node stage runs through the
    staging buffers, one exchange per chunk (sync_us: its two meetings of the
    node's ranks); the rail is NCCL on the N ranks of local rank l, a ring of
    N-1 steps (AllGather's grouped send/recv: one round per peer); with one
    GPU per node, NCCL's collective on the whole group. Schedule
    cuda: every step on the caller's stream, so stages and chunks add up;
    cuda-pipelined (SMDDP_CUDA_PIPELINE): the rail stage chunk by chunk on a
    stream of its own, so the slower stage plus one chunk of the faster;
    cuda-zero-copy (SMDDP_CUDA_ZERO_COPY): the node stage on the peers'
    tensors, as zero_copy_time, but for AllReduce over the rails: the staged
    schedule without its staging copies (cuda-zero-copy-pipelined: with
    both)."""
    _check(op, nodes, m)
    if m.gpus_per_node == 1:
        # One GPU per node: the rail is the group, NCCL's ring on the user's buffers.
        return ring_time(op, size, nodes, m)
    zero = m.schedule.startswith("cuda-zero-copy")
    if zero and (op != "all_reduce" or nodes == 1):
        return zero_copy_time(op, size, nodes, m)
    n, g = nodes, m.gpus_per_node
    nv, share = m.nvlink_gbs * 1e9, m.nic_share_gbs * 1e9
    copy = m.copy_gbs * 1e9 if m.copy_gbs else math.inf
    sync, alpha = m.sync_us * 1e-6, m.alpha_inter_us * 1e-6
    block = size / (n * g)
    pipelined = m.schedule in ("cuda-pipelined", "cuda-zero-copy-pipelined")
    if op == "all_gather":
        # The own block into the output; the rail's blocks straight into the
        # output; per chunk of Z/N bytes of each of the rail's N blocks: the
        # N blocks into the own stage, an exchange, each of the G-1 peers'
        # stages copied out over NVSwitch. Pipelined, the rail's sends go
        # chunk by chunk too.
        chunks = staged_chunks(op, size, n, m)
        fixed = block / copy
        node = chunks * sync + n * block / copy + (g - 1) * n * block / nv
        rail = (chunks if pipelined else 1) * (n - 1) * alpha + (n - 1) * block / share
    elif op == "reduce_scatter":
        # Per chunk of Z/(N*G) bytes of every block: the input's rows into the
        # stage, an exchange, one kernel reducing the rail's N blocks from
        # every stage (G-1 of them over NVSwitch); then the rail's
        # ReduceScatter of the node's partials (pipelined: of each chunk's).
        chunks = staged_chunks(op, size, n, m)
        fixed = 0.0
        node = chunks * sync + size / copy + (g - 1) * n * block / nv
        rail = (chunks if pipelined else 1) * (n - 1) * alpha + (n - 1) * block / share
    else:
        # AllReduce, per chunk of Z/2 bytes (the other half holds the
        # results): the chunk into the stage, an exchange, the own slice
        # (1/G) reduced over the node (over the rails into a slot of the
        # rank's own memory); the rail's AllReduce of the slots (2(N-1) steps
        # of a 1/N of them), once per call, pipelined once per chunk; per
        # chunk an exchange (the own slice from its slot into the stage) and
        # every slice copied out (the own one locally). Zero-copy over the
        # rails: the same chunks, slices and rail steps, no copies into the
        # stages, the own slice from its slot into the output; two mapped
        # steps per call (pipelined, per chunk as staged).
        chunks = staged_chunks(op, size, n, m)
        fixed = 0.0
        copies = size / g / copy if zero else size / copy + (2 if n > 1 else 1) * size / g / copy
        steps = 1 if zero and not pipelined else chunks
        node = steps * 2 * sync + copies + 2 * (g - 1) * size / g / nv
        rail = (chunks if pipelined else 1) * 2 * (n - 1) * alpha + 2 * (n - 1) * size / (g * n) / share
    return stages_time(fixed, node, rail, chunks if pipelined else 0)


def zero_copy_time(op: str, size: float, nodes: int, m: Machine) -> float:
    """Seconds of the CUDA path with SMDDP_CUDA_ZERO_COPY (AllGather and
    ReduceScatter; AllReduce on one node): the node stage reads the peers'
    tensors over NVSwitch (no staging copies), its meetings of the node's
    ranks those of the call (sync_us per two: the open, then one or two per
    mapped step); the rail as on the staged path. Schedule cuda-zero-copy: one
    pass, one rail call, every step on the caller's stream;
    cuda-zero-copy-pipelined (with SMDDP_CUDA_PIPELINE, over the rails): the
    staged path's chunks, a rail call each on a stream of its own, so the
    slower stage plus one chunk of the faster."""
    n, g = nodes, m.gpus_per_node
    nv, share = m.nvlink_gbs * 1e9, m.nic_share_gbs * 1e9
    copy = m.copy_gbs * 1e9 if m.copy_gbs else math.inf
    meeting, alpha = m.sync_us * 1e-6 / 2, m.alpha_inter_us * 1e-6
    block = size / (n * g)
    pipelined = m.schedule == "cuda-zero-copy-pipelined" and n > 1
    if op == "all_gather":
        # The own block into the output (and the open), the rail straight
        # into the output, each peer's rail blocks from the peer's output
        # (a mapped step of two meetings, pipelined one per chunk of Z/N of
        # each block; on one node one meeting).
        chunks = staged_chunks(op, size, n, m) if pipelined else 1
        fixed = block / copy + meeting
        node = (2 * chunks if n > 1 else 1) * meeting + (g - 1) * n * block / nv
        rail = chunks * (n - 1) * alpha + (n - 1) * block / share
    elif op == "reduce_scatter":
        # The open and one mapped step; one kernel (pipelined: per chunk of
        # Z/(N*G) of each block) reducing the rail's N blocks of every peer's
        # input into the partials, then the rail's ReduceScatter of them (of
        # each chunk's).
        chunks = staged_chunks(op, size, n, m) if pipelined else 1
        fixed = 2 * meeting
        node = (g - 1) * n * block / nv
        rail = chunks * (n - 1) * alpha + (n - 1) * block / share
    else:
        # AllReduce on one node: the own slice (1/G) of every input reduced
        # into the output, then every peer's slice copied.
        assert n == 1, "the zero-copy AllReduce over the rails is cuda_time's"
        return 4 * meeting + 2 * (g - 1) * size / g / nv
    return stages_time(fixed, node, rail, chunks if pipelined else 0)


@dataclass(frozen=True)
class Estimate:
    op: str
    nodes: int
    gpus: int
    size_bytes: int
    ring_s: float
    hier_s: float
    ring_busbw_gbs: float
    hier_busbw_gbs: float
    ratio: float  # ring time / hierarchical time = hierarchical busbw / ring busbw


def estimate(op: str, size: int, nodes: int, m: Machine) -> Estimate:
    """Both schedules for one point."""
    p = nodes * m.gpus_per_node
    ring, hier = ring_time(op, size, nodes, m), hierarchical_time(op, size, nodes, m)
    busbw = [_ops.busbw_gbs(op, size, t, p) if t > 0 else 0.0 for t in (ring, hier)]
    return Estimate(op, nodes, p, size, ring, hier, *busbw, ring / hier if hier > 0 else 1.0)


def fit_alpha_beta(nbytes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit of ``seconds = alpha + nbytes / beta``.

    Relative errors are minimised, so that the small sizes (which fix alpha)
    count as much as the large ones (which fix beta). Returns (alpha in
    seconds, beta in bytes/s); beta is inf when time does not grow with size.
    """
    x = np.asarray(nbytes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if x.shape != t.shape or x.size < 2 or np.any(t <= 0):
        raise ValueError("need at least two positive (bytes, seconds) samples")
    a = np.stack([1.0 / t, x / t], axis=1)
    (alpha, inv_beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if alpha < 0:
        alpha = 0.0
        inv_beta = float(np.sum(x / t) / np.sum((x / t) ** 2))
    if inv_beta <= 0:
        return float(np.median(t)), math.inf
    return float(alpha), float(1.0 / inv_beta)


# -- the command ---------------------------------------------------------------


# The options of the constants that override the preset: Machine field -> type, help.
_CONSTANTS: dict[str, tuple[Any, str]] = {
    "gpus_per_node": (at_least(1), "GPUs per node"),
    "nvlink_gbs": (positive, "GB/s per GPU per direction inside a node"),
    "nics": (at_least(1), "NICs per node"),
    "nic_gbps": (positive, "line rate of one NIC, Gb/s"),
    "net_efficiency": (positive, "achieved fraction of the NICs' line rate"),
    "node_gbps": (positive,
                  "effective network Gb/s of a node (instead of nics x rate x efficiency)"),
    "alpha_intra_us": (at_least(0, float), "latency of a ring step inside a node, us"),
    "alpha_inter_us": (at_least(0, float), "latency of a ring step across nodes, us"),
    "ring_channels": (at_least(0),
                      "rings the flat ring runs side by side (0, the default: GPUs per node)"),
    "chunk_bytes": (at_least(1, parse_size), "cpu-pipelined: the pipeline chunk [1M]"),
    "schedule": (str,
                 "smddp's schedule: cuda (the GPU path: stages one after the other, the node "
                 "stage through the staging buffers), cuda-pipelined (the same with "
                 "SMDDP_CUDA_PIPELINE=1: the rail stage on a stream of its own, chunk by chunk), "
                 "cuda-zero-copy (with SMDDP_CUDA_ZERO_COPY=1: the node stage on the peers' tensors, one pass), "
                 "cuda-zero-copy-pipelined (with both: the zero-copy node stage in the staged path's chunks "
                 "beside the rail's) or cpu-pipelined (the host path: stages side by side) [the preset's: cuda]"),
    "staging_bytes": (at_least(1, parse_size),
                      "cuda: each rank's staging buffer, SMDDP_CUDA_STAGING_BYTES [32M]"),
    "copy_gbs": (positive, "cuda: GB/s of a copy inside one GPU (read and write)"),
    "sync_us": (at_least(0, float),
                "cuda: GPU time of one exchange through the staging buffers (two meetings of "
                "the node's ranks), us"),
}  # fmt: skip
SIZES = SizeOptions(sizes="64M,256M", minbytes="64M", maxbytes="256M", factor=2.0)


def build_parser(prog: str = "smddp-bench model") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Alpha-beta model of NCCL's flat ring and of smddp's hierarchical schedule "
        "(AllGather, ReduceScatter, AllReduce) on multi-node GPU machines; with --calibrate "
        "(smddp-bench calibrate), fit the constants of this host's transports and compare "
        "with measurements.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--preset", choices=[*sorted(PRESETS), "cluster"], default="p4d",
                   help="machine; cluster: the cluster of namespaces smddp-cluster makes, "
                   "calibrated and measured on it, at 4M,16M,64M unless sizes are given "
                   "(smddp.bench.cluster_model)")
    p.add_argument("--nodes", type=arg(parse_counts), default="16,128",
                   help="comma list of node counts")
    SIZES.add(p)
    p.add_argument("--op", type=arg(lambda text: choose(text, MODEL_OPS, "op for the model")),
                   default=",".join(MODEL_OPS), help=f"comma list of {', '.join(MODEL_OPS)}")
    g = p.add_argument_group("constants (override the preset)")
    for name, (kind, text) in _CONSTANTS.items():
        flag = "--chunk" if name == "chunk_bytes" else "--" + name.replace("_", "-")
        g.add_argument(flag, dest=name, type=kind, help=text, **({"choices": SCHEDULES} if name == "schedule" else {}))
    g = p.add_argument_group("calibration on this host")
    g.add_argument("--calibrate", action="store_true",
                   help="measure smddp here, fit alpha and beta of shared memory (inside a node) "
                   "and of sockets (between emulated nodes), and print the model next to the "
                   "measurements")
    g.add_argument("--nproc", type=int, default=4, help="ranks for --calibrate")
    g.add_argument("--emulated-nodes", type=int, default=2,
                   help="emulated nodes for --calibrate (at least 2)")
    g.add_argument("--calibrate-sizes", type=arg(parse_size_list),
                   default="4K,16K,64K,256K,1M,4M,16M", help="sizes for --calibrate")
    g.add_argument("-n", "--iters", type=at_least(2), default=10,
                   help="timed calls per size for --calibrate")
    g.add_argument("--timeout", type=positive, default=900.0, help="seconds --calibrate may take")
    p.add_argument("--json", help="write the estimates (or the calibration) to this file")
    cluster_run.add_arguments(p, nics=False)
    return p


def describe(m: Machine) -> str:
    if m.node_gbps:
        net = f"{m.node_net_gbps:.4g} Gb/s per node (given)"
    else:
        net = (f"{m.nics} x {m.nic_gbps:.4g} Gb/s x {m.net_efficiency:.4g} "
               f"= {m.node_net_gbps:.4g} Gb/s per node")  # fmt: skip
    return "\n".join([
        f"# {m.name}: {m.gpus_per_node} GPUs per node",
        f"#   in a node  {m.nvlink_gbs:.4g} GB/s per GPU per direction",
        f"#   network    {net} = {m.node_net_gbs:.4g} GB/s; "
        f"NIC share per GPU {m.nic_share_gbs:.4g} GB/s",
        f"#   alpha      {m.alpha_intra_us:.4g} us per ring step inside a node, "
        f"{m.alpha_inter_us:.4g} us across nodes",
        f"#   flat ring  {m.channels} rings side by side",
        f"#   smddp      {describe_schedule(m)}",
    ])  # fmt: skip


def describe_schedule(m: Machine) -> str:
    """smddp's schedule and its constants, in one line."""
    copy = f"{m.copy_gbs:.4g} GB/s" if m.copy_gbs else "not modelled"
    if m.schedule.startswith("cuda-zero-copy"):
        how = (f"in the chunks of a staging buffer of {format_size(m.staging_bytes)}, the rail stage on a stream "
               "of its own beside it (SMDDP_CUDA_ZERO_COPY, SMDDP_CUDA_PIPELINE)"
               if m.schedule == "cuda-zero-copy-pipelined" else
               "in one pass (SMDDP_CUDA_ZERO_COPY; AllReduce over the rails in the staged path's chunks), "
               "stages one after the other")  # fmt: skip
        return (f"the CUDA schedule, the node stage zero-copy on the peers' tensors {how}; "
                f"{m.sync_us / 2:.4g} us per meeting of the node's ranks, copies in a GPU {copy}")
    if m.schedule.startswith("cuda"):
        how = ("the rail stage on a stream of its own, chunk by chunk (SMDDP_CUDA_PIPELINE)"
               if m.schedule == "cuda-pipelined" else "stages one after the other")  # fmt: skip
        return (f"the CUDA schedule, {how}; staging buffer "
                f"{format_size(m.staging_bytes)}, {m.sync_us:.4g} us per exchange, copies in a GPU {copy}")
    return f"the CPU pipelined schedule, stages side by side in chunks of {format_size(m.chunk_bytes)}"


def main(argv: list[str], prog: str = "smddp-bench model", calibrate: bool = False) -> int:
    """``smddp-bench model`` (and ``smddp-bench calibrate``)."""
    from smddp.bench import cluster_model  # the cluster preset (which imports this module)

    parser = build_parser(prog)
    ns = parser.parse_args(argv)
    cluster = ns.preset == "cluster"  # its own sizes, and its constants from the cluster
    try:
        sizes = (cluster_model.SIZES if cluster else SIZES).parse(ns)
    except ValueError as e:
        parser.error(str(e))
    if cluster:
        return cluster_model.main(ns, parser, argv, sizes)
    m = replace(PRESETS[ns.preset], **{k: getattr(ns, k) for k in _CONSTANTS
                                       if getattr(ns, k) is not None})  # fmt: skip
    if ns.calibrate or calibrate:
        from smddp.bench import calibrate as _calibrate

        return _calibrate.main(ns, [*prog.split(), *argv])
    estimates = [asdict(estimate(o, s, n, m)) for o in ns.op for n in ns.nodes for s in sizes]
    print(f"# smddp-bench model: preset {ns.preset}")
    print(describe(m))
    print("#")
    print(views.model_table(estimates))
    if ns.json:
        rec = record.new("model", [*prog.split(), *argv], vars(ns), preset=ns.preset,
                         constants=asdict(m), schedule=describe_schedule(m), results=estimates)  # fmt: skip
        record.write(rec, ns.json)
        print(f"# written: {ns.json}", file=sys.stderr)
    return 0
