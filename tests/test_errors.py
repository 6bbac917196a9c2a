"""Bad input gets a clear exception, never a hang and never garbage.

Two kinds of mistakes, two contracts:

- what the calling rank can see by itself (wrong output size, input/output
  dtype mismatch, an output whose elements share memory, a reduce op not
  defined on the dtype)
  raises from the call itself, naming the op and the rank, and the group
  keeps working;
- what only the group can see (ranks that disagree on size, dtype, reduce op,
  root or collective, a dead or silent peer) raises DistBackendError from
  wait() on every rank within seconds, naming the disagreement; the group is
  then unusable by design and every later call fails fast with that first
  error.

Deliberate group failures run on fresh groups made with new_group in a pool
of their own, and each rank catches its exception and returns the message:
the pool survives, and one pool serves many scenarios.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from dist_harness import RankPool, assert_no_failures, spawn_ranks

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# A disagreement must surface in this long at most (the group's timeout is 60 s).
PROMPT_S = 5.0


def _setup() -> None:
    torch.set_num_threads(1)


def _outcome(fn: Callable[[], Any]) -> dict:
    """Runs fn; returns what it raised (type, message) and how long it took."""
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the type is the point
        return {
            "error": type(e).__name__,
            "is_dist": isinstance(e, dist.DistBackendError),
            "message": str(e),
            "seconds": time.monotonic() - t0,
        }
    return {"error": None, "is_dist": False, "message": "", "seconds": time.monotonic() - t0}


def _check_allreduce(group: Any = None) -> str | None:
    """A correct all_reduce on ``group``: None if right, else what went wrong."""
    world = dist.get_world_size(group)
    x = torch.arange(5, dtype=torch.float32) + dist.get_rank(group)
    try:
        dist.all_reduce(x, group=group)
    except Exception as e:  # noqa: BLE001
        return f"raised {type(e).__name__}: {str(e)[:300]}"
    want = torch.arange(5, dtype=torch.float32) * world + world * (world - 1) / 2
    return None if torch.equal(x, want) else f"got {x.tolist()}, expected {want.tolist()}"


# ---------------------------------------------------------------- local errors


def _local_error_calls(world: int) -> list[tuple[str, str, Callable[[], Any]]]:
    """(what, name the message must contain, a call that must raise)."""
    f32, f64 = torch.float32, torch.float64
    o = dist.distributed_c10d

    def pg() -> Any:
        return dist.group.WORLD

    def rs_opts(op: Any = dist.ReduceOp.SUM) -> Any:
        opts = o.ReduceScatterOptions()
        opts.reduceOp = op
        return opts

    # An expand()ed view: its elements share memory, no collective can write it.
    shared = torch.zeros(1).expand(24)
    return [
        (
            "all_gather_into_tensor: output too small",
            "allgather_into_tensor",
            lambda: dist.all_gather_into_tensor(torch.empty(2 * world - 1), torch.ones(2), async_op=True),
        ),
        (
            "all_gather_into_tensor: output too large",
            "allgather_into_tensor",
            lambda: dist.all_gather_into_tensor(torch.empty(2 * world + 2), torch.ones(2), async_op=True),
        ),
        (
            "all_gather_into_tensor: dtype mismatch",
            "allgather_into_tensor",
            lambda: dist.all_gather_into_tensor(torch.empty(2 * world, dtype=f64), torch.ones(2), async_op=True),
        ),
        (
            "all_gather_into_tensor: output shares memory",
            "allgather_into_tensor",
            lambda: dist.all_gather_into_tensor(torch.zeros(1).expand(4 * world), torch.ones(4), async_op=True),
        ),
        (
            "all_gather list: own output of the wrong size",
            "allgather",
            lambda: dist.all_gather([torch.empty(3) for _ in range(world)], torch.ones(2), async_op=True),
        ),
        (
            "all_gather list: wrong length",
            "allgather",
            lambda: dist.all_gather([torch.empty(2) for _ in range(world + 1)], torch.ones(2), async_op=True),
        ),
        # Through the group object: dist.all_gather checks dtypes itself first.
        (
            "all_gather list: dtype mismatch",
            "allgather",
            lambda: pg().allgather(
                [[torch.empty(2, dtype=torch.int32) for _ in range(world)]], [torch.ones(2)], o.AllgatherOptions()
            ),
        ),
        (
            "reduce_scatter_tensor: input too small",
            "reduce_scatter_tensor",
            lambda: dist.reduce_scatter_tensor(torch.empty(3), torch.ones(3 * world - 1), async_op=True),
        ),
        (
            "reduce_scatter_tensor: dtype mismatch",
            "reduce_scatter_tensor",
            lambda: dist.reduce_scatter_tensor(
                torch.empty(3, dtype=f64), torch.ones(3 * world, dtype=f32), async_op=True
            ),
        ),
        (
            "reduce_scatter_tensor: output shares memory",
            "reduce_scatter_tensor",
            lambda: dist.reduce_scatter_tensor(torch.zeros(1).expand(2), torch.ones(2 * world), async_op=True),
        ),
        (
            "reduce_scatter list: output shares memory",
            "reduce_scatter",
            lambda: dist.reduce_scatter(torch.zeros(1).expand(2), [torch.ones(2)] * world, async_op=True),
        ),
        (
            "reduce_scatter list: own input of the wrong size",
            "reduce_scatter",
            lambda: dist.reduce_scatter(torch.empty(2), [torch.ones(3) for _ in range(world)], async_op=True),
        ),
        ("all_reduce: tensor shares memory", "allreduce", lambda: dist.all_reduce(shared, async_op=True)),
        ("broadcast: tensor shares memory", "broadcast", lambda: dist.broadcast(shared, src=0, async_op=True)),
        (
            "broadcast: root outside the group",
            "broadcast",
            lambda: dist.broadcast(torch.ones(2), src=world, async_op=True),
        ),
        (
            "all_reduce: AVG on int32",
            "allreduce",
            lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.AVG, async_op=True),
        ),
        (
            "all_reduce: PREMUL_SUM on int64",
            "allreduce",
            lambda: dist.all_reduce(
                torch.ones(3, dtype=torch.int64), op=dist._make_nccl_premul_sum(0.5), async_op=True
            ),
        ),
        (
            "reduce_scatter_tensor: AVG on bool",
            "reduce_scatter_tensor",
            lambda: dist.reduce_scatter_tensor(
                torch.empty(2, dtype=torch.bool),
                torch.ones(2 * world, dtype=torch.bool),
                op=dist.ReduceOp.AVG,
                async_op=True,
            ),
        ),
        (
            "allgather_into_tensor_coalesced: wrong output size",
            "allgather_into_tensor_coalesced",
            lambda: pg().allgather_into_tensor_coalesced(
                [torch.empty(2 * world), torch.empty(world)], [torch.ones(2), torch.ones(2)], o.AllgatherOptions()
            ),
        ),
        (
            "reduce_scatter_tensor_coalesced: wrong input size",
            "reduce_scatter_tensor_coalesced",
            lambda: pg().reduce_scatter_tensor_coalesced(
                [torch.empty(2), torch.empty(2)], [torch.ones(2 * world), torch.ones(world)], rs_opts()
            ),
        ),
        (
            "reduce_scatter_tensor_coalesced: dtype mismatch",
            "reduce_scatter_tensor_coalesced",
            lambda: pg().reduce_scatter_tensor_coalesced(
                [torch.empty(2, dtype=f64)], [torch.ones(2 * world)], rs_opts()
            ),
        ),
        (
            "all_reduce_coalesced: a tensor shares memory",
            "allreduce_coalesced",
            lambda: dist.all_reduce_coalesced([torch.ones(3), shared], async_op=True),
        ),
    ]


def case_local_errors() -> list[str]:
    """Every bad call raises on the spot, names op and rank; the group still works."""
    _setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []
    for what, op_name, call in _local_error_calls(world):
        r = _outcome(call)
        if r["error"] is None:
            failures.append(f"{what}: no error raised by the call")
        elif r["error"] not in ("RuntimeError", "ValueError") or r["is_dist"]:
            failures.append(f"{what}: raised {r['error']} (want RuntimeError or ValueError): {r['message'][:200]}")
        else:
            missing = [w for w in (op_name, f"rank {rank}") if w not in r["message"]]
            if missing:
                failures.append(f"{what}: the message does not name {missing}: {r['message'][:300]}")
        bad = _check_allreduce()
        if bad:
            failures.append(f"{what}: the group does not work afterwards: {bad}")
    return failures


@pytest.mark.timeout(90, func_only=True)
@pytest.mark.parametrize("world", [2, 3])
def test_local_argument_errors(pools, world: int) -> None:
    results = pools(world).run(case_local_errors, timeout=60)
    assert_no_failures(results)


# ---------------------------------------------------------------- disagreements

# A scenario is what each rank calls (by group rank) and the words the error
# must contain: both sides of the disagreement.


def _scenario_calls(name: str, rank: int, group: Any) -> list[Callable[[], Any]]:
    """The async calls rank ``rank`` makes in scenario ``name``, in order."""
    g = group
    w = dist.get_world_size(g)
    if name == "size":
        return [lambda: dist.all_reduce(torch.ones(8 + (rank == w - 1)), group=g, async_op=True)]
    if name == "dtype":
        dt = torch.float64 if rank == 1 else torch.float32
        return [lambda: dist.all_reduce(torch.ones(8, dtype=dt), group=g, async_op=True)]
    if name == "reduce_op":
        op = dist.ReduceOp.MAX if rank == 0 else dist.ReduceOp.SUM
        return [lambda: dist.all_reduce(torch.ones(8), op=op, group=g, async_op=True)]
    if name == "collective":
        if rank == 1:
            return [lambda: dist.all_gather_into_tensor(torch.empty(8 * w), torch.ones(8), group=g, async_op=True)]
        return [lambda: dist.all_reduce(torch.ones(8), group=g, async_op=True)]
    if name == "root":
        src = dist.get_global_rank(g, 0 if rank == 0 else 1)
        return [lambda: dist.broadcast(torch.ones(8), src=src, group=g, async_op=True)]
    if name == "allgather_size":
        n = 5 if rank == 0 else 4
        return [lambda: dist.all_gather_into_tensor(torch.empty(n * w), torch.ones(n), group=g, async_op=True)]
    if name == "reduce_scatter_size":
        n = 3 if rank == w - 1 else 4
        return [lambda: dist.reduce_scatter_tensor(torch.empty(n), torch.ones(n * w), group=g, async_op=True)]
    if name == "paths":
        # 600 KiB takes single-copy by default, 100 KiB the staged path: the
        # ranks would not even run the same protocol.
        n = (600 << 10) // 4 if rank == 0 else (100 << 10) // 4
        return [lambda: dist.all_reduce(torch.ones(n), group=g, async_op=True)]
    if name == "second_of_three":
        # The first call matches and must succeed; the second disagrees.
        return [
            lambda: dist.all_reduce(torch.ones(4), group=g, async_op=True),
            lambda: dist.all_reduce(torch.ones(4 if rank == 0 else 6), group=g, async_op=True),
            lambda: dist.all_reduce(torch.ones(4), group=g, async_op=True),
        ]
    raise KeyError(name)


# name -> words that must all appear in every rank's error (both sides).
SCENARIOS: dict[str, tuple[str, ...]] = {
    "size": ("disagree", "8 elements", "9 elements"),
    "dtype": ("disagree", "float32", "float64"),
    "reduce_op": ("disagree", "SUM", "MAX"),
    "collective": ("disagree", "allreduce", "allgather"),
    "root": ("disagree", "root 0", "root 1"),
    "allgather_size": ("disagree", "5 elements", "4 elements"),
    "reduce_scatter_size": ("disagree", "4 elements", "3 elements"),
    "paths": ("disagree",),
    "second_of_three": ("disagree", "4 elements", "6 elements"),
}


def case_disagreement(name: str, members: list[int] | None) -> dict:
    """Runs scenario ``name`` on a fresh smddp group; reports what each call did."""
    _setup()
    group = dist.new_group(ranks=members, backend="smddp")
    if members is not None and dist.get_rank() not in members:
        # Bystanders: the default group must be unaffected.
        return {"member": False, "after_world": _check_allreduce()}
    rank = dist.get_rank(group)
    works, issued = [], []
    for call in _scenario_calls(name, rank, group):
        issued.append(_outcome(lambda call=call: works.append(call())))
    waits = [_outcome(w.wait) for w in works]
    # The group is unusable now: a later call must fail fast, with the first error.
    later = _outcome(lambda: dist.all_reduce(torch.ones(8), group=group))
    after_world = _check_allreduce()
    return {"member": True, "issued": issued, "waits": waits, "later": later, "after_world": after_world}


def _check_disagreement(name: str, results: list[dict]) -> None:
    words = SCENARIOS[name]
    members = [(r, res) for r, res in enumerate(results) if res["member"]]
    assert members
    for rank, res in members:
        for i, call in enumerate(res["issued"]):
            # Nothing local is wrong: only the group can tell.
            assert call["error"] is None, f"{name}: rank {rank}: call {i} raised by itself: {call['message'][:300]}"
        waits = res["waits"]
        first_bad = 1 if name == "second_of_three" else 0
        if first_bad:
            assert waits[0]["error"] is None, f"{name}: rank {rank}: the matching first call failed: {waits[0]}"
        for w in waits[first_bad:]:
            assert w["is_dist"], (
                f"{name}: rank {rank}: wait() gave {w['error']!r}, want DistBackendError: {w['message'][:300]}"
            )
            assert w["seconds"] < PROMPT_S, f"{name}: rank {rank}: the error took {w['seconds']:.1f} s"
        err = waits[first_bad]["message"]
        missing = [word for word in words if word not in err]
        assert not missing, f"{name}: rank {rank}: the error does not name {missing}: {err[:500]}"
        later = res["later"]
        assert later["is_dist"], f"{name}: rank {rank}: a call after the failure gave {later['error']!r}"
        assert later["seconds"] < 1.0, f"{name}: rank {rank}: a call after the failure took {later['seconds']:.1f} s"
        assert "disagree" in later["message"], (
            f"{name}: rank {rank}: a call after the failure does not carry the first error: {later['message'][:300]}"
        )
    for rank, res in enumerate(results):
        assert res["after_world"] is None, f"{name}: rank {rank}: the default group broke too: {res['after_world']}"


@pytest.fixture(scope="module")
def failure_pool(pools) -> Any:
    # A pool of its own (the env makes the key unique): its groups fail on
    # purpose, and their error logs would only be noise.
    pool = pools(3, SMDDP_LOG_LEVEL="off")
    yield pool
    pool.close()


@pytest.mark.timeout(60, func_only=True)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_ranks_disagree(failure_pool, name: str) -> None:
    _check_disagreement(name, failure_pool.run(case_disagreement, name, None, timeout=40))


@pytest.mark.timeout(60, func_only=True)
def test_disagreement_in_subgroup(failure_pool) -> None:
    """A failing sub-group fails its members only; rank 1 looks on."""
    results = failure_pool.run(case_disagreement, "size", [0, 2], timeout=40)
    assert not results[1]["member"]
    _check_disagreement("size", results)


def case_config_disagreement(var: str, values: list[str | None]) -> dict:
    """new_group with SMDDP_* settings that differ between ranks (None: unset)."""
    _setup()
    old = os.environ.pop(var, None)
    value = values[dist.get_rank() % len(values)]
    if value is not None:
        os.environ[var] = value
    try:
        created = _outcome(lambda: dist.new_group(backend="smddp", timeout=datetime.timedelta(seconds=20)))
    finally:
        os.environ.pop(var, None)
        if old is not None:
            os.environ[var] = old
    return {"created": created, "after_world": _check_allreduce()}


@pytest.mark.timeout(60, func_only=True)
@pytest.mark.parametrize(
    "var, values",
    [("SMDDP_ALGO", ["ring", "auto", "auto"]), ("SMDDP_CHUNK_BYTES", ["64K", "64K", "128K"])],
)
def test_config_must_agree(failure_pool, var: str, values: list[str]) -> None:
    results = failure_pool.run(case_config_disagreement, var, values, timeout=40)
    for rank, res in enumerate(results):
        c = res["created"]
        assert c["error"] is not None, f"rank {rank}: a group with different {var} was created"
        assert var in c["message"], f"rank {rank}: the error does not name {var}: {c['message'][:300]}"
        assert c["seconds"] < PROMPT_S, f"rank {rank}: creation took {c['seconds']:.1f} s to fail"
        assert res["after_world"] is None, f"rank {rank}: the default group broke: {res['after_world']}"


def case_subgroup_bad_setting() -> dict:
    """new_group([1, 2]) with a bad SMDDP_CHUNK_BYTES on global rank 2."""
    _setup()
    old = os.environ.pop("SMDDP_CHUNK_BYTES", None)
    if dist.get_rank() == 2:
        os.environ["SMDDP_CHUNK_BYTES"] = "lots"
    try:
        created = _outcome(lambda: dist.new_group([1, 2], backend="smddp", timeout=datetime.timedelta(seconds=20)))
    finally:
        os.environ.pop("SMDDP_CHUNK_BYTES", None)
        if old is not None:
            os.environ["SMDDP_CHUNK_BYTES"] = old
    return created


@pytest.mark.timeout(90, func_only=True)
def test_a_subgroup_s_set_up_errors_name_global_ranks(failure_pool) -> None:
    """In a sub-group, a rank's place in it is not the rank a user knows:
    the errors name both, and the group."""
    results = failure_pool.run(case_subgroup_bad_setting, timeout=60)
    assert results[0]["error"] is None, results[0]
    for rank, place in ((1, 0), (2, 1)):
        c = results[rank]
        assert c["error"] == "ValueError", f"rank {rank}: {c}"
        prefix = f"ProcessGroupSMDDP (rank {place} (global rank {rank}) of 2, group '"
        assert c["message"].startswith(prefix), f"rank {rank}: {c['message'][:300]}"
    assert "rank 1 (global rank 2) could not set up the group: " in results[1]["message"], results[1]["message"][:400]


@pytest.mark.timeout(90, func_only=True)
@pytest.mark.parametrize(
    "var, value",
    [("SMDDP_CHUNK_BYTES", "lots"), ("SMDDP_SOCKET_IFNAME", "nosuchnic0")],
    ids=["bad-value", "no-such-nic"],
)
def test_one_rank_s_bad_setting_fails_every_rank_at_once(failure_pool, var: str, value: str) -> None:
    """A setting that is wrong on one rank only (a host whose NIC has another
    name): every rank's new_group fails at once, naming that rank and the
    variable, rather than waiting for it until the group's timeout."""
    results = failure_pool.run(case_config_disagreement, var, [None, None, value], timeout=60)
    for rank, res in enumerate(results):
        c = res["created"]
        assert c["error"] == "ValueError", f"rank {rank}: {c}"
        assert var in c["message"] and value in c["message"], f"rank {rank}: {c['message'][:400]}"
        if rank != 2:
            assert "rank 2" in c["message"], f"rank {rank}: {c['message'][:400]}"
        assert c["seconds"] < PROMPT_S, f"rank {rank}: creation took {c['seconds']:.1f} s to fail"
        assert res["after_world"] is None, f"rank {rank}: the default group broke: {res['after_world']}"


