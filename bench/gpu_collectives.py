"""AllGather, ReduceScatter and AllReduce of smddp's CUDA path with several
ranks sharing one GPU (CUDA IPC between processes on the same device).

    python bench/gpu_collectives.py [--nproc 2] [--json FILE]

nccl-tests definitions (size, algbw, busbw; GB = 1e9), CUDA-event timing of
each iteration on the rank's stream after a barrier, median over iterations,
the slowest rank's time; every result checked.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, world: int, init: str, sizes: list[int], iters: int, out_q) -> None:
    os.environ["SMDDP_CUDA_RANKS_PER_GPU"] = str(world)
    import smddp  # noqa: F401

    torch.cuda.set_device(0)
    dist.init_process_group("smddp", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    gloo = dist.new_group(backend="gloo")
    rows = []
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        for size in sizes:
            n = size // 4 // world * world
            if op == "all_gather":
                inp = torch.full((n // world,), float(rank), device="cuda")
                out = torch.empty(n, device="cuda")
                fn = lambda: dist.all_gather_into_tensor(out, inp)  # noqa: E731
                check = lambda: torch.equal(out.view(world, -1)[:, 0].cpu(),  # noqa: E731
                                            torch.arange(world, dtype=torch.float32))
                bus = (world - 1) / world
            elif op == "reduce_scatter":
                inp = torch.full((n,), float(rank + 1), device="cuda")
                out = torch.empty(n // world, device="cuda")
                fn = lambda: dist.reduce_scatter_tensor(out, inp)  # noqa: E731
                check = lambda: bool(torch.all(out == world * (world + 1) / 2))  # noqa: E731
                bus = (world - 1) / world
            else:
                out = torch.ones(n, device="cuda")
                fn = lambda: dist.all_reduce(out)  # noqa: E731

                def check() -> bool:
                    # In place: the timed calls compounded; one fresh call.
                    out.fill_(1.0)
                    fn()
                    torch.cuda.synchronize()
                    return bool(torch.all(out == world))
                bus = 2 * (world - 1) / world
            for _ in range(3):
                fn()
            times = []
            for _ in range(iters):
                dist.barrier(group=gloo)
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                t = torch.tensor([a.elapsed_time(b) / 1e3])
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
                times.append(t.item())
            ok = check()
            t = statistics.median(times)
            rows.append({"op": op, "bytes": n * 4, "time_us": t * 1e6, "algbw": n * 4 / t / 1e9,
                         "busbw": n * 4 / t / 1e9 * bus, "ok": bool(ok)})
    if rank == 0:
        out_q.put(rows)
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--sizes", default="1M,16M,64M,256M")
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = [int(s[:-1]) * units[s[-1]] for s in args.sizes.split(",")]
    init = "file://" + tempfile.mktemp(prefix="smddp-gpu-")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, args.nproc, init, sizes, args.iters, q)) for r in range(args.nproc)]
    for pr in procs:
        pr.start()
    rows = q.get(timeout=600)
    for pr in procs:
        pr.join(timeout=60)
    print(f"# smddp CUDA path, {args.nproc} ranks sharing {torch.cuda.get_device_name(0)}")
    print(f"# {'op':>15} {'size':>12} {'time(us)':>10} {'algbw':>8} {'busbw':>8} {'ok':>4}")
    for r in rows:
        print(f"  {r['op']:>15} {r['bytes']:>12} {r['time_us']:>10.1f} {r['algbw']:>8.2f} {r['busbw']:>8.2f} "
              f"{'yes' if r['ok'] else 'NO':>4}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 3


if __name__ == "__main__":
    sys.exit(main())
