"""How every benchmark here times a collective: one function, two policies.

``back-to-back``: a block's calls run back to back after one barrier, as
nccl-tests times them; a sample is the block's time per call (a barrier before
every call would add its exit skew to every small message). ``barrier-each``:
a barrier before every call, a sample per call, from the barrier's return to
the call's end; for implementations whose calls can take seconds when ranks
outnumber cores, and for kernels timed one by one. Either way a sample is the
slowest rank's, a point's time is the median of its samples, and the footers
of the tables state the policy (``Timing.describe``). bench/README.md ("How
it measures") says why the blocks alternate, warm up, and end with a check.

Torch-free: the ranks reach each other through a ``Comm``.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol, Sequence

from smddp.bench.units import at_least, positive

BACK_TO_BACK, BARRIER_EACH = "back-to-back", "barrier-each"
POLICIES = (BACK_TO_BACK, BARRIER_EACH)
# How long a block must last for its time per call to be trusted as the
# estimate that sizes the measured blocks (back to back, with a time budget):
# a barrier's exit skew would otherwise pass for the cost of a small call.
CALIBRATE_S = 0.02
Clock = Callable[[], Callable[[], float]]  # stop = clock() starts it; stop() -> seconds


class Comm(Protocol):
    """The ranks of one measurement. ``max_each``: element-wise maximum over
    ranks; ``agree``: None if no rank failed, else the first failing rank's
    error; both the same on every rank."""

    rank: int
    world: int

    def barrier(self) -> None: ...
    def max_each(self, values: list[float]) -> list[float]: ...
    def sum_int(self, value: int) -> int: ...
    def agree(self, error: str | None) -> str | None: ...


class Case(Protocol):
    """One point's buffers and the collective under test; ``restore`` puts an
    in-place input back, ``wrong`` counts this rank's wrong output elements."""

    def run(self) -> Any: ...
    def restore(self) -> None: ...
    def poison(self) -> None: ...
    def wrong(self) -> int: ...


class LocalComm:
    """One process: kernels on one device, and tests."""

    rank, world = 0, 1

    def barrier(self) -> None:
        pass

    def max_each(self, values: list[float]) -> list[float]:
        return list(values)

    def sum_int(self, value: int) -> int:
        return value

    def agree(self, error: str | None) -> str | None:
        return None if error is None else f"rank 0: {error}"


@dataclass(frozen=True)
class Timing:
    """How many calls, in which blocks, under which policy."""

    policy: str = BACK_TO_BACK
    warmup: int = 2  # calls per backend and point before any is timed
    block_warmup: int = 3  # untimed calls at the start of every timed block
    iters: int | None = None  # timed calls per backend and point; None: time_per_point
    time_per_point: float = 0.3  # seconds of timed calls per backend and point
    min_iters: int = 5
    max_iters: int = 20000
    rounds: int = 4  # blocks each backend's calls are split into
    cap: float | None = None  # seconds one backend's point may take (fewer calls past it)

    def describe(self) -> str:
        """The sentence the headers and footers of the tables state."""
        calls = f"{self.iters} timed calls" if self.iters else f"{self.time_per_point:g} s of calls"
        cap = f" (at most {self.cap:g} s per point)" if self.cap else ""
        bw = self.block_warmup
        if self.policy == BACK_TO_BACK:
            how = (f"each after {f'{bw} untimed calls and ' if bw else ''}one barrier, the calls "
                   "back to back; time = median over blocks of the slowest rank's time per call")
        else:
            how = (f"each {f'after {bw} untimed calls ' if bw else ''}with a barrier before every call; time = "
                   "median over calls of the slowest rank's time from the barrier's return to the call's end")
        return (f"timing {self.policy}: per backend and size {self.warmup} warm-up calls, then {calls}{cap} in "
                f"{self.rounds} block{'s' if self.rounds != 1 else ''} that alternate between the backends, {how}")


# The command-line option of each field of Timing: flags, type, help. Every
# command offers the ones it lets users change, with its own defaults.
OPTIONS: dict[str, tuple[tuple[str, ...], Any, str]] = {
    "policy": (("--timing",), str, "back-to-back: each block's calls after one barrier (nccl-tests); "
               "barrier-each: a barrier before every call, each call a sample"),
    "warmup": (("-w", "--warmup"), at_least(0), "warm-up calls per backend and point"),
    "block_warmup": (("--block-warmup",), at_least(0), "untimed calls at the start of every timed block, so "
                     "that neither backend's time includes re-warming what the other's block evicted; they come "
                     "on top of --time-per-point (0: none, a block's first calls are timed)"),
    "iters": (("-n", "--iters"), at_least(1), "timed calls per backend and point"),
    "time_per_point": (("--time-per-point",), positive, "seconds of timed calls per backend and point"),
    "min_iters": (("--min-iters",), at_least(1), "with a time budget: at least this many calls"),
    "max_iters": (("--max-iters",), at_least(1), "with a time budget: at most this many calls"),
    "rounds": (("--rounds",), at_least(1), "blocks each backend's calls are split into, alternating between backends"),
    "cap": (("--point-cap",), positive, "seconds a point may take: fewer calls past it; the larger sizes of its "
            "table are skipped once one call exceeds it, or would exceed twice it"),
}  # fmt: skip


def add_options(group: Any, default: Timing, fields: Sequence[str]) -> None:
    """The options of ``fields`` on an argparse parser or group, defaults from
    ``default``; -n and --time-per-point exclude each other."""
    both = {"iters", "time_per_point"} <= set(fields)
    either = group.add_mutually_exclusive_group() if both else group
    for name in fields:
        flags, kind, text = OPTIONS[name]
        where = either if name in ("iters", "time_per_point") else group
        where.add_argument(*flags, dest=name, type=kind, default=getattr(default, name), help=text,
                           **({"choices": POLICIES} if name == "policy" else {}))  # fmt: skip


