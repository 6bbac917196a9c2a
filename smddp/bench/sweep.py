"""The rank side of smddp-bench: one sweep, every backend interleaved.

Each rank joins a gloo process group (the control group: barriers and the
exchange of timings) and creates one more group per benchmarked backend over
all ranks. For every (op, dtype, size) the buffers are allocated once and
shared by the backends, which ``timing.measure`` then times in alternating
blocks and checks after every block (smddp.bench.timing says how).
``TorchComm`` and ``Buffers`` are the torch side of every benchmark here.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import math
import os
import socket
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from smddp.bench import launch, plot, record, timing, views
from smddp.bench import ops as _ops
from smddp.bench.units import format_size


# What a sweep's record keeps of its settings (besides its timing and command).
SETTINGS = ("ops", "dtypes", "sizes", "redop", "root", "inplace", "backends", "device",
            "pg_timeout")  # fmt: skip


def detect_topology(world: int, ctrl: Any, launcher: str) -> dict[str, Any]:
    """The record's topology: world, nodes (emulated when SMDDP_RANKS_PER_NODE
    makes more than there are hosts), ranks per node, hosts, the label."""
    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname(), group=ctrl)
    nhosts = len(set(hosts))
    rpn = int(os.environ.get("SMDDP_RANKS_PER_NODE") or 0)
    nodes = math.ceil(world / rpn) if rpn > 0 else nhosts
    rpn = min(rpn, world) if rpn > 0 else world // nhosts
    emulated = nodes > nhosts
    label = (f"{world} ranks = {nodes} node{'s' if nodes != 1 else ''} x {rpn}"
             + (" (emulated nodes)" if emulated else ""))  # fmt: skip
    return {"world": world, "nodes": nodes, "ranks_per_node": rpn, "emulated": emulated,
            "hosts": nhosts, "rank_hosts": hosts, "label": label, "launcher": launcher}


class TorchComm:
    """``timing.Comm`` over torch.distributed: the barrier of the measured
    group (the control group unless given), timings reduced on the control
    group (gloo, CPU)."""

    def __init__(self, ctrl: Any = None, barrier: Callable[[], None] | None = None):
        self.ctrl = ctrl
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._barrier = barrier or (lambda: dist.barrier(group=ctrl))

    def barrier(self) -> None:
        self._barrier()

    def max_each(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.ctrl)
        return t.tolist()

    def sum_int(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.ctrl)
        return int(t.item())

    def agree(self, error: str | None) -> str | None:
        if not self.sum_int(1 if error is not None else 0):
            return None
        messages: list[Any] = [None] * self.world
        dist.all_gather_object(messages, error, group=self.ctrl)
        return next(f"rank {r}: {m}" for r, m in enumerate(messages) if m is not None)


REDUCE_OPS = {"sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX", "avg": "AVG"}
# torch >= 2.14 deprecates the *_tensor names in favour of *_single.
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Buffers:
    """The buffers of one (op, dtype, size), shared by every backend, filled
    and checked with smddp.bench.ops."""

    def __init__(self, op: str, dtype: str, geom: _ops.Geometry, redop: str, root: int,
                 rank: int, world: int, device: Any = "cpu", inplace: bool = False,
                 offset: int = 0):  # fmt: skip
        self.op, self.dtype, self.geom, self.root = op, dtype, geom, root
        self.redop = redop if _ops.OPS[op].reduces else "none"
        self.rank, self.world, self.offset = rank, world, offset
        tdtype = getattr(torch, dtype)
        self.poison_value = float("nan") if _ops.DTYPES[dtype][1] else torch.iinfo(tdtype).min
        values = _ops.rank_input(op, redop, rank, geom, root, dtype, offset)
        inp = None if values is None else torch.from_numpy(values).to(tdtype).to(device)
        empty = lambda n: torch.empty(n, dtype=tdtype, device=device)  # noqa: E731
        self.pristine = None
        if op == "all_gather" and inplace:
            # The input is this rank's block of the output; the poison before
            # every check covers it too, so restore puts it back.
            self.out = empty(geom.out_numel)
            self.inp = self.out.narrow(0, rank * geom.in_numel, geom.in_numel)
            self.pristine = inp
        elif op == "reduce_scatter" and inplace:
            # The output is this rank's block of the input, which each call
            # overwrites: every block starts again from the pristine input.
            self.pristine, self.inp = inp, inp.clone()
            self.out = self.inp.narrow(0, rank * geom.out_numel, geom.out_numel)
        elif op in ("all_gather", "reduce_scatter"):
            self.inp, self.out = inp, empty(geom.out_numel)
        elif op == "all_reduce":
            # In place: every block starts again from the pristine input.
            self.pristine, self.out = inp, empty(geom.out_numel)
            self.inp = self.out
        else:
            self.out = inp if inp is not None else empty(geom.out_numel)
            self.inp = self.out
        self.receiver = not (op == "broadcast" and rank == root)

    def call(self, group: Any, redop: str = "sum", async_op: bool = False,
             src: int | None = None) -> Callable[[], Any]:  # fmt: skip
        """The collective on these buffers; ``src``: the broadcast root as a
        global rank, where the group is not the world."""
        kw = {"group": group, "async_op": async_op}
        rop = getattr(dist.ReduceOp, REDUCE_OPS[redop])
        if self.op == "all_gather":
            return lambda: all_gather(self.out, self.inp, **kw)
        if self.op == "reduce_scatter":
            return lambda: reduce_scatter(self.out, self.inp, op=rop, **kw)
        if self.op == "all_reduce":
            return lambda: dist.all_reduce(self.out, op=rop, **kw)
        return lambda: dist.broadcast(self.out, src=self.root if src is None else src, **kw)

    def restore(self) -> None:
        if self.pristine is not None:
            self.inp.copy_(self.pristine)

    def poison(self) -> None:
        if self.receiver:
            self.out.fill_(self.poison_value)

    def wrong(self) -> int:
        out = self.out
        return _ops.count_wrong(
            self.op, self.redop, self.dtype, self.rank, self.world, self.geom, self.root,
            lambda a, b: out[a:b].to("cpu", torch.float64).numpy(), self.offset,
        )  # fmt: skip

    def case(self, fn: Callable[[], Any]) -> Any:
        """The ``timing.Case`` of one backend on these buffers."""
        return SimpleNamespace(run=fn, restore=self.restore, poison=self.poison, wrong=self.wrong)


# An error with these words may leave the group unusable: the backend is out
# for the rest of the run.
FATAL = ("DistBackendError", "DistNetworkError", "DistError", "imeout")


class Sweep:
    """One rank's part of a sweep; rank 0 also prints and keeps the records."""

    bar: Any = None  # rank 0's progress bar, once the sweep has run for a while

    def __init__(self, s: Any, comm: TorchComm, groups: dict[str, Any], device: torch.device,
                 topology: dict[str, Any], view: views.SweepView | None = None):  # fmt: skip
        self.s, self.comm, self.groups, self.view = s, comm, groups, view or views.SweepView()
        self.rank, self.world = comm.rank, comm.world
        self.device, self.topology = device, topology
        self.sync = torch.cuda.synchronize if device.type == "cuda" else None
        self.dead: dict[str, str] = {}  # backend -> why it is out for the rest of the run

    def measure(self, op: str, dtype: str, nbytes: int, skip: dict[str, str]) -> list | None:
        """Every backend at one point: the point records (rank 0), [] elsewhere,
        None when the size rounds to no element."""
        geom = _ops.geometry(op, nbytes, _ops.DTYPES[dtype][0], self.world)
        if geom is None:
            return None
        s = self.s
        buf = Buffers(op, dtype, geom, s.redop, s.root, self.rank, self.world, self.device,
                      s.inplace)  # fmt: skip
        active = [b for b in s.backends if b not in skip and b not in self.dead]
        cases = {b: buf.case(buf.call(self.groups[b], s.redop)) for b in active}
        results = timing.measure(cases, self.comm, s.timing, self.sync)
        for b, r in results.items():
            if r.status == "error":
                skip.setdefault(b, r.error)
                if any(word in r.error for word in FATAL):
                    self.dead[b] = r.error
        if self.rank != 0:
            return []
        return [
            record.point(b, op, dtype, buf.redop, self.world, nbytes, results.get(b),
                         *(() if b in results else ("skipped", skip.get(b) or self.dead[b])))
            for b in s.backends
        ]  # fmt: skip

    def run(self) -> list[dict[str, Any]]:
        s = self.s
        total, done, started = len(s.ops) * len(s.dtypes) * len(s.sizes), 0, time.monotonic()
        tqdm = _tqdm() if self.rank == 0 and not s.no_progress else None
        results: list[dict[str, Any]] = []
        try:
            for op, dtype in itertools.product(s.ops, s.dtypes):
                redop = s.redop if _ops.OPS[op].reduces else "none"
                self.print(self.view.sweep_header(op, dtype, redop, s.backends, self.topology["label"],
                                                  self.device.type, s.inplace))  # fmt: skip
                skip: dict[str, str] = {}
                table: list[dict[str, Any]] = []
                for nbytes in s.sizes:
                    # Created late, so that short sweeps never show a bar.
                    if self.bar is None and tqdm is not None and time.monotonic() - started > 2:
                        # tqdm's default lock is a multiprocessing semaphore, which a
                        # rank that leaves with os._exit would leak.
                        tqdm.set_lock(threading.RLock())
                        self.bar = tqdm(total=total, initial=done, file=sys.stderr, unit="point", leave=False,
                                        dynamic_ncols=True, disable=None)  # fmt: skip
                    if self.bar is not None:
                        self.bar.set_description(f"{op} {dtype} {format_size(nbytes)}", False)
                    recs = self.measure(op, dtype, nbytes, skip)
                    if recs:
                        table += recs
                        self.print(self.view.sweep_row(recs, s.backends))
                    elif recs is None:
                        self.print(f"# {nbytes} B: less than one {dtype} element per rank, skipped")
                    done += 1
                    if self.bar is not None:
                        self.bar.update(1)
                self.print(self.view.sweep_footer(table, s.backends))
                results += table
        finally:
            if self.bar is not None:
                self.bar.close()
                self.bar = None
        return results

    def print(self, text: str) -> None:
        if self.rank != 0 or not text:
            return
        if self.bar is None:
            print(text, flush=True)
        else:
            self.bar.write(text, file=sys.stdout)
            sys.stdout.flush()


