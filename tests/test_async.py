"""async_op=True: a Work comes back at once and the collective progresses in
the background; futures chain the way DDP's communication hooks use them;
works complete in the order they were issued; wait(timeout) gives up with an
error that names the op.

The overlap is shown with a late rank: its peers' calls must return long
before it arrives, and their wait() must then last about as long as it is
late. Time bounds are loose (the host may be busy) but far apart: a blocking
call would take the whole delay.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from dist_harness import assert_no_failures

DELAY = 1.0  # how late the last rank joins, seconds
RETURNS_WITHIN = 0.3  # an async call must return sooner than this


def _setup() -> None:
    torch.set_num_threads(1)


def _ops(rank: int, world: int) -> dict[str, Callable[[], tuple[Any, Callable[[], str | None]]]]:
    """name -> a function that issues the op async and returns (work, check)."""

    def all_reduce() -> tuple[Any, Callable[[], str | None]]:
        t = torch.arange(1000, dtype=torch.float32) * (rank + 1)
        work = dist.all_reduce(t, async_op=True)
        want = torch.arange(1000, dtype=torch.float32) * (world * (world + 1) // 2)
        return work, lambda: None if torch.equal(t, want) else f"all_reduce got {t[:4].tolist()}..."

    def all_gather() -> tuple[Any, Callable[[], str | None]]:
        out = torch.full((7 * world,), -1, dtype=torch.int64)
        work = dist.all_gather_into_tensor(out, torch.full((7,), rank, dtype=torch.int64), async_op=True)
        want = torch.arange(world).repeat_interleave(7)
        return work, lambda: None if torch.equal(out, want) else f"all_gather got {out.tolist()}"

    def reduce_scatter() -> tuple[Any, Callable[[], str | None]]:
        out = torch.full((5,), -1.0, dtype=torch.float64)
        inp = torch.arange(5 * world, dtype=torch.float64) + rank
        work = dist.reduce_scatter_tensor(out, inp, async_op=True)
        want = (torch.arange(5 * world, dtype=torch.float64) * world + world * (world - 1) / 2)[rank * 5 : rank * 5 + 5]
        return work, lambda: None if torch.equal(out, want) else f"reduce_scatter got {out.tolist()}"

    def broadcast() -> tuple[Any, Callable[[], str | None]]:
        t = torch.full((9,), rank, dtype=torch.int32)
        work = dist.broadcast(t, src=world - 1, async_op=True)
        return work, lambda: None if t.tolist() == [world - 1] * 9 else f"broadcast got {t.tolist()}"

    def barrier() -> tuple[Any, Callable[[], str | None]]:
        return dist.barrier(async_op=True), lambda: None

    return {
        "all_reduce": all_reduce,
        "all_gather": all_gather,
        "reduce_scatter": reduce_scatter,
        "broadcast": broadcast,
        "barrier": barrier,
    }


def case_returns_before_late_rank(names: list[str]) -> dict:
    """The last rank joins DELAY late; the others time their call and their wait."""
    _setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    late = rank == world - 1
    out = {}
    for name in names:
        dist.barrier()  # a common start for every op
        if late:
            time.sleep(DELAY)
        t0 = time.monotonic()
        work, check = _ops(rank, world)[name]()
        t1 = time.monotonic()
        completed_early = work.is_completed()
        work.wait()
        t2 = time.monotonic()
        out[name] = {
            "call_s": t1 - t0,
            "completed_early": completed_early,
            "wait_s": t2 - t1,
            "completed_after": work.is_completed(),
            "error": check(),
        }
    return out


@pytest.mark.slow
@pytest.mark.timeout(90, func_only=True)
@pytest.mark.parametrize("world", [2, 3])
def test_async_returns_while_a_rank_is_late(pools, world: int) -> None:
    names = list(_ops(0, world))
    results = pools(world).run(case_returns_before_late_rank, names, timeout=60)
    for rank, res in enumerate(results):
        for name, r in res.items():
            assert r["error"] is None, f"rank {rank}: {name}: {r['error']}"
            assert r["completed_after"], f"rank {rank}: {name}: not completed after wait()"
            if rank == world - 1:
                continue  # the late rank finds everybody there
            assert r["call_s"] < RETURNS_WITHIN, f"rank {rank}: {name}: the async call blocked {r['call_s']:.2f} s"
            assert not r["completed_early"], f"rank {rank}: {name}: completed before the late rank joined"
            # Most of the delay is spent in wait(), none of it in the call.
            assert r["wait_s"] > DELAY * 0.5, f"rank {rank}: {name}: wait() took only {r['wait_s']:.2f} s"


def case_background_progress() -> dict:
    """Without wait(), an async op completes by itself while the caller computes."""
    _setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    if rank == world - 1:
        time.sleep(DELAY)
    t = torch.ones(4099) * rank
    work = dist.all_reduce(t, async_op=True)
    a = torch.randn(64, 64)
    deadline = time.monotonic() + 30
    computed = 0
    while not work.is_completed() and time.monotonic() < deadline:
        a = torch.tanh(a @ a)  # the caller's own work, meanwhile
        computed += 1
        time.sleep(0.005)
    done = work.is_completed()
    work.wait()
    return {"done_without_wait": done, "computed": computed, "ok": bool((t == world * (world - 1) / 2).all())}


@pytest.mark.timeout(60, func_only=True)
def test_async_progresses_without_wait(pools) -> None:
    results = pools(2).run(case_background_progress, timeout=45)
    for rank, r in enumerate(results):
        assert r["done_without_wait"], f"rank {rank}: the op did not complete until wait() was called"
        assert r["ok"], f"rank {rank}: wrong result"
    assert results[0]["computed"] > 0, "rank 0 had nothing to overlap: the op completed before the late rank came"


def case_futures() -> list[str]:
    _setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []

    # DDP's allreduce hook: all_reduce(...).get_future().then(divide by world).
    grad = torch.arange(6, dtype=torch.float32) + rank
    fut = dist.all_reduce(grad, async_op=True).get_future()
    averaged = fut.then(lambda f: f.value()[0].div_(world)).wait()
    want = torch.arange(6, dtype=torch.float32) + (world - 1) / 2
    if not torch.allclose(averaged, want):
        failures.append(f"DDP-style hook: got {averaged.tolist()}, expected {want.tolist()}")
    if averaged.data_ptr() != grad.data_ptr():
        failures.append("all_reduce's future does not hold the reduced tensor itself")

    # The future's value is the list of output tensors.
    out = torch.empty(3 * world)
    work = dist.all_gather_into_tensor(out, torch.full((3,), float(rank)), async_op=True)
    value = work.get_future().wait()
    if not (isinstance(value, list) and len(value) == 1 and value[0].data_ptr() == out.data_ptr()):
        failures.append(f"all_gather's future value is {type(value).__name__} {value!r:.100}, not [output]")
    elif value[0].tolist() != [float(r) for r in range(world) for _ in range(3)]:
        failures.append(f"all_gather's future value: {value[0].tolist()}")

    rs_out = torch.empty(2)
    work = dist.reduce_scatter_tensor(rs_out, torch.ones(2 * world) * (rank + 1), async_op=True)
    value = work.get_future().wait()
    if value[0].data_ptr() != rs_out.data_ptr() or value[0].tolist() != [world * (world + 1) / 2] * 2:
        failures.append(f"reduce_scatter's future value: {value[0].tolist()}")

    # Chains of several then()s and collect_all over several works.
    t1, t2 = torch.ones(5), torch.ones(7) * 2
    f1 = dist.all_reduce(t1, async_op=True).get_future()
    f2 = dist.all_reduce(t2, async_op=True).get_future()
    chained = f1.then(lambda f: f.value()[0] * 2).then(lambda f: f.value() + 1)
    both = torch.futures.collect_all([f1, f2]).wait()
    got = chained.wait()
    if got.tolist() != [2.0 * world + 1] * 5:
        failures.append(f"chained then(): {got.tolist()}")
    if [f.value()[0].tolist() for f in both] != [[float(world)] * 5, [2.0 * world] * 7]:
        failures.append("collect_all over two all_reduce futures gave wrong values")

    # The callback runs after completion even when registered late.
    t3 = torch.ones(3)
    w3 = dist.all_reduce(t3, async_op=True)
    w3.wait()
    seen: list[float] = []
    w3.get_future().add_done_callback(lambda f: seen.append(f.value()[0][0].item()))
    if seen != [float(world)]:
        failures.append(f"a done-callback added after completion saw {seen}")
    return failures


@pytest.mark.timeout(60, func_only=True)
@pytest.mark.parametrize("world", [2, 3])
def test_futures(pools, world: int) -> None:
    results = pools(world).run(case_futures, timeout=40)
    assert_no_failures(results)


def case_in_order() -> dict:
    """Many ops in flight (the last rank late), a synchronous one among them."""
    _setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    if rank == world - 1:
        time.sleep(DELAY / 2)
    finished: list[int] = []
    works, checks = [], []
    ops = _ops(rank, world)
    names = [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "all_reduce",
        "barrier",
        "all_gather",
        "reduce_scatter",
    ] * 2
    in_flight = 0
    for i, name in enumerate(names):
        if i == len(names) // 2:
            # Until the late rank comes, everything issued so far is pending.
            in_flight = sum(not w.is_completed() for w in works)
            # A synchronous call behind queued async ones: it must wait its turn.
            t = torch.ones(11) * rank
            dist.all_reduce(t)
            sync_ok = t.tolist() == [world * (world - 1) / 2] * 11
        work, check = ops[name]()
        work.get_future().add_done_callback(lambda f, i=i: finished.append(i))
        works.append(work)
        checks.append((name, check))
    for w in reversed(works):  # waiting out of order must not matter
        w.wait()
    errors = [f"op {i} ({name}): {c()}" for i, (name, c) in enumerate(checks) if c() is not None]
    return {"finished": finished, "errors": errors, "sync_ok": sync_ok, "in_flight": in_flight, "n": len(names)}


@pytest.mark.timeout(60, func_only=True)
@pytest.mark.parametrize("world", [2, 3])
def test_async_ops_complete_in_order(pools, world: int) -> None:
    results = pools(world).run(case_in_order, timeout=40)
    for rank, r in enumerate(results):
        assert not r["errors"], f"rank {rank}: " + "; ".join(r["errors"])
        assert r["sync_ok"], f"rank {rank}: the synchronous all_reduce among async ones was wrong"
        assert r["finished"] == list(range(r["n"])), f"rank {rank}: completion order {r['finished']}"
    assert results[0]["in_flight"] > 1, "the ops never overlapped: nothing was in flight at once"


def case_wait_timeout(rounds: int) -> list[dict]:
    _setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    # Several rounds: whether wait() finds the op still queued or already
    # running on the group's thread is a race, and both must honour the timeout.
    for _ in range(rounds):
        dist.barrier()
        if rank == world - 1:
            time.sleep(DELAY)
        t = torch.ones(8) * (rank + 1)
        work = dist.all_reduce(t, async_op=True)
        t0 = time.monotonic()
        try:
            work.wait(timeout=datetime.timedelta(seconds=0.2))
            early = {"error": None, "message": ""}
        except Exception as e:  # noqa: BLE001
            early = {"error": type(e).__name__, "runtime": isinstance(e, RuntimeError), "message": str(e)}
        early["seconds"] = time.monotonic() - t0
        # The op itself carries on: a plain wait() completes it.
        work.wait()
        ok = t.tolist() == [world * (world + 1) / 2] * 8
        after = torch.ones(3)
        dist.all_reduce(after)
        out.append({"early": early, "ok": ok, "after_ok": after.tolist() == [float(world)] * 3})
    return out


@pytest.mark.timeout(60, func_only=True)
def test_wait_timeout_names_the_op(pools) -> None:
    results = pools(2).run(case_wait_timeout, 4, timeout=40)
    for i, r in enumerate(results[0]):
        early = r["early"]
        assert early["error"] is not None, (
            f"round {i}: wait(timeout=0.2 s) returned after {early['seconds']:.2f} s without an error "
            f"although the peer was {DELAY} s late"
        )
        assert early["runtime"], f"round {i}: wait(timeout) raised {early['error']}, not a RuntimeError"
        assert "allreduce" in early["message"] or "all_reduce" in early["message"], early["message"]
        assert early["seconds"] < DELAY * 0.7, f"round {i}: wait(timeout=0.2 s) took {early['seconds']:.2f} s"
    for rank, rounds in enumerate(results):
        for i, r in enumerate(rounds):
            assert r["ok"], f"rank {rank}, round {i}: the op gave a wrong result after the timed-out wait"
            assert r["after_ok"], f"rank {rank}, round {i}: the group did not work after a timed-out wait"


def case_future_error() -> dict:
    """A failing op's future raises, and so do the futures chained on it."""
    _setup()
    rank = dist.get_rank()
    group = dist.new_group(backend="smddp")  # broken on purpose below
    t = torch.ones(4 + rank)
    fut = dist.all_reduce(t, group=group, async_op=True).get_future()
    chained = fut.then(lambda f: f.value()[0] * 2)
    out = {}
    for name, f in (("future", fut), ("chained", chained)):
        try:
            f.wait()
            out[name] = None
        except Exception as e:  # noqa: BLE001
            out[name] = str(e)
    t2 = torch.ones(2)
    dist.all_reduce(t2)  # the default group is not affected
    out["world_ok"] = t2.tolist() == [float(dist.get_world_size())] * 2
    return out


