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
from typing import Any

from smddp.bench import launch, record, timing, views
from smddp.bench import model as _model
from smddp.bench import ops as _ops
from smddp.bench.units import format_size, parse_size, parse_size_list


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


def run_rank(s: CalibrationSettings, rank: int, world: int, init_method: str, local_rank: int) -> int:
    import torch.distributed as dist

    from smddp.bench.sweep import Buffers, TorchComm, process_group

    load_start = record.load_average()
    with process_group(rank, world, init_method, s.pg_timeout) as timeout:
        rpn = int(os.environ["SMDDP_RANKS_PER_NODE"])
        pairs = {"shm": [0, 1], "socket": [0, rpn]}
        groups = {n: dist.new_group(r, backend="smddp", timeout=timeout) for n, r in pairs.items()}
        whole = dist.new_group(backend="smddp", timeout=timeout)
        comm = TorchComm(dist.group.WORLD)
        idle = SimpleNamespace(run=lambda: None, restore=lambda: None, poison=lambda: None, wrong=lambda: 0)

        def median(op: str, size: int, group: Any, members: list[int]) -> tuple[int, float]:
            """(size, median seconds) of one point; ranks outside ``members`` idle."""
            n = len(members)
            geom = _ops.geometry(op, size, 4, n)
            case = idle
            if rank in members:
                buf = Buffers(op, "float32", geom, "sum", 0, members.index(rank), n)
                case = buf.case(buf.call(group))
            res = timing.measure({"smddp": case}, comm, s.timing)["smddp"]
            if res.status == "error" or res.wrong:
                raise RuntimeError(f"{op} {format_size(size)}: {res.error or 'wrong results'}")
            return geom.size, statistics.median(res.samples)

        pair = {name: [median("all_gather", max(8, size), groups[name], members)
                       for size in s.sizes] for name, members in pairs.items()}  # fmt: skip
        measured = [(op, *median(op, size, whole, list(range(world)))) for op in _model.MODEL_OPS
                    for size in s.sizes if size >= 4 * world]  # fmt: skip
        if rank == 0:
            _report(s, world, rpn, pair, measured, load_start)
        dist.barrier()
        return 0


def _report(s: CalibrationSettings, world: int, rpn: int, pair: dict[str, list],
            measured: list[tuple[str, int, float]], load_start: Any) -> None:  # fmt: skip
    labels = {"shm": "shared memory (ranks 0 and 1, one node)", "socket": f"sockets (ranks 0 and {rpn}, two nodes)"}
    fits = {}
    for name, samples in pair.items():
        # An AllGather of two ranks moves size/2 bytes in its one step.
        steps = [(size / 2, t) for size, t in samples]
        alpha, beta = _model.fit_alpha_beta([b for b, _ in steps], [t for _, t in steps])
        worst = max(abs(alpha + b / beta - t) / t for b, t in steps)
        fits[name] = {"label": labels[name], "alpha_s": alpha,
                      "beta_bytes_per_s": beta if math.isfinite(beta) else None,
                      "worst_error": worst, "samples": [{"step_bytes": b, "seconds": t}
                                                         for b, t in steps]}  # fmt: skip
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
