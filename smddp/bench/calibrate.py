"""``smddp-bench model --calibrate``: the model's constants for this host.

Two ranks of one (emulated) node exchange through shared memory; two ranks of
different emulated nodes through sockets (or whatever smddp uses between
nodes today). An AllGather between two ranks is a single step of S/2 bytes,
so its time is alpha + (S/2)/beta of that transport; a least-squares fit over
a sweep of sizes gives both. The model, fed with these constants (one "GPU"
per rank, each with its own socket path), is then printed next to smddp's
measured AllGather, ReduceScatter and AllReduce on the whole emulated cluster.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Callable

from smddp.bench import launch
from smddp.bench import model as _model
from smddp.bench import ops as _ops
from smddp.bench.units import format_size, parse_size, parse_size_list

_ELEM = 4  # float32


@dataclass
class CalibrationSettings:
    sizes: tuple[int, ...]
    iters: int
    warmup: int
    pg_timeout: float
    chunk_bytes: int
    json_path: str | None


def main(ns: argparse.Namespace) -> int:
    world, nodes = ns.nproc, ns.emulated_nodes
    if nodes < 2 or world % nodes or world // nodes < 2:
        print(
            f"smddp-bench model --calibrate: need at least 2 emulated nodes of at least 2 ranks "
            f"(got --nproc {world} --emulated-nodes {nodes})"
        )
        return 2
    if ns.iters < 2:
        print("smddp-bench model --calibrate: -n must be at least 2")
        return 2
    try:
        sizes = tuple(parse_size_list(ns.calibrate_sizes))
        chunk = parse_size(ns.chunk or os.environ.get("SMDDP_CHUNK_BYTES") or "1M")
    except ValueError as e:
        print(f"smddp-bench model --calibrate: {e}")
        return 2
    settings = CalibrationSettings(sizes, ns.iters, 2, 120.0, chunk, ns.json)
    rpn = world // nodes
    print(
        f"# smddp-bench model --calibrate: {world} ranks = {nodes} emulated nodes x {rpn}, smddp, "
        f"sizes {', '.join(format_size(s) for s in sizes)}",
        flush=True,
    )
    return launch.spawn(
        run_rank,
        world,
        (settings,),
        {"SMDDP_RANKS_PER_NODE": str(rpn)},
        ns.timeout,
        what="smddp-bench model --calibrate",
    )


def run_rank(
    settings: CalibrationSettings, rank: int, world: int, init_method: str, local_rank: int
) -> int:
    import torch
    import torch.distributed as dist

    import smddp  # noqa: F401  (registers the backend)

    torch.set_num_threads(1)  # as in smddp.bench.sweep: no spinning OpenMP workers
    timeout = datetime.timedelta(seconds=settings.pg_timeout)
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timeout
    )
    try:
        rpn = int(os.environ["SMDDP_RANKS_PER_NODE"])
        pairs = {"shm": [0, 1], "socket": [0, rpn]}
        groups = {
            name: dist.new_group(ranks, backend="smddp", timeout=timeout)
            for name, ranks in pairs.items()
        }
        whole = dist.new_group(backend="smddp", timeout=timeout)
        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

        def timed(fn: Callable[[], Any] | None, restore: Callable[[], Any] | None = None) -> float:
            local = []
            for _ in range(settings.warmup + settings.iters):
                if restore is not None:
                    restore()
                dist.barrier()
                t0 = time.perf_counter()
                if fn is not None:
                    fn()
                local.append(time.perf_counter() - t0)
            first = settings.warmup
            t = torch.tensor(local[first:], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return statistics.median(t.tolist())

        pair: dict[str, list[tuple[int, float]]] = {name: [] for name in pairs}
        for name, ranks in pairs.items():
            for size in settings.sizes:
                c = max(1, size // (2 * _ELEM))
                inp = torch.ones(c)
                out = torch.empty(2 * c)
                fn = partial(all_gather, out, inp, group=groups[name]) if rank in ranks else None
                pair[name].append((c * _ELEM, timed(fn)))  # one step of S/2 bytes

        measured: list[tuple[str, int, float]] = []
        for op in _model.MODEL_OPS:
            for size in settings.sizes:
                geom = _ops.geometry(op, size, _ELEM, world)
                if geom is None:
                    continue
                inp = torch.ones(geom.in_numel)
                out = torch.empty(geom.out_numel)
                restore = None
                if op == "all_gather":
                    fn = partial(all_gather, out, inp, group=whole)
                elif op == "reduce_scatter":
                    fn = partial(reduce_scatter, out, inp, group=whole)
                else:
                    fn = partial(dist.all_reduce, inp, group=whole)
                    restore = partial(inp.fill_, 1.0)
                measured.append((op, geom.size, timed(fn, restore)))
        if rank == 0:
            _report(settings, world, rpn, pair, measured)
        dist.barrier()
        return 0
    finally:
        dist.destroy_process_group()


def _report(
    settings: CalibrationSettings,
    world: int,
    rpn: int,
    pair: dict[str, list[tuple[int, float]]],
    measured: list[tuple[str, int, float]],
) -> None:
    fits: dict[str, tuple[float, float]] = {}
    for name, samples in pair.items():
        fits[name] = _model.fit_alpha_beta([b for b, _ in samples], [t for _, t in samples])
    label = {
        "shm": "shared memory (ranks 0 and 1, one node)",
        "socket": f"sockets (ranks 0 and {rpn}, two nodes)",
    }

    def gbs(beta: float) -> float:
        return beta / 1e9 if math.isfinite(beta) else 1e6

    print(
        "#\n# fit of time = alpha + bytes/beta, AllGather between two ranks "
        "(one step of size/2 bytes):"
    )
    for name, (alpha, beta) in fits.items():
        worst = max(abs(alpha + b / beta - t) / t for b, t in pair[name])
        print(
            f"#   {label[name]:<42} alpha {alpha * 1e6:8.1f} us   beta {gbs(beta):8.3f} GB/s"
            f"   (worst fit error {worst * 100:.0f}%)"
        )
    print(f"#\n# {'step bytes':>10} {'shm (us)':>10} {'fit':>10} {'socket (us)':>12} {'fit':>10}")
    for (b, t_shm), (_, t_sock) in zip(pair["shm"], pair["socket"]):
        a1, b1 = fits["shm"]
        a2, b2 = fits["socket"]
        print(
            f"  {b:>10} {t_shm * 1e6:>10.1f} {(a1 + b / b1) * 1e6:>10.1f} {t_sock * 1e6:>12.1f}"
            f" {(a2 + b / b2) * 1e6:>10.1f}"
        )

    (a_shm, b_shm), (a_sock, b_sock) = fits["shm"], fits["socket"]
    machine = _model.Machine(
        name="this host, calibrated (a rank stands for a GPU)",
        gpus_per_node=rpn,
        nvlink_gbs=gbs(b_shm),
        nics=rpn,
        nic_gbps=gbs(b_sock) * 8,
        net_efficiency=1.0,
        alpha_intra_us=a_shm * 1e6,
        alpha_inter_us=a_sock * 1e6,
        ring_channels=rpn,
        chunk_bytes=settings.chunk_bytes,
    )
    nodes = world // rpn
    print(f"#\n# the model with these constants against smddp on {nodes} nodes x {rpn} ranks:")
    print(_model.describe(machine))
    columns = "# {:>15} {:>8} {:>13} {:>16} {:>7} {:>20}"
    print(
        columns.format(
            "op", "size", "measured(us)", "smddp model(us)", "error", "flat ring model(us)"
        )
    )
    rows = []
    for op, size, t in measured:
        e = _model.estimate(op, size, nodes, machine)
        err = (e.hier_s - t) / t
        rows.append(
            {
                "op": op,
                "size_bytes": size,
                "measured_s": t,
                "model_smddp_s": e.hier_s,
                "model_ring_s": e.ring_s,
            }
        )
        print(
            f"  {op:>15} {format_size(size):>8} {t * 1e6:>13.1f} {e.hier_s * 1e6:>16.1f} "
            f"{err * 100:>6.0f}% {e.ring_s * 1e6:>20.1f}"
        )
    print(
        "# error = (model - measured) / measured; the ranks share this host's cores, "
        "which the model does not know",
        flush=True,
    )
    if settings.json_path:
        import json

        os.makedirs(os.path.dirname(os.path.abspath(settings.json_path)), exist_ok=True)
        with open(settings.json_path, "w") as f:
            json.dump(
                {
                    "schema": "smddp-bench-calibration/1",
                    "fits": {
                        k: {"alpha_s": a, "beta_bytes_per_s": (b if math.isfinite(b) else None)}
                        for k, (a, b) in fits.items()
                    },
                    "pair_samples": {
                        k: [{"step_bytes": b, "seconds": t} for b, t in v] for k, v in pair.items()
                    },
                    "machine": asdict(machine),
                    "comparison": rows,
                },
                f,
                indent=1,
            )
            f.write("\n")
        print(f"# written: {settings.json_path}", flush=True)