@pytest.mark.timeout(60, func_only=True)
def test_future_carries_the_error(pools) -> None:
    # The pool of test_errors' deliberate failures (quiet logs): this one
    # breaks a group of its own too.
    results = pools(3, SMDDP_LOG_LEVEL="off").run(case_future_error, timeout=40)
    for rank, r in enumerate(results):
        for name in ("future", "chained"):
            assert r[name] is not None, f"rank {rank}: the {name} of a failed all_reduce completed normally"
            assert "disagree" in r[name], f"rank {rank}: {name}: {r[name][:300]}"
        assert r["world_ok"], f"rank {rank}: the default group broke"


def case_collectives_inside_callbacks() -> list[str]:
    """A future's callback issues collectives and waits for them, as DDP's
    PowerSGD hook does: the callback runs on the thread that completed the
    future, and must not keep the next collective from running."""
    _setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []

    def then_all_reduce(f: Any) -> torch.Tensor:
        # PowerSGD: all_reduce(...).get_future().wait() inside a callback.
        inner = torch.full_like(f.value()[0], float(rank + 1))
        got = dist.all_reduce(inner, async_op=True).get_future().wait()[0]
        return f.value()[0] + got

    def two_deep(f: Any) -> torch.Tensor:
        inner = torch.full((3,), 1.0)
        nested = dist.all_reduce(inner, async_op=True).get_future().then(then_all_reduce)
        return nested.wait() + f.value()[0]

    t = torch.ones(4)
    got = dist.all_reduce(t, async_op=True).get_future().then(then_all_reduce).wait()
    want = world + world * (world + 1) / 2
    if got.tolist() != [want] * 4:
        failures.append(f"a callback that waits for an all_reduce: {got.tolist()}, want {[want] * 4}")

    t = torch.ones(3)
    got = dist.all_reduce(t, async_op=True).get_future().then(two_deep).wait()
    want = world + world * (world + 1) / 2 + world
    if got.tolist() != [want] * 3:
        failures.append(f"callbacks two deep: {got.tolist()}, want {[want] * 3}")

    # A callback that waits (through its Work) for a collective issued after
    # its own and queued behind it. The last rank comes late, so that on the
    # others the callback runs when the first collective completes.
    a, b = torch.ones(2), torch.full((2,), 2.0)
    if rank == world - 1:
        time.sleep(DELAY / 4)
    first = dist.all_reduce(a, async_op=True).get_future()
    second = dist.all_reduce(b, async_op=True)
    chained = first.then(lambda f: (second.wait(), f.value()[0])[1])
    chained.wait()
    if a.tolist() != [float(world)] * 2 or b.tolist() != [2.0 * world] * 2:
        failures.append(f"a callback waiting for a later work: {a.tolist()}, {b.tolist()}")

    # A chain: each callback waits, through a Work, for the next collective.
    xs = [torch.ones(k + 2) for k in range(3)]
    if rank == world - 1:
        time.sleep(DELAY / 4)
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    c1 = works[0].get_future().then(lambda f: (works[1].wait(), f.value()[0])[1])
    c2 = works[1].get_future().then(lambda f: (works[2].wait(), f.value()[0])[1])
    c1.wait()
    c2.wait()
    if any(x.tolist() != [float(world)] * (k + 2) for k, x in enumerate(xs)):
        failures.append(f"a chain of callbacks waiting for the next work: {[x.tolist() for x in xs]}")

    # A callback whose wait for a later collective gives up: the group goes
    # on. The last rank is late for the first and the middle one: elsewhere
    # the callback runs when the first completes, and gives up while the
    # middle one, queued ahead of the awaited one, waits for that rank.
    if rank == world - 1:
        time.sleep(DELAY / 4)
    first = dist.all_reduce(torch.ones(2), async_op=True)
    if rank == world - 1:
        time.sleep(DELAY / 4)
    middle = dist.all_reduce(torch.ones(2), async_op=True)
    second = dist.all_reduce(torch.ones(2), async_op=True)

    def impatient(f: Any) -> torch.Tensor:
        try:
            second.wait(datetime.timedelta(milliseconds=20))
        except Exception:  # noqa: BLE001 - giving up is the point
            pass
        return f.value()[0]

    first.get_future().then(impatient).wait()
    middle.wait()
    second.wait()

    # Collectives issued and waited for synchronously inside a callback.
    def sync_inside(f: Any) -> torch.Tensor:
        x = torch.ones(5)
        dist.all_reduce(x)
        dist.barrier()
        return f.value()[0] + x

    got = dist.all_reduce(torch.ones(5), async_op=True).get_future().then(sync_inside).wait()
    if got.tolist() != [2.0 * world] * 5:
        failures.append(f"synchronous collectives inside a callback: {got.tolist()}")

    # And the group still orders what follows.
    c = torch.ones(6) * rank
    dist.all_reduce(c)
    if c.tolist() != [world * (world - 1) / 2] * 6:
        failures.append(f"after the callbacks: {c.tolist()}")
    return failures


