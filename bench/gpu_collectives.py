"""AllGather, ReduceScatter and AllReduce of smddp's CUDA path with several
ranks sharing one GPU (CUDA IPC between processes on the same device): the
staged path and the zero-copy path (SMDDP_CUDA_ZERO_COPY) side by side, and
beside them the floor: the same copies and reductions done by one process.

    python bench/gpu_collectives.py [--nproc 2] [--sizes 1M,16M] [-n 20] [--sync memops] [--json FILE]

The smddp-bench sweep (nccl-tests' size, algbw and busbw; every result
checked) with smddp:staged and smddp:zero-copy on CUDA tensors, every rank on
the first visible GPU (SMDDP_CUDA_RANKS_PER_GPU = --nproc), and a barrier
before every call: time = median over calls of the slowest rank's time, the
device synchronized. The ranks share the GPU (one GPU, not NVLink), so each
path's time includes what switching between the ranks' contexts costs; the
floor, one process moving the same bytes on one stream, shows how much that
is. The floor goes into the record as "floor" and after the sweep's tables.
Both paths meet with --sync (SMDDP_CUDA_SYNC, default memops): where the
ranks share a GPU, a meeting in host rounds or in a waiting kernel costs a
turn of the contexts, which the zero-copy path (one meeting more per call)
would pay more of than the copies it saves; the streams' own waits hand the
GPU over at once. Exit status 0, or 3 if a result was wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

if __package__ in (None, ""):  # run as a script: the repository's root is one folder up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BACKENDS = "smddp:staged,smddp:zero-copy"


def floor_plan(op: str, count: int, world: int) -> list[tuple[str, int, int]]:
    """What the zero-copy path of ``op`` does on all ``world`` ranks together,
    for ``count`` in nccl-tests' count column: ("copy", elements, times) and
    ("reduce", elements of the result, sources) steps."""
    if op == "all_gather":  # every rank copies every rank's input
        return [("copy", count, world * world)]
    if op == "reduce_scatter":  # every rank reduces its block of every input
        return [("reduce", count, world)] * world
    slice_ = -(-count // world)  # all_reduce: a ReduceScatter of slices, then an AllGather
    return [("reduce", slice_, world)] * world + [("copy", slice_, world * (world - 1))]


def measure_floor(op: str, count: int, world: int, dtype, iters: int, device: str = "cuda") -> float:
    """Median seconds of one process running floor_plan on one stream, every
    copy between buffers of its own (as the ranks' are)."""
    import time

    import torch

    work = []
    for kind, n, k in floor_plan(op, count, world):
        if kind == "copy":
            work += [(torch.rand(n, device=device).to(dtype), torch.empty(n, device=device, dtype=dtype), False)
                     for _ in range(k)]  # fmt: skip
        else:
            work.append((torch.rand(k, n, device=device).to(dtype), torch.empty(n, device=device, dtype=dtype), True))

    def once() -> None:
        for src, dst, reduce in work:
            if reduce:
                torch.sum(src, dim=0, out=dst)
            else:
                dst.copy_(src)

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    once()
    times = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        once()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def add_floor(path: str, iters: int, device: str = "cuda") -> list[str]:
    """The floor of every point of the sweep record at ``path``, added to it;
    returns the lines of its table."""
    import torch

    from smddp.bench import ops as _ops
    from smddp.bench import record
    from smddp.bench.units import format_size

    with open(path) as f:
        rec = json.load(f)
    rows, seen = [], set()
    lines = ["#", "# one process, the same copies and reductions on one stream (the floor)", "#",
             f"# {'op':<15}{'size':>8}{'floor (us)':>12}" + "".join(f"{b + ' / floor':>24}" for b in BACKENDS.split(","))]
    for r in rec["results"]:
        key = (r["op"], r["dtype"], r["requested_bytes"], r["world"])
        if key in seen or r["op"] not in ("all_gather", "reduce_scatter", "all_reduce"):
            continue
        seen.add(key)
        secs = measure_floor(r["op"], r["count"], r["world"], getattr(torch, r["dtype"]), iters, device)
        ratios = {}
        for b in BACKENDS.split(","):
            p = next((x for x in rec["results"] if x["backend"] == b and
                      (x["op"], x["dtype"], x["requested_bytes"], x["world"]) == key), None)  # fmt: skip
            ratios[b] = p["time_us"] * 1e-6 / secs if p and record.measured(p) and secs > 0 else None
        rows.append({"op": r["op"], "dtype": r["dtype"], "size_bytes": r["size_bytes"], "world": r["world"],
                     "floor_us": secs * 1e6, "time_over_floor": ratios})
        lines.append(f"  {_ops.OPS[r['op']].title:<15}{format_size(r['size_bytes']):>8}{secs * 1e6:>12.1f}"
                     + "".join(f"{'n/a' if v is None else f'{v:.2f}':>24}" for v in ratios.values()))
    rec["floor"] = rows
    record.write(rec, path)
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2, help="ranks, all on one GPU")
    p.add_argument("--sizes", default="1M,16M,64M,256M", help="nccl-tests sizes")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed calls per size")
    p.add_argument("--json", default=os.path.join("bench-results", "gpu-collectives.json"), help="the record")
    p.add_argument("--sync", default="memops", choices=("host", "device", "memops"),
                   help="how the ranks meet (SMDDP_CUDA_SYNC; default memops)")
    args = p.parse_args(argv)
    from smddp.bench import cli

    gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    os.environ.update(CUDA_VISIBLE_DEVICES=gpu, SMDDP_CUDA_RANKS_PER_GPU=str(args.nproc), SMDDP_CUDA_SYNC=args.sync)
    sweep = ["--device", "cuda", "--backends", BACKENDS, "--nproc", str(args.nproc), "--nodes", "1",
             "--op", "all_gather,reduce_scatter,all_reduce", "--sizes", args.sizes, "-n",
             str(args.iters), "--timing", "barrier-each", "--rounds", "1", "--block-warmup", "0",
             "-w", "3", "--timeout", "600", "--no-progress", "--plot", "", "--json", args.json]
    code = cli.main(sweep)
    if os.path.exists(args.json):
        print("\n".join(add_floor(args.json, args.iters)), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
