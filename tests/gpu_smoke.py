"""A 2-rank smoke test of each native CUDA op of smddp, bounded in time.

    python3 tests/gpu_smoke.py [--json FILE] [--deadline-s 60] [--op-timeout-s 20]
                               [--device cpu] [--inject-hang OP]

Two ranks share GPU 0 (SMDDP_CUDA_RANKS_PER_GPU=2, CUDA IPC between them)
and run, in order, all_reduce, reduce_scatter_tensor, all_gather_into_tensor,
broadcast and barrier on CUDA tensors, float32 and bfloat16, sizes 0 to
2^20+3, every result checked exactly (small integers, exact in both dtypes).

Each rank reports every op as it starts and ends. An op that does not end
within --op-timeout-s gets the ranks' Python stacks printed (faulthandler on
SIGUSR1, and a timer per op as a second chance), then the ranks are killed
and the ops after it run in a fresh pair of ranks, so that one hang does not
hide the rest. The JSON file lists each op with its status (ok, FAIL,
timeout, skipped), seconds and reason. Exit status 0 when every op passed.
Not collected by pytest (no test_ prefix): tools/gpu_check.py runs it.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import signal
import sys
import tempfile
import time
import traceback

OPS = ["all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast", "barrier"]
SIZES = [0, 1, 7, 4099, (1 << 20) + 3]
WORLD = 2


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize()


def _check_op(op: str, rank: int, world: int, dev) -> list[str]:
    """Runs op on every dtype and size; returns what was wrong."""
    import torch
    import torch.distributed as dist

    bad = []
    if op == "barrier":
        x = torch.full((1 << 20,), float(rank), device=dev)
        x.add_(1)
        dist.barrier()
        _sync(dev)
        return bad
    for dtype in (torch.float32, torch.bfloat16):
        for n in SIZES:
            what = f"{op} {str(dtype).split('.')[-1]} n={n}"
            # Values that every dtype holds exactly, different per rank.
            base = (torch.arange(n, device=dev) % 13).to(dtype)
            mine = base + rank
            if op == "all_reduce":
                t = mine.clone()
                dist.all_reduce(t)
                want = base * world + sum(range(world))
            elif op == "reduce_scatter_tensor":
                big = torch.cat([mine + r for r in range(world)])
                t = torch.full((n,), -1.0, dtype=dtype, device=dev)
                dist.reduce_scatter_tensor(t, big)
                want = (base + rank) * world + sum(range(world))
            elif op == "all_gather_into_tensor":
                t = torch.full((n * world,), -1.0, dtype=dtype, device=dev)
                dist.all_gather_into_tensor(t, mine)
                want = torch.cat([base + r for r in range(world)])
            elif op == "broadcast":
                t = mine.clone()
                dist.broadcast(t, src=world - 1)
                want = base + (world - 1)
            else:
                raise ValueError(op)
            _sync(dev)
            if not torch.equal(t, want.to(dtype)):
                wrong = (t != want.to(dtype)).nonzero()
                first = int(wrong[0]) if wrong.numel() else -1
                bad.append(f"{what}: {wrong.numel()} elements wrong, first at {first}: "
                           f"{t[first].item()} instead of {want[first].item()}")
    return bad


def _rank(rank: int, world: int, init: str, ops: list[str], results: str, op_timeout: float, device: str,
          hang: str | None) -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    os.environ["SMDDP_CUDA_RANKS_PER_GPU"] = str(world)
    log = open(results, "a", buffering=1)

    def report(**kw):
        log.write(json.dumps({"rank": rank, "t": time.time(), **kw}) + "\n")

    try:
        import torch
        import torch.distributed as dist

        import smddp  # noqa: F401

        dev = torch.device(device)
        if dev.type == "cuda":
            torch.cuda.set_device(0)
            dev = torch.device("cuda", 0)
        faulthandler.dump_traceback_later(op_timeout, exit=False)
        dist.init_process_group("smddp", init_method=init, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=max(5.0, op_timeout * 0.75)))
        faulthandler.cancel_dump_traceback_later()
        pg = dist.distributed_c10d._get_default_group()
        try:
            describe = pg._get_backend(dev).describe()
        except Exception as e:
            describe = f"? ({type(e).__name__}: {e})"
        report(event="init", describe=describe)
    except Exception:
        report(event="init_error", error=traceback.format_exc())
        return
    for op in ops:
        report(event="start", op=op)
        t = time.monotonic()
        faulthandler.dump_traceback_later(op_timeout * 0.8, exit=False)
        try:
            if op == hang and rank == world - 1:
                time.sleep(3600)
            bad = _check_op(op, rank, world, dev)
            report(event="end", op=op, seconds=time.monotonic() - t, bad=bad)
        except Exception:
            report(event="end", op=op, seconds=time.monotonic() - t, error=traceback.format_exc())
        faulthandler.cancel_dump_traceback_later()
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    report(event="exit")


def _read(path: str) -> list[dict]:
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # a line cut by a kill
    except OSError:
        pass
    return out


def _stop(procs, dump: bool) -> None:
    alive = [p for p in procs if p.is_alive()]
    if dump and alive:
        print(f"gpu_smoke: stacks of ranks {[p.name for p in alive]}:", file=sys.stderr, flush=True)
        for p in alive:
            try:
                os.kill(p.pid, signal.SIGUSR1)
            except OSError:
                pass
        time.sleep(1.5)
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=10)


def _last_per_rank(events: list[dict]) -> dict[int, dict]:
    last = {}
    for e in events:
        last[e["rank"]] = e
    return last


def _judge(events: list[dict], ops: list[str], verdicts: dict) -> None:
    """A verdict for each op that every rank has ended."""
    ends = [e for e in events if e["event"] == "end"]
    for op in ops:
        mine = [e for e in ends if e["op"] == op]
        if len(mine) < WORLD or op in verdicts:
            continue
        errors = [f"rank {e['rank']}: " + e["error"].strip().splitlines()[-1] for e in mine if e.get("error")]
        wrong = [f"rank {e['rank']}: {b}" for e in mine for b in e.get("bad", [])]
        secs = max(e["seconds"] for e in mine)
        if errors or wrong:
            verdicts[op] = ("FAIL", secs, "; ".join(errors + wrong)[:400])
            for e in mine:
                if e.get("error"):
                    print(f"rank {e['rank']} {op}:\n{e['error']}", file=sys.stderr, flush=True)
        else:
            verdicts[op] = ("ok", secs, "" if op == "barrier" else f"{len(SIZES)} sizes x 2 dtypes, exact")


def run_pair(ops: list[str], deadline: float, op_timeout: float, start_timeout: float, device: str = "cuda",
             hang: str | None = None) -> tuple[dict, dict]:
    """One pair of ranks on ops; returns ({op: verdict}, info). Stops at the
    first op that does not end in time on every rank."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    fd, results = tempfile.mkstemp(prefix="smddp-smoke-", suffix=".jsonl")
    os.close(fd)
    init = "file://" + tempfile.mktemp(prefix="smddp-smoke-init-")
    procs = [ctx.Process(target=_rank, args=(r, WORLD, init, ops, results, op_timeout, device, hang),
                         name=f"rank{r}")
             for r in range(WORLD)]
    for p in procs:
        p.start()
    verdicts: dict = {}
    info: dict = {}
    last_progress = time.monotonic()
    limit = start_timeout
    seen = 0
    try:
        while True:
            events = _read(results)
            if len(events) != seen:
                seen = len(events)
                last_progress = time.monotonic()
            for e in events:
                if e["event"] == "init":
                    info.setdefault("describe", {})[e["rank"]] = e["describe"]
                if e["event"] == "init_error":
                    info.setdefault("init_error", {})[e["rank"]] = e["error"]
            if len(info.get("describe", {})) == WORLD:
                limit = op_timeout
            _judge(events, ops, verdicts)
            exited = sum(1 for e in events if e["event"] == "exit")
            if "init_error" in info or exited == WORLD or all(not p.is_alive() for p in procs):
                break
            now = time.monotonic()
            # A rank in one op for longer than the op's limit (its peer may
            # still be moving on through errors), or nothing new at all.
            in_op = [time.time() - e["t"] for e in _last_per_rank(events).values() if e["event"] == "start"]
            stalled = max(in_op) if in_op else now - last_progress
            if stalled > limit or now > deadline:
                info["timed_out"] = stalled
                _stop(procs, dump=True)
                break
            time.sleep(0.05)
    finally:
        _stop(procs, dump=False)
        info["exit_codes"] = [p.exitcode for p in procs]
        events = _read(results)
        _judge(events, ops, verdicts)
        for path in (results, init[len("file://"):]):
            try:
                os.unlink(path)
            except OSError:
                pass
    # The op the pair was in when it stopped: it hung, or a rank died in it.
    started = {e["op"] for e in events if e["event"] == "start"}
    stuck = next((op for op in ops if op not in verdicts and op in started), None)
    info["stuck"] = stuck
    if stuck is None and "init_error" not in info and not any(e["event"] == "init" for e in events):
        why = "did not join the group" if "timed_out" in info else "died before joining the group"
        info["init_error"] = {"-": f"the ranks {why} (exit codes {info['exit_codes']})"}
    elif stuck is not None:
        ended = {e["rank"] for e in events if e["event"] == "end" and e["op"] == stuck}
        silent = sorted(set(range(WORLD)) - ended)
        if "timed_out" in info:
            verdicts[stuck] = ("timeout", info["timed_out"],
                               f"ranks {silent} did not end it within {limit:.0f} s (stacks in the log)")
        else:
            verdicts[stuck] = ("FAIL", 0.0, f"ranks {silent} died in it (exit codes {info['exit_codes']})")
    return verdicts, info


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None)
    p.add_argument("--deadline-s", type=float, default=60.0, help="the whole test's limit")
    p.add_argument("--op-timeout-s", type=float, default=20.0, help="one op's limit on both ranks")
    p.add_argument("--start-timeout-s", type=float, default=40.0, help="the ranks' start-up limit")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu runs the same checks on CPU tensors (to try this script without a GPU)")
    p.add_argument("--inject-hang", default=None, metavar="OP",
                   help="the last rank sleeps in OP instead of running it (to test this script's own bounds)")
    args = p.parse_args()
    deadline = time.monotonic() + args.deadline_s
    ops = [o for o in args.ops.split(",") if o]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        p.error(f"unknown ops {unknown}; known: {', '.join(OPS)}")
    report: dict = {"status": "FAIL", "ops": [], "pairs": []}

    def save() -> None:
        if args.json:
            with open(args.json + ".part", "w") as f:
                json.dump(report, f, indent=1)
            os.replace(args.json + ".part", args.json)

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        report.update(status="skipped", reason="no GPU (torch.cuda.is_available() is False)")
        print(report["reason"])
        save()
        return 0
    verdicts: dict = {}
    pending = list(ops)
    while pending:
        if deadline - time.monotonic() < 5:
            break
        got, info = run_pair(pending, deadline, args.op_timeout_s, args.start_timeout_s, args.device,
                             args.inject_hang)
        report["pairs"].append({"ops": list(pending), **info})
        verdicts.update(got)
        if "init_error" in info:
            err = next(iter(info["init_error"].values()))
            for op in pending:
                verdicts.setdefault(op, ("FAIL", 0.0, "init_process_group failed: " + err.strip().splitlines()[-1]))
            print(f"init_process_group failed:\n{err}", file=sys.stderr)
            break
        stuck = info.get("stuck")
        pending = pending[pending.index(stuck) + 1:] if stuck in pending else [o for o in pending if o not in verdicts]
        report["ops"] = [{"op": o, "status": v[0], "seconds": round(v[1], 2), "reason": v[2]}
                         for o, v in ((o, verdicts[o]) for o in ops if o in verdicts)]
        save()
        if stuck is None:
            break
    for op in ops:
        verdicts.setdefault(op, ("skipped", 0.0, "no time left" if deadline - time.monotonic() < 5 else "not reached"))
    report["ops"] = [{"op": o, "status": verdicts[o][0], "seconds": round(verdicts[o][1], 2), "reason": verdicts[o][2]}
                     for o in ops]
    failed = [o for o in report["ops"] if o["status"] != "ok"]
    report["status"] = "FAIL" if failed else "ok"
    report["reason"] = ", ".join(f"{o['op']} {o['status']}" for o in report["ops"])
    save()
    for o in report["ops"]:
        print(f"{o['op']:24} {o['status']:8} {o['seconds']:6.2f} s  {o['reason']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
