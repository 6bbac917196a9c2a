"""Checks every collective smddp runs natively against a reference.

    torchrun --nproc-per-node 4 examples/check_collectives.py
    SMDDP_SINGLE_COPY=off torchrun --nproc-per-node 3 examples/check_collectives.py --large

Every rank draws every rank's inputs from seeds, so each one can compute the
expected result by itself: in float64 for floating SUM, AVG, PRODUCT and
PREMUL_SUM (within the dtype's rounding), exactly for integers, bool and
MIN/MAX, byte for byte for the collectives that only move data. Outputs are
filled with wrong values before each call, so an element left unwritten
shows. Rank 0 prints one line per collective; the exit status is 1 if
anything differed or failed, else 0.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

import smddp  # noqa: F401  (registers the backend)

FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int8", "uint8", "int32", "int64", "bool")
REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM")
PREMUL_FACTOR = 0.3


def draw(key: str, rank: int, numel: int, dtype: torch.dtype, op: str = "SUM") -> torch.Tensor:
    """Rank ``rank``'s input for case ``key`` (the same on every process)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{key}/{rank}".encode()))
    if dtype.is_floating_point:
        x = torch.rand(numel, dtype=torch.float64, generator=g)
        if op == "PRODUCT":
            x = (x + 0.5) * (torch.randint(0, 2, (numel,), generator=g) * 2 - 1)
        else:
            x = x * 2 - 1
        return x.to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=g).bool()
    if op == "PRODUCT":
        lo = 0 if dtype == torch.uint8 else -5
        return torch.randint(lo, 6, (numel,), dtype=dtype, generator=g)
    # The full range, from random bytes: SUM wraps around as in torch.
    item = torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (numel * item,), dtype=torch.uint8, generator=g).view(dtype).clone()


