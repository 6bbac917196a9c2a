"""The latency of a small native CUDA AllReduce, ranks sharing one GPU:
host synchronization (the node's host threads meet between steps), device
synchronization (flags awaited by kernels, SMDDP_CUDA_SYNC=device), memops
synchronization (flags awaited by the streams' own memory operations,
SMDDP_CUDA_SYNC=memops; with "+batch" each step in one driver call,
SMDDP_CUDA_BATCH_MEMOPS), the last two also replayed from a CUDA graph, each
in two steps between the ranks or, with "+oneshot", in one
(SMDDP_CUDA_ONESHOT_BYTES), in one run.

    python bench/gpu_latency.py [--nproc 2] [--bytes 4K] [-n 200] [--json FILE]

Each mode runs in a fresh group of --nproc ranks on the first visible GPU
(SMDDP_CUDA_RANKS_PER_GPU = --nproc). A call is timed between CUDA events on
the caller's stream (a barrier on the CPU before each); a graph holds 10
calls and its replay's time is divided by 10. Beside it, the host's time in
the call (until it returns: the work enqueued, the host rounds met), which
the GPU's time includes wherever the stream waited for the host. Medians of
the slowest rank; every result checked. Ranks share the GPU's time slices,
so these are the costs of one GPU's contexts taking turns, not of NVLink.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script: the repository's root is one folder up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODES = ("host", "host+oneshot", "device", "device+graph", "device+graph+oneshot", "memops", "memops+oneshot",
         "memops+graph", "memops+graph+oneshot", "memops+batch", "memops+batch+graph")


def parse_mode(mode: str) -> tuple[str, set[str]]:
    """A mode's synchronization and its flags; ValueError for what is not a mode."""
    sync, *rest = mode.split("+")
    flags = set(rest)
    if (sync not in ("host", "device", "memops") or not flags <= {"graph", "oneshot", "batch"}
            or len(flags) != len(rest) or ("graph" in flags and sync == "host")
            or ("batch" in flags and sync != "memops")):  # fmt: skip
        raise ValueError(f"{mode!r} is not a mode; use {', '.join(MODES)} (graph needs device or memops, batch memops)")
    return sync, flags


def mode_env(mode: str, world: int, nbytes: int) -> dict[str, str]:
    """The knobs a mode's ranks run with."""
    sync, flags = parse_mode(mode)
    return {"SMDDP_CUDA_RANKS_PER_GPU": str(world), "SMDDP_CUDA_SYNC": sync,
            "SMDDP_CUDA_ONESHOT_BYTES": str(nbytes if "oneshot" in flags else 0),
            "SMDDP_CUDA_BATCH_MEMOPS": "1" if "batch" in flags else "0"}  # fmt: skip


