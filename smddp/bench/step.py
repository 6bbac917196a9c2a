"""The training-step benchmark: one FSDP (or DDP) step on smddp, on its rival
and on torch's "fake" backend, whose collectives do nothing.

    smddp-bench step                               # FSDP2, 2 ranks, the mlp34m preset
    smddp-bench step --strategy hsdp --world 4 --ranks-per-node 2
    python -m smddp.bench.step --json step.json

Every backend runs the same model from the same seed on the same data. The
fake backend gives the step's time without communication, so
``(t - t_fake) / t_fake`` is what communication costs a step, the figure
smddp exists to shrink.

The backends' ranks are all started first, then the steps are interleaved:
warm-up steps on each backend, then round after round of one timed step per
backend. Only one backend's ranks run at a time (the others wait on a pipe),
and a slow spell of a shared machine is spread over all backends instead of
falling on one.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

EXIT_FAILURE = 1
EXIT_TIMEOUT = 124


@dataclass(frozen=True)
class Preset:
    width: int  # features of a token
    hidden: int  # inner width of each block
    blocks: int
    help: str


# mlp34m reproduces the reference point of the step benchmark: a 34.6 M
# parameter MLP (gloo 2.05 s/step against 1.42 s for fake, FSDP2, 2 ranks,
# fp32, 128 tokens per rank, on a 2-core CPU host).
PRESETS: dict[str, Preset] = {
    "mlp34m": Preset(1024, 4096, 4, "Linear(1024,1024) + 4 x [Linear(1024,4096), GELU, "
                     "Linear(4096,1024)], residual: 34,624,512 parameters"),
    "mlp9m": Preset(512, 2048, 4, "Linear(512,512) + 4 x [Linear(512,2048), GELU, "
                    "Linear(2048,512)], residual: 8,660,480 parameters"),
    "tiny": Preset(64, 256, 2, "Linear(64,64) + 2 x [Linear(64,256), GELU, Linear(256,64)], "
                   "residual: 70,336 parameters (for tests)"),
}

STRATEGIES = ("fsdp2", "hsdp", "fsdp1", "ddp")
BACKENDS = ("smddp", "gloo", "fake")


@dataclass(frozen=True)
class StepSettings:
    strategy: str = "fsdp2"
    preset: str = "mlp34m"
    width: int = 1024
    hidden: int = 4096
    blocks: int = 4
    world: int = 2
    ranks_per_node: int = 0
    replicate_size: int = 0
    tokens: int = 128
    mixed_precision: str = "none"
    fsdp1_sharding: str = "FULL_SHARD"
    backends: tuple[str, ...] = BACKENDS
    warmup: int = 2
    steps: int = 5
    threads: int = 1
    seed: int = 0
    lr: float = 1e-4
    timeout: float = 600.0

    @property
    def num_params(self) -> int:
        w, h = self.width, self.hidden
        return w * w + w + self.blocks * (w * h + h + h * w + w)

    @property
    def replicate(self) -> int:
        if self.replicate_size:
            return self.replicate_size
        return self.world // self.ranks_per_node if self.ranks_per_node else 1


# ----------------------------------------------------------------- one rank


def _build_model(s: StepSettings) -> Any:
    import torch
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Linear(s.width, s.hidden)
            self.act = nn.GELU()
            self.down = nn.Linear(s.hidden, s.width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(self.act(self.up(x)))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(s.width, s.width)
            self.blocks = nn.ModuleList(Block() for _ in range(s.blocks))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.inp(x)
            for block in self.blocks:
                x = block(x)
            return x

    torch.manual_seed(s.seed)
    return MLP(), Block


def _keep_local(_state, bucket):  # type: ignore[no-untyped-def]
    """DDP comm hook of the fake backend: the bucket as it is, at once.

    Unannotated on purpose: DDP checks a hook's annotations against its own
    types, and this module's are strings."""
    import torch

    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _parallelize(model: Any, block_type: type, s: StepSettings, backend: str) -> Any:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    bf16 = s.mixed_precision == "bf16"
    if s.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model)
        if backend == "fake":
            # DDP expects its all-reduce's future to hold the bucket; the
            # fake backend's holds nothing.
            ddp.register_comm_hook(None, _keep_local)
        return ddp
    if s.strategy in ("fsdp2", "hsdp"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if s.strategy == "fsdp2":
            mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
        else:
            mesh = init_device_mesh(
                "cpu", (s.replicate, world // s.replicate), mesh_dim_names=("replicate", "shard")
            )
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None,
                                      reduce_dtype=torch.float32)
        for m in [model.inp, *model.blocks]:
            fully_shard(m, mesh=mesh, mp_policy=policy)
        return fully_shard(model, mesh=mesh, mp_policy=policy)

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    mesh = None
    if s.fsdp1_sharding == "HYBRID_SHARD":
        mesh = init_device_mesh(
            "cpu", (s.replicate, world // s.replicate), mesh_dim_names=("replicate", "shard")
        )
    return FSDP(
        model,
        sharding_strategy=ShardingStrategy[s.fsdp1_sharding],
        auto_wrap_policy=ModuleWrapPolicy({block_type}),
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16 if bf16 else None,
                                       reduce_dtype=torch.float32),
        device_id=torch.device("cpu"),
        device_mesh=mesh,
        use_orig_params=True,
    )


def _batch(s: StepSettings, rank: int, step: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(s.seed * 1_000_003 + rank * 10_007 + step)
    x = torch.randn(s.tokens, s.width, generator=g)
    return x, torch.randn(s.tokens, s.width, generator=g)


def _thread_times() -> tuple[float, float]:
    """CPU seconds of the calling thread, and seconds it was ready to run but
    waiting for a core (Linux's run-queue delay; 0 where it is not known)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            cpu_ns, queued_ns = f.read().split()[:2]
        return int(cpu_ns) / 1e9, int(queued_ns) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), 0.0


def _rank_main(backend: str, rank: int, s: StepSettings, conn: Any, init_file: str,
               env: dict[str, str]) -> None:  # pragma: no cover - runs in a child
    os.environ.update(env)
    try:
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F

        torch.set_num_threads(s.threads)
        # A fake step computes on buffers no collective ever filled; denormal
        # garbage there must not make it slower than a real step.
        torch.set_flush_denormal(True)
        timeout = datetime.timedelta(seconds=s.timeout)
        if backend == "fake":
            from torch.testing._internal.distributed.fake_pg import FakeStore

            dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=s.world,
                                    timeout=timeout)
        else:
            if backend == "smddp":
                import smddp  # noqa: F401
            dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                                    world_size=s.world, timeout=timeout)
        model, block_type = _build_model(s)
        model = _parallelize(model, block_type, s, backend)
        optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr)
        conn.send(("ok", None))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return

    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        try:
            x, y = _batch(s, rank, msg)
            # Lines the ranks up outside the timed region (a no-op on fake).
            dist.barrier()
            wall0, (cpu0, queued0) = time.perf_counter(), _thread_times()
            loss = F.mse_loss(model(x).float(), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            wall = time.perf_counter() - wall0
            cpu, queued = (t - t0 for t, t0 in zip(_thread_times(), (cpu0, queued0)))
            # The training thread sleeps only when blocked on communication.
            wait = max(0.0, wall - cpu - queued)
            conn.send(("ok", (wall, wait, queued, loss.item())))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
            break
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    # Skip interpreter teardown: nothing is left to flush, and a backend's
    # destructor must not turn a finished benchmark into a hang.
    os._exit(0)


# ------------------------------------------------------------------- parent


class BenchError(RuntimeError):
    pass


class _Ranks:
    """The ranks of one backend, started and waiting for step numbers."""

    def __init__(self, backend: str, s: StepSettings) -> None:
        self.backend = backend
        self.s = s
        ctx = mp.get_context("spawn")
        fd, self.init_file = tempfile.mkstemp(prefix=f"smddp-step-{backend}-")
        os.close(fd)
        os.unlink(self.init_file)
        env = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(s.threads)}
        if s.ranks_per_node:
            env["SMDDP_RANKS_PER_NODE"] = str(s.ranks_per_node)
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        for rank in range(s.world):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_rank_main, daemon=True, name=f"{backend}-rank{rank}",
                            args=(backend, rank, s, child, self.init_file, env))
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)

    def collect(self, what: str) -> list[Any]:
        """Every rank's answer; a rank that fails, dies or stays silent past
        the timeout fails the benchmark."""
        deadline = time.monotonic() + self.s.timeout
        results: list[Any] = [None] * len(self.conns)
        pending = dict(enumerate(self.conns))
        while pending:
            ready = mp.connection.wait(list(pending.values()),
                                       timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise BenchError(f"{self.backend}: {what}: ranks {sorted(pending)} silent for "
                                 f"{self.s.timeout:.0f} s")
            for rank, conn in list(pending.items()):
                if conn not in ready:
                    continue
                del pending[rank]
                try:
                    status, payload = conn.recv()
                except EOFError:
                    raise BenchError(f"{self.backend}: {what}: rank {rank} died "
                                     f"(exit code {self.procs[rank].exitcode})") from None
                if status != "ok":
                    raise BenchError(f"{self.backend}: {what} failed on rank {rank}:\n{payload}")
                results[rank] = payload
        return results

    def step(self, step: int) -> list[tuple[float, float, float, float]]:
        for conn in self.conns:
            conn.send(step)
        return self.collect(f"step {step}")

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        deadline = time.monotonic() + 10
        for p in self.procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        with contextlib.suppress(OSError):
            os.unlink(self.init_file)


@dataclass
class BackendResult:
    backend: str
    # Per timed step: the slowest rank's time (the step is as slow as it).
    step_s: list[float] = field(default_factory=list)
    # Per timed step, mean over ranks: time the training thread was blocked on
    # communication, and time it was ready but waited for a core.
    comm_wait_s: list[float] = field(default_factory=list)
    preempted_s: list[float] = field(default_factory=list)
    final_loss: float | None = None  # rank 0's, last timed step

    @property
    def median_s(self) -> float:
        return statistics.median(self.step_s)

    @property
    def median_wait_s(self) -> float:
        return statistics.median(self.comm_wait_s)

    @property
    def median_preempted_s(self) -> float:
        return statistics.median(self.preempted_s)


def run(s: StepSettings, progress: Any = None) -> dict[str, BackendResult]:
    """Runs the benchmark; returns the result of each backend."""
    say = progress or (lambda _msg: None)
    ranks: dict[str, _Ranks] = {}
    results = {b: BackendResult(b) for b in s.backends}
    try:
        for b in s.backends:
            ranks[b] = _Ranks(b, s)
        for b in s.backends:
            ranks[b].collect("start-up")
        say(f"ranks of {', '.join(s.backends)} ready; {s.warmup} warm-up step(s) each")
        for b in s.backends:
            for i in range(s.warmup):
                ranks[b].step(1_000_000 + i)
        for i in range(s.steps):
            for b in s.backends:
                answers = ranks[b].step(i)
                results[b].step_s.append(max(a[0] for a in answers))
                results[b].comm_wait_s.append(statistics.fmean(a[1] for a in answers))
                results[b].preempted_s.append(statistics.fmean(a[2] for a in answers))
                results[b].final_loss = answers[0][3]
            say(f"round {i + 1}/{s.steps}: "
                + ", ".join(f"{b} {results[b].step_s[-1]:.3f} s" for b in s.backends))
    finally:
        for r in ranks.values():
            r.close()
    return results


def format_table(s: StepSettings, results: dict[str, BackendResult]) -> str:
    fake = results.get("fake")
    ref = results.get("smddp")
    desc = (f"# {s.strategy} step, {s.world} ranks"
            + (f" ({s.world // s.ranks_per_node} nodes x {s.ranks_per_node})"
               if s.ranks_per_node else "")
            + f", {s.preset} ({s.num_params / 1e6:.2f} M parameters), "
            f"{'bf16' if s.mixed_precision == 'bf16' else 'fp32'}, {s.tokens} tokens per rank, "
            f"{s.threads} thread(s) per rank")
    lines = [
        desc,
        f"# median of {s.steps} interleaved steps after {s.warmup} warm-up; step = slowest "
        "rank; comm wait, preempted = mean over ranks of the time the training thread slept, "
        "and waited for a core",
        f"{'backend':>8} {'step (s)':>9} {'min (s)':>8} {'comm wait (s)':>14} "
        f"{'preempted (s)':>14} {'vs fake':>8} {'x smddp':>8} {'final loss':>11}",
    ]
    for b, r in results.items():
        over = "-"
        if fake and b != "fake":
            over = f"{(r.median_s - fake.median_s) / fake.median_s:+.1%}"
        ratio = f"{r.median_s / ref.median_s:.2f}" if ref else "-"
        loss = f"{r.final_loss:.6f}" if r.final_loss is not None and b != "fake" else "-"
        lines.append(f"{b:>8} {r.median_s:9.3f} {min(r.step_s):8.3f} {r.median_wait_s:14.3f} "
                     f"{r.median_preempted_s:14.3f} {over:>8} {ratio:>8} {loss:>11}")
    if ref and fake and "gloo" in results:
        g = results["gloo"]
        lines.append(
            f"# communication cost per step: smddp {ref.median_s - fake.median_s:+.3f} s, "
            f"gloo {g.median_s - fake.median_s:+.3f} s; smddp is {g.median_s / ref.median_s:.2f}x "
            "as fast as gloo"
        )
    return "\n".join(lines)


def to_record(s: StepSettings, results: dict[str, BackendResult]) -> dict[str, Any]:
    fake = results.get("fake")
    out: dict[str, Any] = {
        "benchmark": "step",
        "settings": {**asdict(s), "backends": list(s.backends), "num_params": s.num_params,
                     "preset_shape": PRESETS[s.preset].help if s.preset in PRESETS else None},
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None},
        "env": {k: v for k, v in os.environ.items() if k.startswith("SMDDP_")},
        "results": {},
    }
    for b, r in results.items():
        out["results"][b] = {
            "step_s": r.step_s,
            "comm_wait_s": r.comm_wait_s,
            "median_s": r.median_s,
            "median_comm_wait_s": r.median_wait_s,
            "preempted_s": r.preempted_s,
            "median_preempted_s": r.median_preempted_s,
            "overhead_vs_fake": (r.median_s - fake.median_s) / fake.median_s
            if fake and b != "fake" else None,
            "final_loss": r.final_loss,
        }
    return out


# ---------------------------------------------------------------------- CLI


def _default_threads(world: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // world)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="smddp-bench step",
        description="Time one training step on CPU with smddp, gloo and torch's fake backend "
        "(collectives that do nothing): the cost of communication per step.",
        epilog="presets:\n" + "\n".join(f"  {k:7s} {v.help}" for k, v in PRESETS.items())
        + "\n\nThe model is an MLP on random tokens with an MSE loss and AdamW. The ranks\n"
        "of every backend are started first and then take turns, one step each, so\n"
        "that the load of a shared machine falls on all of them alike. Each backend's\n"
        "ranks use --threads intra-op threads; only one backend computes at a time.\n\n"
        "step: the slowest rank's wall time of forward, backward and optimizer step.\n"
        "comm wait: the time the training thread slept in the step (wall time minus its\n"
        "CPU time and minus its run-queue delay, from /proc/thread-self/schedstat): it\n"
        "sleeps only when blocked on a collective. preempted: the run-queue delay, time\n"
        "lost to other processes; when it is large, the run was disturbed.",
        formatter_class=_HelpFormatter,
    )
    p.add_argument("--strategy", default="fsdp2", choices=STRATEGIES,
                   help="fsdp2: fully_shard on a 1-D mesh; hsdp: on a (replicate, shard) mesh; "
                   "fsdp1: FullyShardedDataParallel; ddp: DistributedDataParallel")
    p.add_argument("--fsdp1-sharding", default="FULL_SHARD",
                   choices=("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD"),
                   help="FSDP1's ShardingStrategy")
    p.add_argument("--preset", default="mlp34m", choices=tuple(PRESETS), help="model shape")
    p.add_argument("--width", type=int, default=0, help="override the preset's width")
    p.add_argument("--hidden", type=int, default=0, help="override the preset's block width")
    p.add_argument("--blocks", type=int, default=0, help="override the preset's block count")
    p.add_argument("--world", "-n", type=int, default=2, help="ranks per backend")
    p.add_argument("--ranks-per-node", type=int, default=0,
                   help="emulate nodes of this many ranks (SMDDP_RANKS_PER_NODE; 0: one node)")
    p.add_argument("--replicate-size", type=int, default=0,
                   help="hsdp/HYBRID_SHARD replicate dimension (0: the number of nodes)")
    p.add_argument("--tokens", type=int, default=128, help="tokens per rank and step")
    p.add_argument("--mixed-precision", default="none", choices=("none", "bf16"),
                   help="bf16 parameters for compute (gradients reduced in fp32)")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="comma-separated, from: " + ", ".join(BACKENDS))
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per backend")
    p.add_argument("--steps", type=int, default=5, help="timed steps per backend")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads per rank (0: the host's cores / --world)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the data")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds any rank may take to start or to finish a step")
    p.add_argument("--json", metavar="FILE", default="", help="also write the results here")
    return p


def parse_settings(argv: Sequence[str]) -> tuple[StepSettings, argparse.Namespace]:
    parser = build_parser()
    ns = parser.parse_args(list(argv))
    preset = PRESETS[ns.preset]
    backends = tuple(b.strip() for b in ns.backends.split(",") if b.strip())
    for b in backends:
        if b not in BACKENDS:
            parser.error(f"--backends: unknown backend {b!r} (choose from {', '.join(BACKENDS)})")
    if not backends or len(set(backends)) != len(backends):
        parser.error("--backends: name each backend once")
    if ns.world < 1 or ns.steps < 1 or ns.warmup < 0 or ns.tokens < 1:
        parser.error("--world, --steps and --tokens must be positive, --warmup not negative")
    if ns.ranks_per_node and ns.world % ns.ranks_per_node:
        parser.error(f"--ranks-per-node {ns.ranks_per_node} does not divide --world {ns.world}")
    s = StepSettings(
        strategy=ns.strategy,
        preset=ns.preset,
        width=ns.width or preset.width,
        hidden=ns.hidden or preset.hidden,
        blocks=ns.blocks or preset.blocks,
        world=ns.world,
        ranks_per_node=ns.ranks_per_node,
        replicate_size=ns.replicate_size,
        tokens=ns.tokens,
        mixed_precision=ns.mixed_precision,
        fsdp1_sharding=ns.fsdp1_sharding,
        backends=backends,
        warmup=ns.warmup,
        steps=ns.steps,
        threads=ns.threads or _default_threads(ns.world),
        seed=ns.seed,
        timeout=ns.timeout,
    )
    if s.world % s.replicate:
        parser.error(f"the replicate size {s.replicate} does not divide --world {s.world}")
    return s, ns


def main(argv: Sequence[str] | None = None) -> int:
    """``smddp-bench step``; returns the exit status."""
    try:
        s, ns = parse_settings(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # --help, or a usage error already printed
        return int(e.code or 0)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        print("smddp-bench step starts its own ranks, one set per backend: run it once, "
              "not under torchrun", file=sys.stderr)
        return 2
    print(f"# smddp-bench step: {s.strategy}, {s.world} ranks x {len(s.backends)} backends, "
          f"{s.preset} ({s.num_params:,} parameters)", flush=True)
    try:
        results = run(s, progress=lambda msg: print(f"# {msg}", file=sys.stderr, flush=True))
    except BenchError as e:
        print(f"smddp-bench step: {e}", file=sys.stderr)
        return EXIT_TIMEOUT if "silent for" in str(e) else EXIT_FAILURE
    print(format_table(s, results), flush=True)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(to_record(s, results), f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