@pytest.mark.timeout(60, func_only=True)
def test_local_knobs_may_differ(failure_pool) -> None:
    """SMDDP_SPIN_US is not an 'agree' knob: ranks may set it differently."""
    results = failure_pool.run(case_config_disagreement, "SMDDP_SPIN_US", ["0", "20", "500"], timeout=40)
    for rank, res in enumerate(results):
        assert res["created"]["error"] is None, f"rank {rank}: {res['created']['message'][:300]}"


# ---------------------------------------------------------------- unsupported dtypes


# torch's names and c10's (what TORCH_CHECK prints).
_DTYPE_SPELLINGS = {
    "complex64": ("complex64", "ComplexFloat"),
    "int16": ("int16", "Short"),
    "uint16": ("uint16", "UInt16"),
    "uint32": ("uint32", "UInt32"),
}


def case_unsupported_dtypes() -> list[str]:
    """Reductions of dtypes smddp does not reduce: gloo's correct result, or a clear error."""
    _setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []
    for dtype in (torch.complex64, torch.int16, torch.uint16, torch.uint32):
        name = str(dtype).replace("torch.", "")
        for api in ("all_reduce", "reduce_scatter_tensor"):
            x = (torch.arange(6 * world) % 7 + rank).to(dtype)
            want = sum((torch.arange(6 * world) % 7 + r).to(torch.complex128) for r in range(world))
            out = torch.full((6 * world,) if api == "all_reduce" else (6,), 99).to(dtype)
            if api == "all_reduce":
                out.copy_(x)
                r = _outcome(lambda out=out: dist.all_reduce(out))
            else:
                want = want[rank * 6 : (rank + 1) * 6]
                r = _outcome(lambda out=out, x=x: dist.reduce_scatter_tensor(out, x))
            what = f"{api} {name} SUM"
            if r["error"] is None:
                got = out.to(torch.complex128)
                if not torch.equal(got, want):
                    failures.append(
                        f"{what}: served, but wrong: got {got.real.tolist()}, expected {want.real.tolist()}"
                    )
            elif not any(spelling in r["message"] for spelling in _DTYPE_SPELLINGS[name]):
                failures.append(f"{what}: raised {r['error']} without naming the dtype: {r['message'][:200]!r}")
            bad = _check_allreduce()
            if bad:
                failures.append(f"{what}: the group does not work afterwards: {bad}")
    return failures