@pytest.mark.timeout(60, func_only=True)
@pytest.mark.parametrize("world", [2, 3])
def test_collectives_inside_callbacks(pools, world: int) -> None:
    results = pools(world).run(case_collectives_inside_callbacks, timeout=40)
    assert_no_failures(results)


def case_profiler_spans() -> dict:
    """Under torch.profiler: an async call behind a late rank, a second one
    queued behind it, each native op once, and one op the fallback serves."""
    _setup()
    from torch.profiler import ProfilerActivity, profile

    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        if rank == world - 1:
            time.sleep(DELAY)
        first = dist.all_reduce(torch.ones(1000), async_op=True)
        second = dist.all_reduce(torch.ones(3, 5), async_op=True)
        # Long enough for the group's thread to take the first call (wait()
        # would run a call that is still queued on this thread).
        time.sleep(DELAY / 2)
        first.wait()
        second.wait()
        errors = []
        for op in _ops(rank, world).values():
            work, check = op()
            work.wait()
            errors += [e for e in [check()] if e]
        dist.all_to_all_single(torch.empty(world), torch.arange(float(world)))
    events = [
        {"name": e.name, "start": e.time_range.start, "end": e.time_range.end, "thread": e.thread,
         "shapes": [list(s) for s in e.input_shapes]}
        for e in prof.events() if e.name.startswith(("smddp:", "gloo:", "c10d::allreduce_"))
    ]  # fmt: skip
    return {"events": events, "errors": errors}


