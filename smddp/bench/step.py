"""The training-step benchmark: one FSDP (or DDP) step of the example's GPT
(smddp._gpt, the model examples/train_fsdp.py trains) on smddp, on its
rival and on torch's "fake" backend, whose collectives do nothing, so that
``(t - t_fake) / t_fake`` is what communication costs a step.

    smddp-bench step                               # FSDP2, 2 ranks, the gpt39m preset
    smddp-bench step --strategy hsdp --world 4 --ranks-per-node 2

Every backend runs the same model from the same seed on the same data. The
backends' ranks are all started first, then take turns, one step each (after
warm-up steps), so that a slow spell of a shared machine falls on all alike.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import statistics
import sys
import time
import traceback
from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from smddp import _gpt as gpt
from smddp.bench import cluster_run, launch, record, views
from smddp.bench.units import arg, at_least, choose

VOCAB = 512
# The model's shapes; tiny is for tests.
PRESETS = {
    "gpt39m": gpt.GPTConfig(VOCAB, seq_len=64, width=1024, layers=3, heads=8),
    "gpt10m": gpt.GPTConfig(VOCAB, seq_len=64, width=512, layers=3, heads=8),
    "tiny": gpt.GPTConfig(VOCAB, seq_len=16, width=64, layers=2, heads=2),
}
BACKENDS = ("smddp", "gloo", "fake")


def num_params(c: gpt.GPTConfig) -> int:
    """Parameters of smddp._gpt.GPT of this shape."""
    w, h = c.width, c.hidden or 4 * c.width
    return c.layers * (4 * w * w + 2 * h * w + 9 * w + h) + (2 * c.vocab_size + c.seq_len + 2) * w


def _keep_local(_state, bucket):  # type: ignore[no-untyped-def]
    """DDP comm hook of the fake backend, whose all-reduce's future holds
    nothing: the bucket as it is, at once. Unannotated on purpose: DDP checks
    a hook's annotations against its own types, and this module's are strings."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _rank_main(backend: str, s: argparse.Namespace, rank: int, world: int, init_method: str,
               local_rank: int, conn: Any) -> int:  # pragma: no cover - a child  # fmt: skip
    """Sets up, then answers each step number with (wall, comm wait, preempted, loss)."""
    try:
        torch.set_num_threads(s.threads)
        # A fake step computes on buffers no collective ever filled; denormal
        # garbage there must not make it slower than a real step.
        torch.set_flush_denormal(True)
        timeout = datetime.timedelta(seconds=s.timeout)
        if backend == "fake":
            from torch.testing._internal.distributed.fake_pg import FakeStore

            dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world,
                                    timeout=timeout)  # fmt: skip
        else:
            if backend == "smddp":
                import smddp  # noqa: F401
            dist.init_process_group(backend, init_method=init_method, rank=rank,
                                    world_size=world, timeout=timeout)  # fmt: skip
        cfg = gpt.GPTConfig(VOCAB, s.seq_len, s.width, s.blocks, s.heads, s.hidden)
        torch.manual_seed(s.seed)
        how = argparse.Namespace(**vars(s), reduce_dtype="fp32", reduce_divide_factor=0,
                                 ddp_powersgd_rank=0, ddp_bucket_mb=25)  # fmt: skip
        model, _ = gpt.parallelize(gpt.GPT(cfg), how, torch.device("cpu"))
        if backend == "fake" and s.strategy == "ddp":
            model.register_comm_hook(None, _keep_local)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        conn.send(("ok", None))
        while (step := conn.recv()) is not None:
            x, y = gpt.synthetic_batch(cfg, s.tokens // s.seq_len, s.seed, rank, step,
                                       torch.device("cpu"))  # fmt: skip
            dist.barrier()  # lines the ranks up outside the timed region (a no-op on fake)
            wall0, (cpu0, queued0) = time.perf_counter(), gpt.thread_times()
            loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            wall = time.perf_counter() - wall0
            cpu, queued = (t - t0 for t, t0 in zip(gpt.thread_times(), (cpu0, queued0)))
            # The training thread sleeps only when blocked on communication.
            conn.send(("ok", (wall, max(0.0, wall - cpu - queued), queued, loss.item())))
    except EOFError:
        pass
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return 1
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    return 0