@pytest.mark.timeout(60, func_only=True)
def test_unsupported_dtypes(failure_pool) -> None:
    results = failure_pool.run(case_unsupported_dtypes, timeout=40)
    assert_no_failures(results)


def case_no_fallback() -> dict:
    """A group made with SMDDP_FALLBACK=none (on every rank)."""
    _setup()
    world = dist.get_world_size()
    os.environ["SMDDP_FALLBACK"] = "none"
    try:
        group = dist.new_group(backend="smddp")
    finally:
        del os.environ["SMDDP_FALLBACK"]
    rank = dist.get_rank(group)
    delegated = _outcome(lambda: dist.all_to_all_single(torch.empty(world), torch.ones(world), group=group))
    return {"rank": rank, "delegated": delegated, "native": _check_allreduce(group)}


@pytest.mark.timeout(60, func_only=True)
def test_fallback_none(failure_pool) -> None:
    """SMDDP_FALLBACK=none: delegated calls raise a clear error, native ones work."""
    results = failure_pool.run(case_no_fallback, timeout=30)
    for res in results:
        rank, d = res["rank"], res["delegated"]
        assert d["error"] in ("RuntimeError", "ValueError"), f"rank {rank}: all_to_all_single gave {d}"
        for word in ("all_to_all", "SMDDP_FALLBACK", f"rank {rank}"):
            assert word in d["message"], f"rank {rank}: the error does not name {word!r}: {d['message'][:300]}"
        assert res["native"] is None, f"rank {rank}: {res['native']}"


