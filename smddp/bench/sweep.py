"""The rank side of smddp-bench: one sweep, every backend interleaved.

Each rank joins a gloo process group (the control group: barriers and the
exchange of timings) and creates one more group per benchmarked backend over
all ranks. For every (op, dtype, size) the buffers are allocated once and
shared by the backends; the backends then take turns in short blocks of
iterations (ABBA order), so that a machine that slows down or speeds up during
the run affects them alike. A block runs its iterations back to back after a
barrier on the control group (as nccl-tests does); its time per iteration is
the slowest rank's, and reported times are the median over blocks. Each
block starts with untimed calls (block_warmup): on a virtual machine the
first calls after the rival's block re-fault page tables and caches that the
rival evicted, a cost that would fall on whichever backend is faster. After
every block one more call, on freshly restored inputs into a poisoned output,
is checked against the expected value (smddp.bench.ops), so a backend that
writes nothing cannot pass.
"""

from __future__ import annotations

import datetime
import math
import os
import socket
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

from smddp.bench import ops as _ops
from smddp.bench.units import format_size


@dataclass
class SweepSettings:
    """Everything a rank needs to run a sweep (picklable: sent to spawned ranks)."""

    ops: tuple[str, ...] = _ops.DEFAULT_OPS
    dtypes: tuple[str, ...] = ("float32",)
    sizes: tuple[int, ...] = (4096,)
    redop: str = "sum"
    root: int = 0
    inplace: bool = False  # AllGather/ReduceScatter in place (nccl-tests' in-place columns)
    backends: tuple[str, ...] = ("smddp", "gloo")
    device: str = "cpu"
    warmup: int = 2
    block_warmup: int = 3  # untimed calls at the start of every measured block
    iters: int | None = None  # fixed count per backend and point; None: time budget
    time_per_point: float = 0.3  # seconds per backend and point
    min_iters: int = 5
    max_iters: int = 20000
    rounds: int = 8
    pg_timeout: float = 120.0
    json_path: str | None = None
    plot_path: str | None = None
    progress: bool = True
    launcher: str = "spawn"
    argv: list[str] = field(default_factory=list)


@dataclass
class Topology:
    world: int
    nodes: int
    ranks_per_node: int
    emulated: bool
    hosts: int

    def label(self) -> str:
        nodes = f"{self.nodes} node" + ("s" if self.nodes != 1 else "")
        shape = f"{self.world} ranks = {nodes} x {self.ranks_per_node}"
        return shape + (" (emulated nodes)" if self.emulated else "")


# How long a block must last for its time per iteration to be trusted as the
# estimate that sizes the measured blocks.
CALIBRATE_S = 0.02


def _reduce_op(name: str) -> Any:
    return {
        "sum": dist.ReduceOp.SUM,
        "prod": dist.ReduceOp.PRODUCT,
        "min": dist.ReduceOp.MIN,
        "max": dist.ReduceOp.MAX,
        "avg": dist.ReduceOp.AVG,
    }[name]