def run(s: argparse.Namespace, say: Any = lambda _msg: None) -> dict[str, dict[str, Any]]:
    """Runs the benchmark; per backend, per timed step: the slowest rank's time
    (``step_s``), and the mean over ranks of the time the training thread was
    blocked on communication and of the time it waited for a core."""
    results = {b: {"step_s": [], "comm_wait_s": [], "preempted_s": []} for b in s.backends}
    env = {"OMP_NUM_THREADS": str(s.threads)}
    if s.ranks_per_node:
        env["SMDDP_RANKS_PER_NODE"] = str(s.ranks_per_node)
    ranks = {b: launch.Ranks(f"smddp-bench step ({b})") for b in s.backends}
    entry = _rank_main
    if getattr(s, "hosts", None) is not None:  # each rank in its host of the cluster
        entry = cluster_run.in_hosts(_rank_main, s.hosts)
        env.update(cluster_run.SPAWN_ENV)
    try:
        for b in s.backends:
            ranks[b].spawn(entry, s.world, (b, s), env, pipes=True)
        for b in s.backends:
            ranks[b].ask(None, s.timeout, "start-up", send=False)
        say(f"ranks of {', '.join(s.backends)} ready; {s.warmup} warm-up step(s) each")
        for b in s.backends:
            for i in range(s.warmup):
                ranks[b].ask(1_000_000 + i, s.timeout, f"step {1_000_000 + i}")
        for i in range(s.steps):
            for b in s.backends:
                answers, r = ranks[b].ask(i, s.timeout, f"step {i}"), results[b]
                r["step_s"].append(max(a[0] for a in answers))
                r["comm_wait_s"].append(statistics.fmean(a[1] for a in answers))
                r["preempted_s"].append(statistics.fmean(a[2] for a in answers))
                r["final_loss"] = answers[0][3]  # rank 0's, last timed step
            say(f"round {i + 1}/{s.steps}: "
                + ", ".join(f"{b} {results[b]['step_s'][-1]:.3f} s" for b in s.backends))
    finally:
        for r in ranks.values():
            for conn in r.conns:
                with contextlib.suppress(OSError):
                    conn.send(None)
        for r in ranks.values():
            r.wait(10)  # a clean exit lets the backends remove what they made
    fake = statistics.median(results["fake"]["step_s"]) if "fake" in results else None
    for b, r in results.items():
        med = r["median_s"] = statistics.median(r["step_s"])
        r["median_comm_wait_s"] = statistics.median(r["comm_wait_s"])
        r["median_preempted_s"] = statistics.median(r["preempted_s"])
        r["overhead_vs_fake"] = (med - fake) / fake if fake and b != "fake" else None
    return results


def format_table(s: argparse.Namespace, rec: dict[str, Any]) -> str:
    rpn = s.ranks_per_node
    nodes = f" ({s.world // rpn} nodes x {rpn})" if rpn else ""
    return (f"# {s.strategy} step, {s.world} ranks{nodes}, {s.preset} ({s.num_params / 1e6:.2f} M "
            f"parameters), {'bf16' if s.mixed_precision == 'bf16' else 'fp32'}, {s.tokens} tokens "
            f"per rank, {s.threads} thread(s) per rank\n# median of {s.steps} interleaved steps "
            f"after {s.warmup} warm-up; step = slowest rank; comm wait, preempted = mean over "
            "ranks of the time the training thread slept, and waited for a core\n"
            + views.step_table(rec))  # fmt: skip


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def build_parser() -> argparse.ArgumentParser:
    presets = "\n".join(f"  {k:7s} width {v.width}, {v.layers} blocks, {v.heads} heads, sequences "
                        f"of {v.seq_len}: {num_params(v):,} parameters"
                        for k, v in PRESETS.items())  # fmt: skip
    p = argparse.ArgumentParser(
        prog="smddp-bench step", formatter_class=_HelpFormatter,
        description="Time one training step on CPU with smddp, gloo and torch's fake backend "
        "(collectives that do nothing): the cost of communication per step.",
        epilog=f"presets (the GPT of examples/train_fsdp.py, vocabulary {VOCAB}):\n{presets}\n\n"
        "The model trains on synthetic tokens with a cross-entropy loss and AdamW; only one\n"
        "backend's ranks compute at a time, each with --threads intra-op threads.\n"
        "step: the slowest rank's wall time of forward, backward and optimizer step.\n"
        "comm wait: the time the training thread slept in the step (wall time minus its\n"
        "CPU time and minus its run-queue delay, from /proc/thread-self/schedstat): it\n"
        "sleeps only when blocked on a collective. preempted: the run-queue delay, time\n"
        "lost to other processes; when it is large, the run was disturbed.",
    )  # fmt: skip
    add = p.add_argument
    add("--strategy", default="fsdp2", choices=gpt.STRATEGIES,
        help="fsdp2: fully_shard on a 1-D mesh; hsdp: on a (replicate, shard) mesh; fsdp1: "
        "FullyShardedDataParallel; ddp: DistributedDataParallel")
    add("--fsdp1-sharding", default="FULL_SHARD", help="FSDP1's ShardingStrategy",
        choices=gpt.FSDP1_SHARDING)
    add("--preset", default="gpt39m", choices=tuple(PRESETS), help="model shape")
    add("--width", type=int, default=0, help="override the preset's width")
    add("--hidden", type=int, default=0, help="inner width of each block's MLP (0: 4 x width)")
    add("--blocks", type=int, default=0, help="override the preset's block count")
    add("--heads", type=int, default=0, help="override the preset's attention heads")
    add("--world", "-n", type=at_least(1), default=2, help="ranks per backend")
    add("--ranks-per-node", type=at_least(0), default=0,
        help="emulate nodes of this many ranks (SMDDP_RANKS_PER_NODE; 0: one node)")
    add("--replicate-size", type=at_least(0), default=0,
        help="hsdp/HYBRID_SHARD replicate dimension (0: the number of nodes)")
    add("--tokens", type=at_least(1), default=128,
        help="tokens per rank and step (a multiple of the preset's sequence length)")
    add("--mixed-precision", default="none", choices=("none", "bf16"),
        help="bf16 parameters for compute (gradients reduced in fp32)")
    add("--backends", type=arg(lambda text: choose(text, BACKENDS, "backend")),
        default=",".join(BACKENDS), help="comma list, from: " + ", ".join(BACKENDS))
    add("--warmup", type=at_least(0), default=2, help="untimed steps per backend")
    add("--steps", type=at_least(1), default=5, help="timed steps per backend")
    add("--threads", type=at_least(0), default=0,
        help="intra-op threads per rank (0: the host's cores / --world)")
    add("--seed", type=int, default=0, help="seed of the weights and the data")
    add("--timeout", type=float, default=600.0,
        help="seconds any rank may take to start or to finish a step")
    add("--json", metavar="FILE", default="", help="also write the results here")
    cluster_run.add_arguments(p)
    return p