def reference(inputs: list[torch.Tensor], dtype: torch.dtype, op: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The reduction and its error bound (None: must be exact)."""
    s = torch.stack(inputs)
    if dtype == torch.bool:
        return (s.any(0) if op in ("SUM", "MAX") else s.all(0)), None
    if not dtype.is_floating_point:
        if op == "SUM":
            return s.sum(0, dtype=dtype), None
        if op == "PRODUCT":
            return s.prod(0, dtype=dtype), None
        return (s.amin(0) if op == "MIN" else s.amax(0)), None
    s = s.double()
    n = len(inputs)
    if op in ("MIN", "MAX"):
        return (s.amin(0) if op == "MIN" else s.amax(0)), None
    if op == "PRODUCT":
        exp = s.prod(0)
        mag = exp.abs()
    else:
        scale = {"SUM": 1.0, "AVG": 1.0 / n, "PREMUL_SUM": PREMUL_FACTOR}[op]
        exp = s.sum(0) * scale
        mag = s.abs().sum(0) * scale
    eps = torch.finfo(dtype).eps
    acc = torch.finfo(torch.float32).eps if dtype in (torch.float16, torch.bfloat16) else eps
    return exp, (n + 1) * acc * mag + eps * exp.abs() + torch.finfo(dtype).tiny


def poison(expected: torch.Tensor) -> torch.Tensor:
    """expected's shape and dtype, different from it in every byte."""
    out = torch.empty_like(expected)
    out.view(torch.uint8).copy_(expected.contiguous().view(torch.uint8) ^ 0xFF)
    return out


def compare(got: torch.Tensor, exp: torch.Tensor, bound: torch.Tensor | None) -> tuple[str | None, float]:
    """(what differed or None, the largest error relative to the bound)."""
    if got.shape != exp.shape:
        return f"shape {tuple(got.shape)} != {tuple(exp.shape)}", float("inf")
    if bound is None:
        if got.dtype == torch.bool:
            # Bytes: a poisoned bool byte (neither 0 nor 1) may read as True.
            bad = got.view(torch.uint8) != exp.view(torch.uint8)
        elif got.dtype.is_floating_point:
            bad = got.double() != exp.double()
        else:
            bad = got != exp
        err = 0.0
    else:
        diff = (got.double() - exp).abs()
        bad = ~(diff <= bound)
        err = float((diff / bound).max()) if diff.numel() else 0.0
    if bool(bad.any()):
        i = int(bad.nonzero()[0][0])
        g = got[i].view(torch.uint8).item() if got.dtype == torch.bool else got[i].item()
        return f"{int(bad.sum())}/{got.numel()} wrong, first [{i}]: got {g}, expected {exp[i].item()}", err
    return None, err


class Checker:
    """Counts cases and mismatches of one collective on this rank."""

    def __init__(self, name: str):
        self.name, self.cases, self.bad, self.worst = name, 0, 0, 0.0
        self.first: list[str] = []

    def record(self, what: str, problem: str | None, err: float = 0.0) -> None:
        self.cases += 1
        self.worst = max(self.worst, err)
        if problem:
            self.bad += 1
            if len(self.first) < 3:
                self.first.append(f"{self.name} {what}: {problem}")

    def run(self, what: str, fn: Callable[[Any], list[tuple[torch.Tensor, torch.Tensor, Any]]], case: Any) -> None:
        try:
            results = fn(case)
        except Exception as e:  # noqa: BLE001 - reported, then the next case runs
            self.record(what, f"raised {type(e).__name__}: {str(e)[:200]}")
            return
        problems, worst = [], 0.0
        for got, exp, bound in results:
            problem, err = compare(got, exp, bound)
            worst = max(worst, err)
            if problem:
                problems.append(problem)
        self.record(what, "; ".join(problems) or None, worst)


Result = list[tuple[torch.Tensor, torch.Tensor, Any]]  # (got, expected, bound)


@dataclass
class ReduceCase:
    """Every rank's input (n elements per rank slice, n * world in all) and the reference."""

    rank: int
    world: int
    dtype: torch.dtype
    op: str
    n: int
    inputs: list[torch.Tensor]
    full: torch.Tensor
    bound: torch.Tensor | None

    def mine(self) -> torch.Tensor:
        return self.inputs[self.rank].clone()

    def my_part(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        part = slice(self.rank * self.n, (self.rank + 1) * self.n)
        return self.full[part], None if self.bound is None else self.bound[part]

    def reduce_op(self) -> Any:
        if self.op == "PREMUL_SUM":
            return dist._make_nccl_premul_sum(PREMUL_FACTOR)
        return getattr(dist.ReduceOp, self.op)


def run_all_reduce(c: ReduceCase) -> Result:
    t = c.mine()
    dist.all_reduce(t, op=c.reduce_op())
    return [(t, c.full, c.bound)]


def run_all_reduce_coalesced(c: ReduceCase) -> Result:
    mine = c.mine()
    ts = [mine[: c.n].clone(), mine[c.n :].clone()]
    dist.all_reduce_coalesced(ts, op=c.reduce_op())
    bounds = [None, None] if c.bound is None else [c.bound[: c.n], c.bound[c.n :]]
    return [(ts[0], c.full[: c.n], bounds[0]), (ts[1], c.full[c.n :], bounds[1])]


def run_reduce_scatter_tensor(c: ReduceCase) -> Result:
    exp, bound = c.my_part()
    out = poison(exp.to(c.dtype))
    dist.reduce_scatter_tensor(out, c.mine(), op=c.reduce_op())
    return [(out, exp, bound)]


def run_reduce_scatter_list(c: ReduceCase) -> Result:
    exp, bound = c.my_part()
    out = poison(exp.to(c.dtype))
    mine = c.mine()
    dist.reduce_scatter(out, [mine[r * c.n : (r + 1) * c.n] for r in range(c.world)], op=c.reduce_op())
    return [(out, exp, bound)]


def run_reduce_scatter_tensor_coalesced(c: ReduceCase) -> Result:
    exp, bound = c.my_part()
    outs = [poison(exp.to(c.dtype)), poison(exp.to(c.dtype))]
    opts = dist.distributed_c10d.ReduceScatterOptions()
    opts.reduceOp = c.reduce_op()
    dist.group.WORLD.reduce_scatter_tensor_coalesced(outs, [c.mine(), c.mine()], opts).wait()
    return [(outs[0], exp, bound), (outs[1], exp, bound)]


REDUCTIONS = {
    "all_reduce": run_all_reduce,
    "all_reduce_coalesced": run_all_reduce_coalesced,
    "reduce_scatter_tensor": run_reduce_scatter_tensor,
    "reduce_scatter (list)": run_reduce_scatter_list,
    "reduce_scatter_tensor_coalesced": run_reduce_scatter_tensor_coalesced,
}


def check_reductions(rank: int, world: int, sizes: list[int]) -> list[Checker]:
    checkers = {name: Checker(name) for name in REDUCTIONS}
    for dname in FLOATS + INTS:
        dtype = getattr(torch, dname)
        for op in REDUCE_OPS:
            if not dtype.is_floating_point and op in ("AVG", "PREMUL_SUM"):
                continue  # not defined (an error); the test suite checks that
            for n in sizes:
                inputs = [draw(f"{dname}/{op}/{n}", r, n * world, dtype, op) for r in range(world)]
                full, bound = reference(inputs, dtype, op)
                case = ReduceCase(rank, world, dtype, op, n, inputs, full, bound)
                for name, fn in REDUCTIONS.items():
                    checkers[name].run(f"{dname} {op} n={n}", fn, case)
    return list(checkers.values())


@dataclass
class MoveCase:
    """Every rank's input (random bits) for the collectives that move bytes."""

    rank: int
    world: int
    inputs: list[torch.Tensor]

    def mine(self) -> torch.Tensor:
        return self.inputs[self.rank].clone()

    def all(self) -> torch.Tensor:
        return torch.cat(self.inputs)


def as_bytes(got: torch.Tensor, expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
    return got.view(torch.uint8), expected.view(torch.uint8), None


def run_all_gather_into_tensor(c: MoveCase) -> Result:
    out = poison(c.all())
    dist.all_gather_into_tensor(out, c.mine())
    return [as_bytes(out, c.all())]


def run_all_gather_list(c: MoveCase) -> Result:
    outs = [poison(x) for x in c.inputs]
    dist.all_gather(outs, c.mine())
    return [as_bytes(o, x) for o, x in zip(outs, c.inputs, strict=True)]


def run_all_gather_coalesced(c: MoveCase) -> Result:
    outs = [[poison(x), poison(x)] for x in c.inputs]
    dist.all_gather_coalesced(outs, [c.mine(), c.mine()])
    return [as_bytes(o, x) for lst, x in zip(outs, c.inputs, strict=True) for o in lst]


def run_allgather_into_tensor_coalesced(c: MoveCase) -> Result:
    outs = [poison(c.all()), poison(c.all())]
    opts = dist.distributed_c10d.AllgatherOptions()
    dist.group.WORLD.allgather_into_tensor_coalesced(outs, [c.mine(), c.mine()], opts).wait()
    return [as_bytes(o, c.all()) for o in outs]


def run_broadcasts(c: MoveCase) -> Result:
    """One broadcast from every root."""
    out = []
    for root in range(c.world):
        t = c.mine() if c.rank == root else poison(c.inputs[root])
        dist.broadcast(t, src=root)
        out.append(as_bytes(t, c.inputs[root]))
    return out


MOVES = {
    "all_gather_into_tensor": run_all_gather_into_tensor,
    "all_gather (list)": run_all_gather_list,
    "all_gather_coalesced": run_all_gather_coalesced,
    "allgather_into_tensor_coalesced": run_allgather_into_tensor_coalesced,
    "broadcast (every root)": run_broadcasts,
}


def check_data_movement(rank: int, world: int, sizes: list[int]) -> list[Checker]:
    checkers = {name: Checker(name) for name in MOVES}
    for dname in FLOATS + INTS + ("complex64", "int16"):
        dtype = getattr(torch, dname)
        for n in sizes:
            key = f"move/{dname}/{n}"
            # Random bits (any bit pattern, NaNs included) for every dtype but bool.
            inputs = [
                draw(key, r, n, dtype)
                if dtype == torch.bool
                else draw(key, r, n * dtype.itemsize, torch.uint8).view(dtype)
                for r in range(world)
            ]
            case = MoveCase(rank, world, inputs)
            for name, fn in MOVES.items():
                if name == "all_gather_coalesced" and dtype.is_complex:
                    continue  # torch turns complex lists into real ones before the backend sees them
                checkers[name].run(f"{dname} n={n}", fn, case)
    return list(checkers.values())


def run_all_gather_object(round_: int) -> Result:
    rank, world = dist.get_rank(), dist.get_world_size()
    out: list[Any] = [None] * world
    # Pickles of a different length on every rank.
    dist.all_gather_object(out, {"rank": rank, "blob": "x" * (rank * 500 + round_)})
    want = [{"rank": r, "blob": "x" * (r * 500 + round_)} for r in range(world)]
    return [(torch.tensor([out == want]), torch.tensor([True]), None)]


def run_barriers(count: int) -> Result:
    for _ in range(count):
        dist.barrier()
    return []


def check_others() -> list[Checker]:
    objects = Checker("all_gather_object")
    for round_ in range(3):
        objects.run(f"round {round_}", run_all_gather_object, round_)
    barrier = Checker("barrier")
    barrier.run("x3", run_barriers, 3)
    return [objects, barrier]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--large", action="store_true", help="add a 16 MiB case (slow on small hosts)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes")
    args = parser.parse_args()

    torch.set_num_threads(1)  # several ranks share the host's cores
    dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    # The summary travels through gloo: it must not depend on what is checked.
    gloo = dist.new_group(backend="gloo")
    sizes = [0, 1, 97] if args.quick else [0, 1, 7, 97, 4099]
    if args.large:
        sizes.append((16 << 20) // 4 + 7)

    checkers = check_reductions(rank, world, sizes) + check_data_movement(rank, world, sizes) + check_others()

    # Every rank runs the same cases; mismatches add up over the ranks.
    stats = torch.tensor([[c.cases, c.bad] for c in checkers], dtype=torch.int64)
    worst = torch.tensor([c.worst for c in checkers], dtype=torch.float64)
    bad = stats[:, 1].clone()
    dist.all_reduce(bad, group=gloo)
    stats[:, 1] = bad
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=gloo)
    for line in (f for c in checkers for f in c.first):
        print(f"[rank {rank}] {line}", file=sys.stderr, flush=True)
    failed = int(stats[:, 1].sum())
    if rank == 0:
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        print(f"smddp on {world} ranks ({backend.describe()}), sizes {sizes}")
        for c, (cases, nbad), w in zip(checkers, stats.tolist(), worst.tolist(), strict=True):
            verdict = "ok" if nbad == 0 else "FAILED"
            print(
                f"{c.name:34s} {cases:5d} cases  {nbad:4d} wrong (all ranks)  worst error {w:4.2f} of bound  {verdict}"
            )
        print("all collectives match the reference" if failed == 0 else f"{failed} mismatches: see above")
    dist.barrier(group=gloo)
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