# ---------------------------------------------------------------- dead and silent peers


def case_peer_dies(path: str) -> None:
    """Rank 2 exits mid-job; the others report how their next calls went (in files:
    the pool's reply channel fails with the dead rank)."""
    _setup()
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(4))
    if rank == 2:
        os._exit(3)
    first = _outcome(lambda: dist.all_reduce(torch.ones(4)))
    later = _outcome(lambda: dist.all_reduce(torch.ones(4)))
    with open(f"{path}.{rank}", "w") as f:
        json.dump({"first": first, "later": later}, f)


@pytest.mark.timeout(120, func_only=True)
def test_dead_peer_fails_every_survivor(tmp_path) -> None:
    path = str(tmp_path / "peer")
    pool = RankPool(3, env={"SMDDP_LOG_LEVEL": "off"}, pg_timeout=30)
    try:
        with pytest.raises(Exception, match="rank 2"):
            pool.run(case_peer_dies, path, timeout=60)
    finally:
        pool.close()
    for rank in (0, 1):
        with open(f"{path}.{rank}") as f:
            res = json.load(f)
        first = res["first"]
        assert first["is_dist"], f"rank {rank}: the call after the death gave {first}"
        # Well before the 30 s timeout: the death itself is noticed.
        assert first["seconds"] < PROMPT_S, f"rank {rank}: noticed the death after {first['seconds']:.1f} s"
        assert "rank 2" in first["message"], f"rank {rank}: the error does not name the dead rank: {first['message']}"
        assert res["later"]["is_dist"] and res["later"]["seconds"] < 1.0, f"rank {rank}: {res['later']}"


