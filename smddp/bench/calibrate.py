"""``smddp-bench calibrate`` (``model --calibrate``): the model's constants
for this host.

Two ranks of one (emulated) node exchange through shared memory; two ranks of
different emulated nodes through sockets (or whatever smddp uses between
nodes today). An AllGather between two ranks is a single step of S/2 bytes,
so its time is alpha + (S/2)/beta of that transport; a least-squares fit over
a sweep of sizes gives both. The model, fed with these constants (one "GPU"
per rank, each with its own socket path), is then printed next to smddp's
measured AllGather, ReduceScatter and AllReduce on the whole emulated cluster.
Calls are timed with a barrier before each (smddp.bench.timing), and checked.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any, Sequence

from smddp.bench import launch, record, timing, views
from smddp.bench import model as _model
from smddp.bench import ops as _ops
from smddp.bench.units import format_size, parse_size


@dataclass
class CalibrationSettings:
    sizes: tuple[int, ...]
    timing: timing.Timing
    pg_timeout: float
    chunk_bytes: int
    json_path: str | None
    argv: list[str]


def main(ns: argparse.Namespace, argv: list[str]) -> int:
    world, nodes = ns.nproc, ns.emulated_nodes
    what = "smddp-bench calibrate"
    if nodes < 2 or world % nodes or world // nodes < 2:
        print(f"{what}: need at least 2 emulated nodes of at least 2 ranks (got --nproc {world} "
              f"--emulated-nodes {nodes})")  # fmt: skip
        return 2
    try:
        chunk = ns.chunk_bytes or parse_size(os.environ.get("SMDDP_CHUNK_BYTES") or "1M")
    except ValueError as e:
        print(f"{what}: SMDDP_CHUNK_BYTES: {e}")
        return 2
    how = timing.Timing(timing.BARRIER_EACH, warmup=2, block_warmup=0, iters=ns.iters, rounds=1)
    settings = CalibrationSettings(tuple(ns.calibrate_sizes), how, 120.0, chunk, ns.json, argv)
    rpn = world // nodes
    print(f"# {what}: {world} ranks = {nodes} emulated nodes x {rpn}, smddp, sizes "
          f"{', '.join(format_size(s) for s in settings.sizes)}\n# {how.describe()}", flush=True)
    with launch.Ranks(what) as ranks:
        ranks.spawn(run_rank, world, (settings,), {"SMDDP_RANKS_PER_NODE": str(rpn)})
        return ranks.wait(ns.timeout)


# A rank outside the pair being measured: it only joins the barriers and the exchange of timings.
IDLE = SimpleNamespace(run=lambda: None, restore=lambda: None, poison=lambda: None, wrong=lambda: 0)


def medians(comm: Any, how: timing.Timing, op: str, size: int, groups: dict[str, Any],
            members: list[int]) -> tuple[int, dict[str, float]]:  # fmt: skip
    """(size, median seconds of each group) of one point, the groups
    interleaved; the ranks outside ``members`` idle."""
    from smddp.bench.sweep import Buffers

    n, geom, cases = len(members), _ops.geometry(op, size, 4, len(members)), {}
    for k, group in groups.items():
        buf = Buffers(op, "float32", geom, "sum", 0, members.index(comm.rank), n) if comm.rank in members else None
        cases[k] = buf.case(buf.call(group)) if buf else IDLE
    res = timing.measure(cases, comm, how)
    for k, r in res.items():
        if r.status == "error" or r.wrong:
            raise RuntimeError(f"{k} {op} {format_size(size)}: {r.error or 'wrong results'}")
    return geom.size, {k: statistics.median(r.samples) for k, r in res.items()}


def fit(samples: list[tuple[int, float]]) -> dict[str, Any]:
    """alpha and beta of one transport from (nccl-tests size, seconds) of a
    two-rank AllGather, which moves size/2 bytes in its one step."""
    steps = [(size / 2, t) for size, t in samples]
    alpha, beta = _model.fit_alpha_beta([b for b, _ in steps], [t for _, t in steps])
    worst = max(abs(alpha + b / beta - t) / t for b, t in steps)
    return {"alpha_s": alpha, "beta_bytes_per_s": beta if math.isfinite(beta) else None,
            "worst_error": worst, "samples": [{"step_bytes": b, "seconds": t} for b, t in steps]}  # fmt: skip


def pair_fits(comm: Any, how: timing.Timing, sizes: Sequence[int], pairs: dict[str, list[int]],
              groups: dict[str, Any], labels: dict[str, str]) -> dict[str, dict[str, Any]]:  # fmt: skip
    """The fit of each transport, from AllGathers between its pair of ranks
    (``pairs``: name -> the two ranks, ``groups``: name -> their group)."""
    fits = {}
    for k, members in pairs.items():
        points = [medians(comm, how, "all_gather", max(8, size), {k: groups[k]}, members) for size in sizes]
        fits[k] = {"label": labels[k], **fit([(n, t[k]) for n, t in points])}
    return fits


def run_rank(s: CalibrationSettings, rank: int, world: int, init_method: str, local_rank: int) -> int:
    import torch.distributed as dist

    from smddp.bench.sweep import TorchComm, process_group

    load_start = record.load_average()
    with process_group(rank, world, init_method, s.pg_timeout) as timeout:
        rpn = int(os.environ["SMDDP_RANKS_PER_NODE"])
        pairs = {"shm": [0, 1], "socket": [0, rpn]}
        groups = {n: dist.new_group(r, backend="smddp", timeout=timeout) for n, r in pairs.items()}
        whole = {"smddp": dist.new_group(backend="smddp", timeout=timeout)}
        comm = TorchComm(dist.group.WORLD)
        labels = {"shm": "shared memory (ranks 0 and 1, one node)", "socket": f"sockets (ranks 0 and {rpn}, two nodes)"}
        fits = pair_fits(comm, s.timing, s.sizes, pairs, groups, labels)
        measured = []
        for op in _model.MODEL_OPS:
            for size in (x for x in s.sizes if x >= 4 * world):
                nbytes, t = medians(comm, s.timing, op, size, whole, list(range(world)))
                measured.append((op, nbytes, t["smddp"]))
        if rank == 0:
            _report(s, world, rpn, fits, measured, load_start)
        dist.barrier()
        return 0


def _report(s: CalibrationSettings, world: int, rpn: int, fits: dict[str, dict],
            measured: list[tuple[str, int, float]], load_start: Any) -> None:  # fmt: skip
    gbs = {k: (f["beta_bytes_per_s"] or 1e15) / 1e9 for k, f in fits.items()}
    machine = _model.Machine(
        name="this host, calibrated (a rank stands for a GPU)", gpus_per_node=rpn,
        nvlink_gbs=gbs["shm"], nics=rpn, nic_gbps=gbs["socket"] * 8, net_efficiency=1.0,
        alpha_intra_us=fits["shm"]["alpha_s"] * 1e6, alpha_inter_us=fits["socket"]["alpha_s"] * 1e6,
        ring_channels=rpn, chunk_bytes=s.chunk_bytes, schedule="cpu-pipelined",
    )  # fmt: skip
    nodes = world // rpn
    results = []
    for op, size, t in measured:
        e = _model.estimate(op, size, nodes, machine)
        results.append({"op": op, "size_bytes": size, "measured_s": t,
                        "model_smddp_s": e.hier_s, "model_ring_s": e.ring_s})  # fmt: skip
    rec = record.new("calibration", s.argv, {**asdict(s), "world": world, "ranks_per_node": rpn},
                     s.timing, constants=asdict(machine), fits=fits, results=results)  # fmt: skip
    rec["machine"]["load_average"]["start"] = load_start
    print(f"#\n# fit of time = alpha + bytes/beta, AllGather between two ranks; the model with "
          f"these constants against smddp on {nodes} nodes x {rpn} ranks:")  # fmt: skip
    print(_model.describe(machine))
    print(views.calibration_tables(rec))
    print("# error = (model - measured) / measured; the ranks share this host's cores, which "
          "the model does not know", flush=True)  # fmt: skip
    if s.json_path:
        record.write(rec, s.json_path)
        print(f"# written: {s.json_path}", flush=True)
