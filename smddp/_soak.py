"""A long random mix of collectives, every result checked.

Every rank draws the same sequence of operations from a seeded generator
(collective, size, dtype, reduce op, root, sub-group, async or not, how many
in flight), fills its inputs from (operation index, rank), and checks each
output against the value computed locally from everybody's inputs: exact for
integers and MIN/MAX, within the dtype's tolerance otherwise.

Used by bench/soak.py (the long run) and tests/test_soak.py (a short one).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.uint8]
SIZES = [0, 1, 3, 17, 255, 1024, 4097, 65537, 1 << 18]
TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 2e-2, torch.float16: 2e-3}


@dataclass
class SoakResult:
    ops: int
    mismatches: int
    seconds: float
    first_mismatch: str


def _fill(op_index: int, rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(op_index * 1009 + rank)
    if dtype.is_floating_point:
        return (torch.rand(n, generator=g, dtype=torch.float64) + 0.5).to(dtype)
    hi = 4 if dtype == torch.uint8 else 1000
    return torch.randint(0, hi, (n,), generator=g).to(dtype)


def _reduce(ts: list[torch.Tensor], op: str, dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        x = torch.stack([t.double() for t in ts])
    else:
        x = torch.stack([t.long() for t in ts])
    if op == "SUM":
        r = x.sum(0)
    elif op == "AVG":
        r = x.mean(0)
    elif op == "MIN":
        r = x.min(0).values
    else:
        r = x.max(0).values
    if not dtype.is_floating_point:
        r = r.to(dtype)  # wraps like the collective
    return r


def _matches(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    if not dtype.is_floating_point:
        return torch.equal(got, want.to(dtype))
    if got.numel() == 0:
        return True
    err = (got.double() - want.double()).abs().max().item()
    return err <= TOL[dtype] * max(1.0, want.double().abs().max().item())


def run_soak(num_ops: int, seed: int = 0) -> SoakResult:
    """Runs `num_ops` random collectives on the default group and sub-groups."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rng = random.Random(seed)
    # Sub-groups made once (collective): the halves, and an odd subset.
    groups = [(None, list(range(world)))]
    for ranks in ([r for r in range(world) if r % 2 == 0], list(range(world))[::-1][: max(1, world - 1)]):
        ranks = sorted(ranks)
        groups.append((dist.new_group(ranks=ranks, backend="smddp"), ranks))
    mismatches = 0
    first = ""
    t0 = time.time()
    pending = []

    def settle() -> None:
        nonlocal mismatches, first
        for work, check in pending:
            if work is not None:
                work.wait()
            ok, what = check()
            if not ok:
                mismatches += 1
                first = first or what
        pending.clear()

    for i in range(num_ops):
        kind = rng.choice(["all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier"])
        dtype = rng.choice(DTYPES)
        n = rng.choice(SIZES)
        op = rng.choice(["SUM", "MIN", "MAX"] + (["AVG"] if dtype.is_floating_point else []))
        group, members = rng.choice(groups)
        async_op = rng.random() < 0.5
        root = rng.choice(members)
        in_flight = rng.randint(1, 8)
        # Every draw happens on every rank, members or not: same sequence.
        if rank not in members:
            continue
        gw = len(members)
        me = members.index(rank)
        what = f"op {i}: {kind} {dtype} n={n} {op} group={members}"
        if kind == "all_reduce":
            t = _fill(i, rank, n, dtype)
            want = _reduce([_fill(i, r, n, dtype) for r in members], op, dtype)
            w = dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group, async_op=async_op)
            pending.append((w, lambda t=t, want=want, what=what, dtype=dtype: (_matches(t, want, dtype), what)))
        elif kind == "all_gather":
            t = _fill(i, rank, n, dtype)
            out = torch.empty(n * gw, dtype=dtype)
            want = torch.cat([_fill(i, r, n, dtype) for r in members])
            w = dist.all_gather_into_tensor(out, t, group=group, async_op=async_op)
            pending.append((w, lambda out=out, want=want, what=what: (torch.equal(out, want), what)))
        elif kind == "reduce_scatter":
            t = _fill(i, rank, n * gw, dtype)
            out = torch.empty(n, dtype=dtype)
            full = _reduce([_fill(i, r, n * gw, dtype) for r in members], op, dtype)
            want = full[me * n:(me + 1) * n]
            w = dist.reduce_scatter_tensor(out, t, op=getattr(dist.ReduceOp, op), group=group, async_op=async_op)
            pending.append((w, lambda out=out, want=want, what=what, dtype=dtype: (_matches(out, want, dtype), what)))
        elif kind == "broadcast":
            t = _fill(i, rank, n, dtype)
            want = _fill(i, root, n, dtype)
            w = dist.broadcast(t, src=root, group=group, async_op=async_op)
            pending.append((w, lambda t=t, want=want, what=what: (torch.equal(t, want), what)))
        else:
            w = dist.barrier(group=group, async_op=async_op)
            pending.append((w, lambda what=what: (True, what)))
        # Several operations in flight at times, then everything settles.
        if not async_op or len(pending) >= in_flight:
            settle()
    settle()
    for group, _ in groups[1:]:
        dist.destroy_process_group(group)
    return SoakResult(num_ops, mismatches, time.time() - t0, first)