def case_silent_peer(timeout_s: float, delay: float) -> dict:
    """The last rank joins ``delay`` late on a group whose timeout is shorter."""
    _setup()
    group = dist.new_group(backend="smddp", timeout=datetime.timedelta(seconds=timeout_s))
    if dist.get_rank() == dist.get_world_size() - 1:
        time.sleep(delay)
    return _outcome(lambda: dist.all_reduce(torch.ones(4), group=group))


@pytest.mark.timeout(90, func_only=True)
def test_timeout_bounds_every_wait(failure_pool) -> None:
    """A rank that does not show up: the group's timeout ends the wait, and the
    latecomer hears of the failure at once instead of waiting its own timeout."""
    timeout_s, delay = 3.0, 6.0
    *waiters, late = failure_pool.run(case_silent_peer, timeout_s, delay, timeout=60)
    for rank, w in enumerate(waiters):
        assert w["is_dist"], f"rank {rank} gave {w}"
        assert timeout_s * 0.9 <= w["seconds"] <= timeout_s + PROMPT_S, f"rank {rank} waited {w['seconds']:.1f} s"
        assert "timed out" in w["message"] or "failed" in w["message"], w["message"]
    # The first to time out names whom it waited for.
    assert any("timed out" in w["message"] and f"rank {len(waiters)}" in w["message"] for w in waiters), waiters
    assert late["is_dist"], f"the late rank gave {late}"
    assert late["seconds"] < 1.5, f"the late rank took {late['seconds']:.1f} s to learn of the failure"