def from_options(ns: Any, default: Timing, parser: Any) -> Timing:
    """``default`` with the fields the options of ``ns`` give."""
    t = replace(default, **{k: getattr(ns, k) for k in OPTIONS if k in vars(ns)})
    if t.min_iters > t.max_iters:
        parser.error("--min-iters is above --max-iters")
    return t


def host_clock(sync: Callable[[], None] | None = None) -> Clock:
    """The host's clock; ``sync`` (waiting for a device's queued work) before it stops."""

    def start() -> Callable[[], float]:
        t0 = time.perf_counter()
        return lambda: (sync and sync(), time.perf_counter() - t0)[1]

    return start


def time_calls(call: Callable[[], Any], comm: Comm, k: int, policy: str = BACK_TO_BACK,
               restore: Callable[[], None] | None = None, untimed: int = 0, sync: Callable[[], None] | None = None,
               clock: Clock | None = None) -> tuple[list[float], float]:  # fmt: skip
    """``untimed`` calls, then ``k`` timed ones under ``policy``; returns the
    samples (the slowest rank's: one per block back to back, one per call with
    a barrier each) and the block's wall time (slowest rank)."""
    clock, each = clock or host_clock(sync), policy == BARRIER_EACH
    begin = time.perf_counter()
    for _ in range(untimed):
        call()
    local: list[float] = []
    for _ in range(k if each else 1):
        if restore is not None:
            restore()
        if sync is not None:
            sync()
        comm.barrier()
        stop = clock()
        for _ in range(1 if each else k):
            call()
        local.append(stop() / (1 if each else max(1, k)))
    local.append(time.perf_counter() - begin)
    values = comm.max_each(local) if k else local
    return (values[:-1] if k else []), values[-1]


@dataclass
class Result:
    """One backend at one point."""

    status: str = "ok"  # few: the cap left fewer than min_iters; slow: one call exceeded it; error
    samples: list[float] = field(default_factory=list)
    warm: list[float] = field(default_factory=list)
    iters: int = 0
    wrong: int = 0
    error: str = ""


def measure(cases: dict[str, Case], comm: Comm, t: Timing, sync: Callable[[], None] | None = None,
            clock: Clock | None = None) -> dict[str, Result]:  # fmt: skip
    """Times every case of one point: warm-up calls, then ``t.rounds`` checked
    blocks per case, the cases' blocks in ABBA order. A failure in any rank
    takes that case out of the point on every rank alike (``comm.agree``) and
    is its result's ``error``."""
    res = {name: Result() for name in cases}

    def attempt(name: str, fn: Callable[[], Any]) -> Any:
        error, out = None, None
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 - reported in the table, never swallowed
            error = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        if (why := comm.agree(error)) is not None:
            res[name].status, res[name].error, out = "error", why, None
        return out

    def block(name: str, k: int, untimed: int = 0) -> tuple[list[float], float]:
        return time_calls(cases[name].run, comm, k, t.policy, cases[name].restore, untimed, sync, clock)

    def checked(name: str, k: int) -> tuple[list[float], int]:
        """A timed block, then one call on restored inputs into a poisoned output."""
        c = cases[name]
        times = block(name, k, t.block_warmup)[0] if k else []
        c.poison()
        c.restore()
        c.run()
        if sync is not None:
            sync()
        return times, c.wrong()

    def plan(name: str) -> int:
        """The warm-up; returns how many calls to time."""
        r, spent = res[name], 0.0
        for _ in range(t.warmup if t.iters else max(1, t.warmup)):
            if (out := attempt(name, lambda: block(name, 1))) is None:
                return 0
            r.warm, spent = r.warm + out[0], spent + out[1]
            if t.cap and r.warm[-1] > t.cap:
                # One call is all the cap allows: it is checked, and it is the number.
                r.status, r.samples, r.warm, r.iters = "slow", r.warm[-1:], r.warm[:-1], 1
                r.wrong = (attempt(name, lambda: checked(name, 0)) or (0, 0))[1]
                return 0
            if t.cap and spent + r.warm[-1] > t.cap / 2:
                break
        if t.iters:
            return t.iters
        # The first call may pay for set-up (mappings, page faults).
        est, k, wall = statistics.median(r.warm[1:] or r.warm), 1, 0.0
        while (t.policy == BACK_TO_BACK and wall < CALIBRATE_S and k < t.max_iters
               and not (t.cap and spent + 4 * k * est > t.cap / 2)):  # fmt: skip
            k = min(t.max_iters, k * 4)
            if (out := attempt(name, lambda: block(name, k))) is None:
                return 0
            est, wall, spent = out[0][0], out[1], spent + out[1]
        n = min(t.max_iters, max(t.min_iters, math.ceil(t.time_per_point / max(est, 1e-9))))
        room = (t.cap or math.inf) - spent
        if n * est > room:
            n = max(1, int(max(0.0, room) / est))
            r.status = "few" if n < t.min_iters else r.status
        return n

    n = {name: plan(name) for name in cases}
    rounds = min(t.rounds, max(n.values(), default=0))
    for i in range(rounds):
        for name in list(cases)[:: 1 if i % 2 == 0 else -1]:
            # Exactly n[name] calls in all, spread as evenly as the rounds allow.
            k = n[name] // rounds + (1 if i < n[name] % rounds else 0)
            if k and res[name].status != "error":
                if (out := attempt(name, lambda: checked(name, k))) is not None:
                    r = res[name]
                    r.samples, r.wrong, r.iters = r.samples + out[0], r.wrong + out[1], r.iters + k
    for r in res.values():
        if r.status != "error":
            r.wrong = comm.sum_int(r.wrong)
    return res