@pytest.mark.timeout(60, func_only=True)
def test_profiler_shows_each_collective_where_it_runs(pools) -> None:
    results = pools(2).run(case_profiler_spans, timeout=45)
    for rank, r in enumerate(results):
        assert not r["errors"], f"rank {rank}: " + "; ".join(r["errors"])
        names = [e["name"] for e in r["events"]]
        for op in ("allreduce", "allgather_into_tensor", "reduce_scatter_tensor", "broadcast", "barrier"):
            assert f"smddp:{op}" in names, f"rank {rank}: no span smddp:{op} in {names}"
        # The fallback's op is the fallback's span alone.
        assert "gloo:all_to_all" in names and not any("all_to_all" in n for n in names if n.startswith("smddp:")), names
        spans = [e for e in r["events"] if e["name"] == "smddp:allreduce"]
        first, second = spans[0], spans[1]
        assert first["shapes"] == [[1000]] and second["shapes"] == [[3, 5]], [e["shapes"] for e in spans]
        # The second span opens when its run starts, after the first's end,
        # not when it was queued.
        assert second["start"] >= first["end"], f"rank {rank}: the queued call's span overlaps the first: {spans[:2]}"
    early = results[0]
    first = next(e for e in early["events"] if e["name"] == "smddp:allreduce")
    call = next(e for e in early["events"] if e["name"] == "c10d::allreduce_")
    # The async call ran on the group's thread, and its span there (the
    # profiler's state carried over) lasted until the late rank came; the
    # call itself returned at once.
    assert first["thread"] != call["thread"], "the async all_reduce's span is on the calling thread"
    assert first["end"] - first["start"] > DELAY * 0.5e6, f"span of {first['end'] - first['start']} us"
    assert call["end"] - call["start"] < RETURNS_WITHIN * 1e6