# ---------------------------------------------------------------- bad settings

_BAD_VALUES = [
    ("SMDDP_ALGO", "tree"),
    ("SMDDP_CHUNK_BYTES", "1K"),
    ("SMDDP_CHUNK_BYTES", "lots"),
    ("SMDDP_SHM", "maybe"),
    ("SMDDP_SINGLE_COPY", "yes"),
    ("SMDDP_PIPELINE", "always"),
    ("SMDDP_SOCKET_STREAMS", "0"),
    ("SMDDP_SOCKET_RCVBUF_BYTES", "2G"),
    ("SMDDP_RANKS_PER_NODE", "-1"),
    ("SMDDP_FALLBACK", "mpi"),
    ("SMDDP_SHM_SLOT_BYTES", "2G"),
    # Not an interface of this host (checked when the group is made), and
    # not even a list of names.
    ("SMDDP_SOCKET_IFNAME", "nosuchnic0"),
    ("SMDDP_SOCKET_IFNAME", "lo,,lo"),
]

_BAD_VALUE_SCRIPT = r"""
import datetime, json, os, sys, tempfile
import torch.distributed as dist
import smddp

out = []
for var, value in json.loads(sys.argv[1]):
    os.environ[var] = value
    fd, path = tempfile.mkstemp(prefix="smddp-test-init-")
    os.close(fd)
    os.unlink(path)
    try:
        dist.init_process_group("smddp", init_method="file://" + path, rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=20))
        out.append([var, value, None, ""])
        dist.destroy_process_group()
    except Exception as e:
        out.append([var, value, type(e).__name__, str(e)])
    del os.environ[var]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.timeout(90, func_only=True)
def test_bad_setting_is_a_value_error() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMDDP_")}
    proc = subprocess.run(
        [sys.executable, "-c", _BAD_VALUE_SCRIPT, json.dumps(_BAD_VALUES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=80,
        cwd=ROOT,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    for var, value, err, msg in json.loads(lines[-1][len("RESULT ") :]):
        assert err == "ValueError", f"{var}={value}: init_process_group gave {err}: {msg[:300]}"
        assert var in msg, f"{var}={value}: the error does not name the variable: {msg[:300]}"


@pytest.mark.timeout(60, func_only=True)
def test_unknown_interface_names_the_hosts_interfaces() -> None:
    """SMDDP_SOCKET_IFNAME naming no NIC of the host: the error lists the host's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMDDP_")}
    proc = subprocess.run(
        [sys.executable, "-c", _BAD_VALUE_SCRIPT, json.dumps([("SMDDP_SOCKET_IFNAME", "lo,nosuchnic0")])],
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
        cwd=ROOT,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    [(_, _, err, msg)] = json.loads(lines[-1][len("RESULT ") :])
    assert err == "ValueError", f"{err}: {msg[:300]}"
    for word in ("SMDDP_SOCKET_IFNAME='lo,nosuchnic0'", "'nosuchnic0'", "This host has: ", "lo 127.0.0.1"):
        assert word in msg, f"{word!r} is not in: {msg[:600]}"


@pytest.mark.timeout(30, func_only=True)
def test_config_check_names_the_variable(monkeypatch) -> None:
    """smddp.config.check() (no group needed) agrees with group creation."""
    import smddp

    monkeypatch.setenv("SMDDP_ALGO", "tree")
    with pytest.raises(ValueError, match="SMDDP_ALGO"):
        smddp.config.check()
    monkeypatch.setenv("SMDDP_ALGO", "ring")
    smddp.config.check()


def case_mismatch_under_torch_debug() -> str:
    """Ranks calling all_reduce on different shapes, with torch's own check on."""
    backend = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__
    try:
        dist.all_reduce(torch.ones(4 + dist.get_rank()))
        return f"{backend}: no error"
    except Exception as e:  # noqa: BLE001
        return f"{backend}: {e}"


@pytest.mark.timeout(120, func_only=True)
def test_torch_debug_detail_compares_calls_across_ranks() -> None:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL, which a timed-out CUDA rails collective
    points to (the rails compare calls inside a node, not across nodes),
    wraps smddp's groups and names a mismatch before the collective runs."""
    for text in spawn_ranks(case_mismatch_under_torch_debug, 2, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, timeout=90):
        assert text.startswith("_ProcessGroupWrapper: ") and "Detected mismatch between collectives" in text, text
