"""Soak: a long random mix of collectives on emulated nodes, every result
checked (smddp/_soak.py says what is drawn and how it is checked).

    python bench/soak.py --ops 10000 --nproc 4 --nodes 2

Prints the number of operations, mismatches and the time; exits 1 if any
result was wrong.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile

import torch.multiprocessing as mp


def _rank(rank: int, world: int, nodes: int, init: str, ops: int, seed: int, q) -> None:
    os.environ["SMDDP_RANKS_PER_NODE"] = str(world // nodes)
    import torch.distributed as dist

    import smddp  # noqa: F401
    from smddp._soak import run_soak

    dist.init_process_group("smddp", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    r = run_soak(ops, seed)
    q.put((rank, r.ops, r.mismatches, r.seconds, r.first_mismatch))
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=int, default=10000)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=3600)
    args = p.parse_args()
    if args.nproc % args.nodes:
        p.error("--nproc must be a multiple of --nodes")
    init = "file://" + tempfile.mktemp(prefix="smddp-soak-")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, args.nproc, args.nodes, init, args.ops, args.seed, q))
             for r in range(args.nproc)]
    for pr in procs:
        pr.start()
    results = []
    try:
        for _ in procs:
            results.append(q.get(timeout=args.timeout))
    except Exception:  # noqa: BLE001 - a rank died or hung
        for pr in procs:
            pr.kill()
        print("soak: a rank did not finish (killed); exit codes:", [pr.exitcode for pr in procs])
        return 2
    for pr in procs:
        pr.join(timeout=60)
    bad = sum(r[2] for r in results)
    secs = max(r[3] for r in results)
    print(f"soak: {args.ops} operations x {args.nproc} ranks ({args.nodes} emulated nodes), "
          f"{bad} mismatches, {secs:.1f} s")
    for r in sorted(results):
        if r[2]:
            print(f"  rank {r[0]}: {r[2]} mismatches, first: {r[4]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