# torch >= 2.14 deprecates the *_tensor names in favour of *_single.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def detect_topology(world: int, ctrl: Any) -> Topology:
    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname(), group=ctrl)
    nhosts = len(set(hosts))
    rpn = int(os.environ.get("SMDDP_RANKS_PER_NODE") or 0)
    if rpn > 0:
        nodes = math.ceil(world / rpn)
        return Topology(world, nodes, min(rpn, world), nodes > nhosts, nhosts)
    return Topology(world, nhosts, world // nhosts, False, nhosts)


class _Point:
    """The buffers of one (op, dtype, size), shared by every backend."""

    def __init__(
        self,
        op: str,
        dtype: str,
        geom: _ops.Geometry,
        redop: str,
        root: int,
        rank: int,
        world: int,
        device: torch.device,
        inplace: bool = False,
    ):
        self.op, self.dtype, self.geom = op, dtype, geom
        self.redop = redop if _ops.OPS[op].reduces else "none"
        self.root = root
        self.device = device
        tdtype = getattr(torch, dtype)
        floating = _ops.DTYPES[dtype][1]
        self.poison_value = float("nan") if floating else torch.iinfo(tdtype).min
        check_redop = redop if _ops.OPS[op].reduces else "sum"

        def tensor(values: Any) -> torch.Tensor:
            return torch.from_numpy(values).to(dtype=tdtype, device=device)

        inp = _ops.rank_input(op, check_redop, rank, geom, root)
        self.expected = tensor(_ops.expected_output(op, check_redop, rank, world, geom, root))
        self.restore: Callable[[], None] | None = None
        if op == "all_gather" and inplace:
            # The input is this rank's block of the output; the poison before
            # every check covers it too, so restore puts it back.
            self.out = torch.empty(geom.out_numel, dtype=tdtype, device=device)
            self.inp = self.out.narrow(0, rank * geom.in_numel, geom.in_numel)
            self.pristine = tensor(inp)
            self.restore = lambda: self.inp.copy_(self.pristine)
        elif op == "all_gather":
            self.inp = tensor(inp)
            self.out = torch.empty(geom.out_numel, dtype=tdtype, device=device)
        elif op == "reduce_scatter" and inplace:
            # The output is this rank's block of the input, which each call
            # overwrites: every block starts again from the pristine input.
            self.pristine = tensor(inp)
            self.inp = self.pristine.clone()
            self.out = self.inp.narrow(0, rank * geom.out_numel, geom.out_numel)
            self.restore = lambda: self.inp.copy_(self.pristine)
        elif op == "reduce_scatter":
            self.inp = tensor(inp)
            self.out = torch.empty(geom.out_numel, dtype=tdtype, device=device)
        elif op == "all_reduce":
            # In place: every iteration starts again from the pristine input.
            self.pristine = tensor(inp)
            self.out = torch.empty_like(self.pristine)
            self.restore = lambda: self.out.copy_(self.pristine)
        elif op == "broadcast":
            self.out = (
                tensor(inp)
                if inp is not None
                else torch.empty(geom.out_numel, dtype=tdtype, device=device)
            )
        self.receiver = not (op == "broadcast" and rank == root)
        self.tolerance = 0.0
        if floating and _ops.OPS[op].reduces and redop in ("sum", "avg"):
            # Exact for the small integers of the inputs, except AVG's division
            # and sums over many ranks in the narrow dtypes.
            self.tolerance = 4 * _ops.EPS[dtype]

    def call(self, group: Any, redop: Any) -> Callable[[], None]:
        if self.op == "all_gather":
            return lambda: _all_gather(self.out, self.inp, group=group)
        if self.op == "reduce_scatter":
            return lambda: _reduce_scatter(self.out, self.inp, op=redop, group=group)
        if self.op == "all_reduce":
            return lambda: dist.all_reduce(self.out, op=redop, group=group)
        return lambda: dist.broadcast(self.out, src=self.root, group=group)

    def poison(self) -> None:
        if self.receiver:
            self.out.fill_(self.poison_value)

    def wrong(self) -> int:
        if self.tolerance:
            wide = torch.float64 if self.dtype == "float64" else torch.float32
            ok = torch.isclose(
                self.out.to(wide), self.expected.to(wide), rtol=self.tolerance, atol=0.0
            )
            return int((~ok).sum())
        return int((self.out != self.expected).sum())


class Sweep:
    """One rank's part of a sweep; rank 0 also prints and keeps the records."""

    def __init__(
        self,
        settings: SweepSettings,
        rank: int,
        world: int,
        ctrl: Any,
        groups: dict[str, Any],
        device: torch.device,
        topology: Topology,
    ):
        self.s = settings
        self.rank, self.world = rank, world
        self.ctrl, self.groups = ctrl, groups
        self.device = device
        self.topology = topology
        self.cuda = device.type == "cuda"
        self.dead: dict[str, str] = {}  # backend -> why it is out for the rest of the run
        self.out = sys.stdout

    # -- timing ---------------------------------------------------------
    def _block(
        self,
        fn: Callable[[], None],
        k: int,
        restore: Callable[[], None] | None,
        untimed: int = 0,
    ) -> tuple[list[float], float]:
        """k iterations back to back after one barrier, as nccl-tests times
        them (a barrier before every iteration would add its exit skew to
        every small message), after `untimed` calls that are not timed;
        returns the block's time per iteration (the slowest rank's) and the
        block's wall time on this rank."""
        start = time.perf_counter()
        for _ in range(untimed):
            fn()
        if restore is not None:
            restore()
        if self.cuda:
            torch.cuda.synchronize()
        dist.barrier(group=self.ctrl)
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        if self.cuda:
            torch.cuda.synchronize()
        per_iter = (time.perf_counter() - t0) / max(1, k)
        wall = time.perf_counter() - start
        times = torch.tensor([per_iter, wall], dtype=torch.float64)
        if k:
            dist.all_reduce(times, op=dist.ReduceOp.MAX, group=self.ctrl)
        values = times.tolist()
        return values[:1] if k else [], values[-1]

    def _agree(self, error: BaseException | None) -> str | None:
        """Whether any rank failed; every rank gets the same answer."""
        flag = torch.tensor([1 if error is not None else 0], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.ctrl)
        if not int(flag.item()):
            return None
        messages: list[Any] = [None] * self.world
        mine = None
        if error is not None:
            first = str(error).strip().splitlines()
            mine = f"{type(error).__name__}: {first[0] if first else ''}"
        dist.all_gather_object(messages, mine, group=self.ctrl)
        for r, m in enumerate(messages):
            if m:
                return f"rank {r}: {m}"
        return "failed"

    def _sum(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.ctrl)
        return int(t.item())

    # -- one point ------------------------------------------------------
    def measure(
        self, op: str, dtype: str, nbytes: int, skip: dict[str, str]
    ) -> dict[str, Any] | None:
        elem = _ops.DTYPES[dtype][0]
        geom = _ops.geometry(op, nbytes, elem, self.world)
        if geom is None:
            return None
        point = _Point(
            op,
            dtype,
            geom,
            self.s.redop,
            self.s.root,
            self.rank,
            self.world,
            self.device,
            self.s.inplace,
        )
        redop = _reduce_op(self.s.redop)
        active = [b for b in self.s.backends if b not in skip and b not in self.dead]
        calls = {b: point.call(self.groups[b], redop) for b in active}
        warm: dict[str, list[float]] = {b: [] for b in active}
        samples: dict[str, list[float]] = {b: [] for b in active}
        wrong = {b: 0 for b in active}
        errors: dict[str, str] = {}
        estimate: dict[str, float] = {}

        def attempt(b: str, fn: Callable[[], Any]) -> Any:
            error: BaseException | None = None
            result = None
            try:
                result = fn()
            except Exception as e:  # noqa: BLE001 - reported in the table, never swallowed
                error = e
            reason = self._agree(error)
            if reason is not None:
                errors[b] = reason
                # Decided from the agreed text, so that every rank decides alike:
                # a communication failure may leave the group unusable.
                if any(
                    word in reason
                    for word in ("DistBackendError", "DistNetworkError", "DistError", "imeout")
                ):
                    self.dead[b] = reason
            return result

        warmup = self.s.warmup if self.s.iters is not None else max(1, self.s.warmup)
        for b in list(active):
            r = attempt(b, lambda b=b: self._block(calls[b], warmup, point.restore))
            if b in errors:
                active.remove(b)
                continue
            warm[b], wall = r
            estimate[b] = wall / max(1, warmup)
            if self.s.iters is None:
                # The warm-up's wall time holds a control-group barrier, whose
                # exit skew (up to a millisecond) would pass for the cost of a
                # small collective and leave too few iterations to amortize it:
                # time longer blocks until one lasts CALIBRATE_S.
                k = max(1, warmup)
                while wall < CALIBRATE_S and k < self.s.max_iters:
                    k = min(self.s.max_iters, k * 4)
                    r = attempt(b, lambda b=b, k=k: self._block(calls[b], k, point.restore))
                    if b in errors:
                        break
                    per_iter, wall = r
                    estimate[b] = per_iter[0] if per_iter else wall / k
            if b in errors:
                active.remove(b)
        iters: dict[str, int] = {}
        for b in active:
            if self.s.iters is not None:
                iters[b] = self.s.iters
            else:
                n = math.ceil(self.s.time_per_point / max(estimate[b], 1e-9))
                iters[b] = min(self.s.max_iters, max(self.s.min_iters, n))
        rounds = min(self.s.rounds, max(iters.values(), default=0))
        for r in range(rounds):
            order = active if r % 2 == 0 else active[::-1]
            for b in list(order):
                if b in errors:
                    continue
                # Exactly iters[b] in all, spread as evenly as the rounds allow.
                k = iters[b] // rounds + (1 if r < iters[b] % rounds else 0)
                if k == 0:
                    continue

                def run_block(b: str = b, k: int = k) -> tuple[list[float], int]:
                    times, _ = self._block(calls[b], k, point.restore, self.s.block_warmup)
                    # In-place ops drift over a block: check one fresh call.
                    point.poison()
                    if point.restore is not None:
                        point.restore()
                    calls[b]()
                    if self.cuda:
                        torch.cuda.synchronize()
                    return times, point.wrong()

                res = attempt(b, run_block)
                if b in errors:
                    continue
                times, bad = res
                samples[b].extend(times)
                wrong[b] += bad
        for b in active:
            if b not in errors:
                wrong[b] = self._sum(wrong[b])
        for b, why in errors.items():
            skip.setdefault(b, why)
        if self.rank != 0:
            return None
        row: dict[str, Any] = {
            "op": op,
            "dtype": dtype,
            "redop": point.redop,
            "requested_bytes": nbytes,
            "size_bytes": geom.size,
            "count": geom.count,
            "world": self.world,
            "backends": {},
        }
        for b in self.s.backends:
            rec: dict[str, Any] = {"backend": b}
            if b in samples and b not in errors and samples[b]:
                med = statistics.median(samples[b])
                rec.update(
                    iters=len(samples[b]),
                    time_us=med * 1e6,
                    time_min_us=min(samples[b]) * 1e6,
                    time_max_us=max(samples[b]) * 1e6,
                    algbw_gbs=_ops.algbw_gbs(geom.size, med),
                    busbw_gbs=_ops.busbw_gbs(op, geom.size, med, self.world),
                    wrong=wrong[b],
                    samples_us=[t * 1e6 for t in samples[b]],
                    warmup_us=[t * 1e6 for t in warm[b]],
                    error=None,
                )
            else:
                rec.update(error=errors.get(b) or skip.get(b) or self.dead.get(b) or "not run")
            row["backends"][b] = rec
        return row

    # -- the sweep --------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        from smddp.bench import report

        s = self.s
        total = len(s.ops) * len(s.dtypes) * len(s.sizes)
        done = 0
        started = time.monotonic()
        bar = None
        tqdm = _tqdm() if self.rank == 0 else None
        if tqdm is not None:
            # tqdm's default lock is a multiprocessing semaphore, which a rank
            # that leaves with os._exit would leak.
            tqdm.set_lock(threading.RLock())
        rows: list[dict[str, Any]] = []
        try:
            for op in s.ops:
                for dtype in s.dtypes:
                    skip: dict[str, str] = {}
                    table: list[dict[str, Any]] = []
                    redop = s.redop if _ops.OPS[op].reduces else "none"
                    self._print(
                        report.table_header(
                            op,
                            dtype,
                            redop,
                            s.backends,
                            self.topology,
                            self.device.type,
                            s.inplace,
                        )
                    )
                    for nbytes in s.sizes:
                        # Created late, so that short sweeps never show a bar
                        # (tqdm's own delay does not survive tqdm.write).
                        if (
                            bar is None
                            and tqdm is not None
                            and s.progress
                            and time.monotonic() - started > 2.0
                        ):
                            bar = tqdm(
                                total=total,
                                initial=done,
                                file=sys.stderr,
                                unit="point",
                                leave=False,
                                dynamic_ncols=True,
                                disable=None,
                            )
                        if bar is not None:
                            bar.set_description(
                                f"{op} {dtype} {format_size(nbytes)}", refresh=False
                            )
                        row = self.measure(op, dtype, nbytes, skip)
                        if row is not None:
                            table.append(row)
                            self._print(report.table_row(row, s.backends))
                        elif self.rank == 0:
                            self._print(
                                f"# {nbytes} B: less than one {dtype} element per rank, skipped"
                            )
                        done += 1
                        if bar is not None:
                            bar.update(1)
                    if self.rank == 0:
                        self._print(report.table_footer(table, s.backends))
                    rows.extend(table)
        finally:
            if bar is not None:
                bar.close()
        return rows

    def _print(self, text: str) -> None:
        if self.rank != 0 or not text:
            return
        tqdm = _tqdm()
        if tqdm is None:
            print(text, file=self.out)
        else:
            tqdm.write(text, file=self.out)
        self.out.flush()


def _tqdm() -> Any:
    """tqdm's class, or None without tqdm (no progress bar then)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


def _new_group(name: str, timeout: Any) -> Any:
    """The group of one backend column; "smddp:ring" is smddp with SMDDP_ALGO=ring
    (a group reads the SMDDP_* variables when it is created)."""
    base, _, algo = name.partition(":")
    if not algo:
        return dist.new_group(backend=base, timeout=timeout)
    saved = os.environ.get("SMDDP_ALGO")
    os.environ["SMDDP_ALGO"] = algo
    try:
        return dist.new_group(backend=base, timeout=timeout)
    finally:
        if saved is None:
            del os.environ["SMDDP_ALGO"]
        else:
            os.environ["SMDDP_ALGO"] = saved


def run_rank(
    settings: SweepSettings, rank: int, world: int, init_method: str, local_rank: int
) -> int:
    """Joins the process group, runs the sweep, and (rank 0) writes the files.

    Returns the process exit status: 0, or 3 when a result was wrong.
    """
    import smddp  # noqa: F401  (registers the backend)

    from smddp.bench import report

    timeout = datetime.timedelta(seconds=settings.pg_timeout)
    device = torch.device("cpu")
    # The collectives do not use torch's thread pool; the untimed fills and
    # checks would, and its idle OpenMP workers spin on cores the next timed
    # iteration needs.
    torch.set_num_threads(1)
    if settings.device == "cuda":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    started = time.time()
    load_start = report.load_average()
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timeout
    )
    try:
        ctrl = dist.group.WORLD
        groups = {b: _new_group(b, timeout) for b in settings.backends}
        topology = detect_topology(world, ctrl)
        sweep = Sweep(settings, rank, world, ctrl, groups, device, topology)
        rows = sweep.run()
        status = 0
        if rank == 0:
            elapsed = time.time() - started
            record = report.build_record(
                settings, topology, device.type, rows, started, elapsed, load_start
            )
            status = 3 if record["summary"]["wrong"] else 0
            sweep._print(report.run_footer(record))
            if settings.json_path:
                report.write_json(record, settings.json_path)
                sweep._print(f"# results: {settings.json_path}")
            if settings.plot_path:
                if report.write_plot(record, settings.plot_path):
                    sweep._print(f"# plot:    {settings.plot_path}")
                else:
                    sweep._print("# plot:    skipped, matplotlib is not installed (pip install matplotlib)")
        flag = torch.tensor([status], dtype=torch.int64)
        dist.broadcast(flag, src=0, group=ctrl)
        return int(flag.item())
    finally:
        dist.destroy_process_group()