def _tqdm() -> Any:
    """tqdm's class, or None without tqdm (no progress bar then)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


# smddp:ring, smddp:hierarchical: smddp with SMDDP_ALGO set for that group;
# smddp:zero-copy, smddp:staged: with SMDDP_CUDA_ZERO_COPY on or off; so that
# schedules and paths are compared interleaved in one run.
SMDDP_VARIANTS = {"auto": {"SMDDP_ALGO": "auto"}, "ring": {"SMDDP_ALGO": "ring"},
                  "hierarchical": {"SMDDP_ALGO": "hierarchical"}, "zero-copy": {"SMDDP_CUDA_ZERO_COPY": "1"},
                  "staged": {"SMDDP_CUDA_ZERO_COPY": "0"}}  # fmt: skip


def new_group(name: str, timeout: Any) -> Any:
    """The group of one backend column; "smddp:ring" is smddp with SMDDP_ALGO=ring
    (a group reads the SMDDP_* variables when it is created)."""
    base, _, variant = name.partition(":")
    with launch.environ(SMDDP_VARIANTS[variant] if variant else {}):
        return dist.new_group(backend=base, timeout=timeout)


@contextlib.contextmanager
def process_group(rank: int, world: int, init_method: str, timeout_s: float,
                  backend: str = "gloo") -> Iterator[datetime.timedelta]:  # fmt: skip
    """This process as rank ``rank`` of a process group (the control group of
    every benchmark here: gloo), destroyed on the way out; yields the timeout."""
    import smddp  # noqa: F401  (registers the backend)

    # The collectives do not use torch's thread pool; the untimed fills and
    # checks would, and its idle OpenMP workers spin on cores the next timed
    # call needs.
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=timeout)  # fmt: skip
    try:
        yield timeout
    finally:
        dist.destroy_process_group()


def run_rank(settings: Any, rank: int, world: int, init_method: str,
             local_rank: int) -> int:  # fmt: skip
    """Joins the process group, runs the sweep, and (rank 0) writes the files.
    Returns the process exit status: 0, or 3 when a result was wrong."""
    s = settings
    device = torch.device("cpu")
    if s.device == "cuda":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    rec = record.new("sweep", s.argv, {k: getattr(s, k) for k in SETTINGS}, s.timing)
    started = time.monotonic()
    with process_group(rank, world, init_method, s.pg_timeout) as timeout:
        comm = TorchComm(dist.group.WORLD)
        groups = {b: new_group(b, timeout) for b in s.backends}
        topo = detect_topology(world, comm.ctrl, s.launcher)
        view = views.SweepView()
        if s.launcher == "smddp-cluster":  # each rank's NIC; the links' limit in the tables
            from smddp.bench import cluster_run

            view = cluster_run.on_cluster(s, groups, comm)
            topo["facts"] = s.facts
        sweep = Sweep(s, comm, groups, device, topo, view)
        results = sweep.run()
        status = 0
        if rank == 0:
            rec["machine"].update(device=device.type, gpus=[torch.cuda.get_device_name(i) for i in
                                  range(torch.cuda.device_count())] if s.device == "cuda" else [])
            rec.update(config=record.smddp_config(), topology=topo, elapsed_s=round(time.monotonic() - started, 1),
                       results=results, summary=views.sweep_summary(results, s.backends))  # fmt: skip
            status = launch.EXIT_WRONG if rec["summary"]["wrong"] else 0
            sweep.print(views.run_footer(rec))
            if s.json:
                record.write(rec, s.json)
                sweep.print(f"# results: {s.json}")
            if s.plot:
                title = (f"smddp-bench: {' vs '.join(s.backends)}, busbw (median)"
                         f"{', AllGather/ReduceScatter in place' if s.inplace else ''}\n"
                         f"{topo['label']}, {device.type}, {socket.gethostname()}")  # fmt: skip
                written = plot.busbw(results, ("op", "dtype"),
                                     lambda k: f"{_ops.OPS[k[0]].title}, {k[1]}", s.plot, title)
                sweep.print(f"# plot:    {s.plot}" if written else
                            "# plot:    skipped, matplotlib is not installed")  # fmt: skip
        flag = torch.tensor([status], dtype=torch.int64)
        dist.broadcast(flag, src=0, group=comm.ctrl)
        return int(flag.item())