def collect(q, procs: list, timeout_s: float) -> dict | str:
    """Rank 0's row from `q`, or why there is none: a rank that exited with an
    error (its peers may wait for it until the group's timeout), or the time
    is up. Polled, so that a failed mode costs seconds, not the timeout."""
    import queue

    end = time.monotonic() + timeout_s
    while True:
        try:
            return q.get(timeout=0.5)
        except queue.Empty:
            pass
        failed = [f"rank {r} exited with {p.exitcode}" for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if failed:
            return ", ".join(failed)
        if all(p.exitcode == 0 for p in procs):
            try:
                return q.get(timeout=1.0)
            except queue.Empty:
                return "every rank exited without a result"
        if time.monotonic() > end:
            return f"no result within {timeout_s:.0f} s"


def _rank(rank: int, world: int, init: str, mode: str, nbytes: int, iters: int, out) -> None:
    _, parts = parse_mode(mode)
    os.environ.update(mode_env(mode, world, nbytes))
    import torch
    import torch.distributed as dist

    import smddp  # noqa: F401

    torch.cuda.set_device(0)
    dist.init_process_group("smddp", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    cpu = dist.new_group(backend="gloo")
    x = torch.zeros(nbytes // 4, device="cuda")
    want = float(sum(range(world)))

    def call() -> None:
        x.fill_(float(rank))
        dist.all_reduce(x)

    for _ in range(5):
        call()
    torch.cuda.synchronize()
    run = call
    per_run = 1
    if "graph" in parts:
        graph = torch.cuda.CUDAGraph()
        per_run = 10
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            for _ in range(per_run):
                call()
        run = graph.replay
        run()
        torch.cuda.synchronize()
    ok = bool(torch.all(x == want))
    times, host = [], []
    for _ in range(iters):
        dist.barrier(group=cpu)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        t0 = time.perf_counter()
        run()
        t1 = time.perf_counter()
        b.record()
        b.synchronize()
        t = torch.tensor([a.elapsed_time(b) * 1e3 / per_run, (t1 - t0) * 1e6 / per_run])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=cpu)
        times.append(t[0].item())
        host.append(t[1].item())
    ok = ok and bool(torch.all(x == want))
    if rank == 0:
        out.put({"mode": mode, "bytes": nbytes, "latency_us": statistics.median(times),
                 "host_us": statistics.median(host), "ok": ok})  # fmt: skip
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2, help="ranks, all on one GPU")
    p.add_argument("--bytes", default="4K", help="bytes of the AllReduce")
    p.add_argument("-n", "--iters", type=int, default=200, help="timed runs per mode")
    p.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    p.add_argument("--json", default=None, help="the record (kind gpu-latency)")
    args = p.parse_args(argv)
    for mode in args.modes.split(","):
        try:
            parse_mode(mode)
        except ValueError as e:
            p.error(f"--modes: {e}")
    import torch
    import torch.multiprocessing as mp

    from smddp.bench import record, table, timing
    from smddp.bench.units import parse_size

    if not torch.cuda.is_available():
        print("no GPU")
        return 1
    nbytes = parse_size(args.bytes)
    ctx = mp.get_context("spawn")
    device = torch.cuda.get_device_name(0)
    how = timing.Timing(timing.BARRIER_EACH, warmup=5, block_warmup=0, iters=args.iters, rounds=1)
    rows: list[dict] = []

    def save() -> None:
        if args.json:
            record.write_gpu("gpu-latency", "bench/gpu_latency.py", argv or sys.argv[1:], args, how, device, rows,
                             args.json)  # fmt: skip

    for mode in args.modes.split(","):
        q = ctx.Queue()
        init = "file://" + tempfile.mktemp(prefix="smddp-latency-")
        procs = [ctx.Process(target=_rank, args=(r, args.nproc, init, mode, nbytes, args.iters, q))
                 for r in range(args.nproc)]  # fmt: skip
        for pr in procs:
            pr.start()
        got: dict | str = "interrupted"
        try:
            got = collect(q, procs, 300.0)
        finally:
            for pr in procs:
                # The peers of a failed rank wait for it: no grace for them.
                pr.join(timeout=30 if isinstance(got, dict) else 0)
                if pr.is_alive():
                    pr.kill()
                    pr.join(timeout=5)
        if isinstance(got, dict):
            rows.append(got)
            print(f"# {mode}: {got['latency_us']:.1f} us (host {got['host_us']:.1f} us)"
                  f"{'' if got['ok'] else ' WRONG'}", flush=True)  # fmt: skip
        else:
            # Recorded, and the next mode runs: one broken mode costs only itself.
            rows.append({"mode": mode, "bytes": nbytes, "latency_us": None, "host_us": None, "ok": False,
                         "error": got})  # fmt: skip
            print(f"# {mode}: FAILED: {got}", flush=True)
        save()
    cols = [table.Column("mode"), table.Column("bytes"), table.Column("latency", "(us)", "{:.1f}"),
            table.Column("host", "(us)", "{:.1f}"), table.Column("ok")]
    print(f"# small CUDA AllReduce, {args.nproc} ranks sharing {device} (one GPU's time slices, not NVLink)")
    print(table.text(cols, [[r["mode"], r["bytes"], r["latency_us"], r["host_us"],
                             "yes" if r["ok"] else r.get("error", "NO")] for r in rows]))  # fmt: skip
    return 0 if all(r["ok"] for r in rows) else 3


if __name__ == "__main__":
    sys.exit(main())
