"""Soak: a long random mix of collectives on emulated nodes, every result checked.

    python bench/soak.py --ops 10000 --nproc 4 --nodes 2

Every rank draws the same sequence of operations from a seeded generator
(collective, size, dtype, reduce op, root, sub-group, async or not, how many
in flight), fills its inputs with smddp.bench.ops's generator, shifted by the
operation's index so that consecutive calls differ, and checks every output
with its oracle: exact for integers and MIN/MAX, within the dtype's
tolerance for floating SUM/AVG. Prints the number of operations, mismatches
and the time; exits 1 if any result was wrong, 2 if a rank failed or hung.
tests/test_soak.py runs a short one.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository's root is one folder up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from smddp.bench import launch, ops  # noqa: E402

DTYPES = ["float32", "float64", "bfloat16", "float16", "int32", "int64", "uint8"]
COUNTS = [0, 1, 3, 17, 255, 1024, 4097, 65537, 1 << 18]  # elements per rank
KINDS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier"]


@dataclass
class SoakResult:
    ops: int
    mismatches: int
    seconds: float
    first_mismatch: str


def run_soak(num_ops: int, seed: int = 0) -> SoakResult:
    """Runs ``num_ops`` random collectives on the default group and sub-groups."""
    import torch
    import torch.distributed as dist

    from smddp.bench.sweep import Buffers

    rank, world = dist.get_rank(), dist.get_world_size()
    rng = random.Random(seed)
    # Sub-groups made once (collective): the even ranks, and all but the last.
    groups: list[tuple[Any, list[int]]] = [(None, list(range(world)))]
    for ranks in (list(range(0, world, 2)), list(range(max(1, world - 1)))):
        groups.append((dist.new_group(ranks=ranks, backend="smddp"), ranks))
    mismatches, first, pending = 0, "", []
    t0 = time.time()

    def settle() -> None:
        nonlocal mismatches, first
        for work, buf, what in pending:
            if work is not None:
                work.wait()
            if buf is not None and buf.wrong():
                mismatches += 1
                first = first or what
        pending.clear()

    for i in range(num_ops):
        kind, dtype, n = rng.choice(KINDS), rng.choice(DTYPES), rng.choice(COUNTS)
        floating = ops.DTYPES[dtype][1]
        redop = rng.choice(["sum", "min", "max"] + (["avg"] if floating else []))
        group, members = rng.choice(groups)
        async_op, root = rng.random() < 0.5, rng.choice(members)
        in_flight = rng.randint(1, 8)
        # Every draw happens on every rank, members or not: the same sequence.
        if rank not in members:
            continue
        what = f"op {i}: {kind} {dtype} n={n} {redop} group={members}"
        if kind == "barrier":
            pending.append((dist.barrier(group=group, async_op=async_op), None, what))
        else:
            geom = ops.of_count(kind, n, ops.DTYPES[dtype][0], len(members))
            buf = Buffers(kind, dtype, geom, redop, members.index(root), members.index(rank),
                          len(members), torch.device("cpu"), offset=i * 7)  # fmt: skip
            buf.poison()
            buf.restore()
            work = buf.call(group, redop, async_op=async_op, src=root)()
            pending.append((work, buf, what))
        # Several operations in flight at times, then everything settles.
        if not async_op or len(pending) >= in_flight:
            settle()
    settle()
    for group, _ in groups[1:]:
        dist.destroy_process_group(group)
    return SoakResult(num_ops, mismatches, time.time() - t0, first)


def _rank(num_ops: int, seed: int, rank: int, world: int, init_method: str, local_rank: int,
          conn: Any) -> int:  # pragma: no cover - child  # fmt: skip
    from smddp.bench.sweep import process_group

    with process_group(rank, world, init_method, 120, backend="smddp"):
        try:
            conn.send(("ok", vars(run_soak(num_ops, seed))))  # plain: the parent lacks this module
        except BaseException:
            conn.send(("error", traceback.format_exc()))
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=int, default=10000)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=3600)
    args = p.parse_args(argv)
    if args.nproc % args.nodes:
        p.error("--nproc must be a multiple of --nodes")
    with launch.Ranks("soak") as ranks:
        ranks.spawn(_rank, args.nproc, (args.ops, args.seed),
                    {"SMDDP_RANKS_PER_NODE": str(args.nproc // args.nodes)}, pipes=True)
        try:
            results = ranks.ask(None, args.timeout, "the soak", send=False)
        except launch.RankError as e:
            print(f"soak: {e}; the ranks were killed")
            return 2
    bad = sum(r["mismatches"] for r in results)
    print(f"soak: {args.ops} operations x {args.nproc} ranks ({args.nodes} emulated nodes), "
          f"{bad} mismatches, {max(r['seconds'] for r in results):.1f} s")  # fmt: skip
    for rank, r in enumerate(results):
        if r["mismatches"]:
            print(f"  rank {rank}: {r['mismatches']} mismatches, first: {r['first_mismatch']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