def parse_settings(argv: Sequence[str]) -> argparse.Namespace:
    """The arguments, checked, with the preset's shape filled in."""
    parser = build_parser()
    s = parser.parse_args(list(argv))
    if s.cluster:  # --world, and the replicas of hsdp, from the cluster's hosts
        cluster_run.step_shape(s, parser)
    preset = PRESETS[s.preset]
    if s.ranks_per_node and s.world % s.ranks_per_node:
        parser.error(f"--ranks-per-node {s.ranks_per_node} does not divide --world {s.world}")
    if s.tokens % preset.seq_len:
        parser.error(f"--tokens {s.tokens} is not a multiple of the preset's sequence length "
                     f"({preset.seq_len})")  # fmt: skip
    s.width, s.heads = s.width or preset.width, s.heads or preset.heads
    s.blocks = s.blocks or preset.layers
    if s.width % s.heads:
        parser.error(f"the width {s.width} is not a multiple of the heads {s.heads} (--heads)")
    s.seq_len = preset.seq_len
    s.num_params = num_params(gpt.GPTConfig(VOCAB, s.seq_len, s.width, s.blocks, s.heads, s.hidden))
    s.threads = s.threads or max(1, len(os.sched_getaffinity(0)) // s.world)
    s.replicate_size = s.replicate_size or (s.world // s.ranks_per_node if s.ranks_per_node else 1)
    if s.world % s.replicate_size:
        parser.error(f"the replicate size {s.replicate_size} does not divide --world {s.world}")
    s.argv = ["smddp-bench", "step", *argv]
    return s


def main(argv: Sequence[str] | None = None) -> int:
    """``smddp-bench step``; returns the exit status."""
    s = parse_settings(sys.argv[1:] if argv is None else argv)
    if launch.launched_externally():
        print("smddp-bench step starts its own ranks, one set per backend: run it once, not "
              "under torchrun", file=sys.stderr)  # fmt: skip
        return 2
    print(f"# smddp-bench step: {s.strategy}, {s.world} ranks x {len(s.backends)} backends, "
          f"{s.preset} ({s.num_params:,} parameters)", flush=True)  # fmt: skip
    if s.cluster:
        return cluster_run.step(s, _measure)
    return _measure(s)


def _measure(s: argparse.Namespace) -> int:
    skip = ("argv", "json", "hosts", "cluster_facts")
    settings = {k: v for k, v in vars(s).items() if k not in skip}
    rec = record.new("step", s.argv, settings)
    if getattr(s, "cluster_facts", None):
        rec["topology"] = {"launcher": cluster_run.LAUNCHER, "facts": s.cluster_facts}
    try:
        rec["results"] = run(s, lambda msg: print(f"# {msg}", file=sys.stderr, flush=True))
    except launch.RankError as e:
        print(f"smddp-bench step: {e}", file=sys.stderr)
        return launch.EXIT_TIMEOUT if "silent for" in str(e) else 1
    print(format_table(s, rec), flush=True)
    if s.json:
        record.write(rec, s.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
