#!/usr/bin/env python3
"""Train a small GPT on synthetic tokens with FSDP2, HSDP, FSDP1 or DDP.

    torchrun --nproc-per-node 2 examples/train_fsdp.py --backend smddp
    torchrun --nproc-per-node 2 examples/train_fsdp.py --backend gloo

The training code is plain PyTorch: the backend is a string given to
``init_process_group``, and nothing else changes between smddp, gloo and
nccl. ``import smddp`` registers the backend (torch >= 2.14 finds it through
its entry point without the import).

Every rank builds the same model from ``--seed`` and reads its own
deterministic batch for each step, so two runs with the same flags train
identically, whatever the backend, and a run resumed from a checkpoint
continues exactly where the first one was.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

import smddp  # noqa: F401  (registers backend="smddp")

# The model and its wrapping, shared with `smddp-bench step`.
from smddp._gpt import (
    DTYPES,
    FSDP1_SHARDING,
    GPT,
    STRATEGIES,
    GPTConfig,
    parallelize,
    synthetic_batch,
    thread_times,
)


def mesh_report(mesh: DeviceMesh) -> dict[str, dict[str, Any]]:
    """For each mesh dimension, this rank's group: its global ranks and, on
    smddp, the backend's own view of its topology (nodes x ranks per node)."""
    out: dict[str, dict[str, Any]] = {}
    for dim, name in enumerate(mesh.mesh_dim_names or ()):
        group = mesh.get_group(dim)
        entry: dict[str, Any] = {"ranks": dist.get_process_group_ranks(group)}
        with contextlib.suppress(Exception):
            backend = group._get_backend(torch.device(mesh.device_type))
            if hasattr(backend, "topology"):
                entry["topology"] = backend.topology()
        out[name] = entry
    return out


@dataclasses.dataclass
class StepResult:
    step: int
    loss: float  # this rank's loss on its own batch
    grad_norm: float | None  # the global norm before clipping
    seconds: float  # wall time of forward, backward and optimizer step
    # CPU runs only: seconds the training thread slept (blocked on
    # communication), and seconds it waited for a core.
    comm_wait: float | None
    preempted: float | None


class Trainer:
    """Model, optimizer and data of one rank; the process group must exist."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank = dist.get_rank()
        self.device = pick_device(args)
        self.cfg = GPTConfig(args.vocab, args.seq_len, args.width, args.layers, args.heads)
        torch.manual_seed(args.seed)  # the same initial weights on every rank
        model = GPT(self.cfg).to(self.device)
        self.num_params = sum(p.numel() for p in model.parameters())
        self.model, self.mesh = parallelize(model, args, self.device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01
        )
        autocast = args.strategy == "ddp" and args.mixed_precision == "bf16"
        self._autocast = (
            (lambda: torch.autocast(self.device.type, dtype=torch.bfloat16))
            if autocast
            else contextlib.nullcontext
        )

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self, step: int) -> StepResult:
        """Trains on batch number ``step``."""
        a = self.args
        inputs, targets = synthetic_batch(self.cfg, a.batch, a.seed, self.rank, step, self.device)
        self._sync()
        wall0, (cpu0, queued0) = time.perf_counter(), thread_times()
        with self._autocast():
            logits = self.model(inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        loss.backward()
        norm = self._clip_gradients()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._sync()
        wall = time.perf_counter() - wall0
        cpu, queued = (t - t0 for t, t0 in zip(thread_times(), (cpu0, queued0)))
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        on_cpu = self.device.type == "cpu"
        return StepResult(
            step=step,
            loss=loss.item(),
            grad_norm=None if norm is None else norm.item(),
            seconds=wall,
            comm_wait=max(0.0, wall - cpu - queued) if on_cpu else None,
            preempted=queued if on_cpu else None,
        )

    def _clip_gradients(self) -> torch.Tensor | None:
        if not self.args.grad_clip:
            return None
        if hasattr(self.model, "clip_grad_norm_"):  # FSDP1 knows its shards
            return self.model.clip_grad_norm_(self.args.grad_clip)
        return nn.utils.clip_grad_norm_(self.model.parameters(), self.args.grad_clip)

    def save(self, path: str | Path) -> None:
        """Saves the sharded model and optimizer (each rank writes its shards)."""
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))

    def load(self, path: str | Path) -> None:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
        )

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter, unsharded, on every rank (a collective)."""
        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        return {k: v.detach().cpu() for k, v in sd.items()}


def pick_device(args: argparse.Namespace) -> torch.device:
    kind = args.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() and args.backend != "gloo" else "cpu"
    if kind == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def checkpoint_path(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def latest_checkpoint(root: str | Path) -> tuple[Path, int] | None:
    found = sorted(Path(root).glob("step_[0-9]*")) if Path(root).is_dir() else []
    if not found:
        return None
    return found[-1], int(found[-1].name.split("_")[1])


def default_threads() -> int:
    """The host's cores shared among the ranks on it (at least one each)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))


# ---------------------------------------------------------------------- CLI

EPILOG = """\
Logged on rank 0 each step: the loss (mean over ranks), tokens/s (tokens of
all ranks over rank 0's step time), the step time, and the time spent waiting
on communication.

How the communication wait is measured: on CPU, the time the training thread
slept during the step, which is the step's wall time minus the thread's CPU
time and minus the time it was ready to run but waiting for a core (both
from /proc/thread-self/schedstat on Linux; elsewhere time.thread_time, and
preemption counts as waiting). The training thread runs the model itself
(intra-op threads only split single operators) and never sleeps for
anything but a collective, so this is the time spent blocked on
communication wherever it happens: an all-gather FSDP waits for, a
reduce-scatter, DDP's last buckets, the gradient-norm all-reduce, without
hooking any of them. The value printed is the mean over ranks; the summary
also gives the time lost to preemption by other processes. On GPUs the host
thread also waits for kernels, so the column is not shown there; use
torch.profiler instead.

Threads: with N ranks on a host of C cores, each rank uses max(1, C // N)
intra-op threads by default, so ranks do not fight over cores; on a 2-core
host with 2 or more ranks this is 1.

Examples:
  torchrun --nproc-per-node 2 examples/train_fsdp.py --backend smddp
  torchrun --nproc-per-node 2 examples/train_fsdp.py --strategy ddp
  SMDDP_RANKS_PER_NODE=2 torchrun --nproc-per-node 4 examples/train_fsdp.py \\
      --strategy hsdp        # 2 emulated nodes x 2 ranks: shard inside a node
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train_fsdp.py",
        description="Train a small GPT on synthetic tokens with FSDP2, HSDP, FSDP1 or DDP "
        "(run under torchrun).",
        epilog=EPILOG,
        formatter_class=_HelpFormatter,
    )
    g = p.add_argument_group("distribution")
    g.add_argument("--backend", default="smddp", choices=("smddp", "gloo", "nccl"),
                   help="process-group backend")
    g.add_argument("--strategy", default="fsdp2", choices=STRATEGIES,
                   help="fsdp2: fully_shard on a 1-D mesh; hsdp: fully_shard on a "
                   "(replicate, shard) mesh; fsdp1: FullyShardedDataParallel (see "
                   "--fsdp1-sharding); ddp: DistributedDataParallel")
    g.add_argument("--fsdp1-sharding", default="FULL_SHARD", choices=FSDP1_SHARDING,
                   help="FSDP1's ShardingStrategy; HYBRID_SHARD shards inside a node and "
                   "replicates across nodes, like hsdp")
    g.add_argument("--ddp-bucket-mb", type=float, default=25.0,
                   help="ddp: gradient bucket size in MiB (each bucket is one all-reduce, "
                   "launched as soon as its gradients are ready)")
    g.add_argument("--ddp-powersgd-rank", type=int, default=0,
                   help="ddp: compress gradients with PowerSGD of this rank from the third "
                   "step (0: off)")
    g.add_argument("--replicate-size", type=int, default=0,
                   help="hsdp and HYBRID_SHARD: size of the replicate dimension (0: the number "
                   "of nodes, as smddp sees them or from torchrun's LOCAL_WORLD_SIZE)")
    g.add_argument("--mixed-precision", default="none", choices=("none", "bf16"),
                   help="bf16: compute in bfloat16 with fp32 master weights (FSDP's "
                   "mixed-precision policy; autocast for ddp)")
    g.add_argument("--reduce-dtype", default="fp32", choices=tuple(DTYPES),
                   help="dtype of the gradient reduction (ddp: bf16 uses the "
                   "bf16_compress_hook)")
    g.add_argument("--reduce-divide-factor", type=float, default=0.0,
                   help="fsdp2/hsdp: divide summed gradients by this instead of the world "
                   "size (FSDP2's set_gradient_divide_factor, formerly "
                   "set_reduce_scatter_divide_factor: a PREMUL_SUM reduce-scatter; gloo, "
                   "which lacks it, sums then divides); 0: average")
    g.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto: the GPU of LOCAL_RANK when there is one (and the backend is "
                   "not gloo), else the CPU")
    g.add_argument("--threads", type=int, default=0,
                   help="intra-op threads per rank (0: the host's cores / ranks on the host)")

    g = p.add_argument_group("model")
    g.add_argument("--layers", type=int, default=4, help="transformer blocks")
    g.add_argument("--width", type=int, default=128, help="embedding width")
    g.add_argument("--heads", type=int, default=4, help="attention heads")
    g.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
    g.add_argument("--vocab", type=int, default=512, help="vocabulary size")
    g.add_argument("--batch", type=int, default=8, help="sequences per rank and step")

    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, default=20,
                   help="train until this step (a resumed run continues to it)")
    g.add_argument("--seed", type=int, default=0, help="seed of the weights and the data")
    g.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    g.add_argument("--grad-clip", type=float, default=1.0,
                   help="clip the global gradient norm to this (0: off)")
    g.add_argument("--warmup", type=int, default=2,
                   help="steps left out of the summary's timing")
    g.add_argument("--log-every", type=int, default=1, help="log every N steps")

    g = p.add_argument_group("checkpoints")
    g.add_argument("--checkpoint-dir", default="",
                   help="save the sharded model and optimizer here (torch.distributed."
                   "checkpoint), as step_NNNNNN/")
    g.add_argument("--checkpoint-every", type=int, default=0,
                   help="save every N steps (0: only after the last step)")
    g.add_argument("--resume", action="store_true",
                   help="load the latest checkpoint of --checkpoint-dir and continue after it")
    return p


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.resume and not args.checkpoint_dir:
        raise SystemExit("--resume needs --checkpoint-dir")
    if args.backend == "nccl" and args.device == "cpu":
        raise SystemExit("--backend nccl needs --device cuda (or auto on a GPU host)")
    return args


def log(msg: str) -> None:
    if dist.get_rank() == 0:
        print(msg, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads or default_threads())
    pick_device(args)  # binds this rank's GPU before the group exists
    dist.init_process_group(args.backend)
    try:
        status = train(args)
        # Every rank is done with the group before any tears it down: gloo
        # aborts a process whose peers close their connections while its
        # own teardown is still under way.
        dist.barrier()
        return status
    finally:
        dist.destroy_process_group()


def train(args: argparse.Namespace) -> int:
    trainer = Trainer(args)
    world = dist.get_world_size()
    log(
        f"{args.strategy} on {world} ranks, backend {args.backend}, {trainer.device.type}, "
        f"{trainer.num_params / 1e6:.2f} M parameters, precision {args.mixed_precision}, "
        f"{torch.get_num_threads()} thread(s) per rank"
    )
    if trainer.mesh is not None and trainer.mesh.ndim == 2:
        for name, entry in mesh_report(trainer.mesh).items():
            topo = entry.get("topology")
            where = f", {topo['nodes']} node(s) x {topo['local_size']}" if topo else ""
            log(f"  rank 0's {name} group: ranks {entry['ranks']}{where}")

    first = 1
    if args.resume:
        found = latest_checkpoint(args.checkpoint_dir)
        if found is None:
            log(f"no checkpoint in {args.checkpoint_dir}: starting afresh")
        else:
            trainer.load(found[0])
            first = found[1] + 1
            log(f"resumed from {found[0]}")

    tokens = args.batch * args.seq_len * world
    times: list[float] = []
    waits: list[float] = []
    preempted: list[float] = []
    for step in range(first, args.steps + 1):
        r = trainer.step(step)
        # One all-reduce for the log line, outside the timed step.
        stats = torch.tensor(
            [r.loss, r.comm_wait or 0.0, r.preempted or 0.0],
            dtype=torch.float64,
            device=trainer.device,
        )
        dist.all_reduce(stats)
        loss, wait, queued = (stats / world).tolist()
        if step - first >= args.warmup:
            times.append(r.seconds)
            waits.append(wait)
            preempted.append(queued)
        if step % args.log_every == 0 or step == args.steps:
            comm = (
                f" | comm wait {wait * 1e3:7.1f} ms ({wait / r.seconds:4.0%})"
                if r.comm_wait is not None
                else ""
            )
            norm = f" | grad norm {r.grad_norm:6.3f}" if r.grad_norm is not None else ""
            log(
                f"step {step:5d} | loss {loss:.4f}{norm} | {tokens / r.seconds:10,.0f} tok/s | "
                f"step {r.seconds * 1e3:7.1f} ms{comm}"
            )
        every = args.checkpoint_every
        if args.checkpoint_dir and ((every and step % every == 0) or step == args.steps):
            trainer.save(checkpoint_path(args.checkpoint_dir, step))
            log(f"saved {checkpoint_path(args.checkpoint_dir, step)}")

    if times:
        t = statistics.median(times)
        comm = ""
        if trainer.device.type == "cpu":
            comm = (
                f", comm wait {statistics.median(waits) * 1e3:.1f} ms, "
                f"preempted {statistics.median(preempted) * 1e3:.1f} ms"
            )
        log(f"median over {len(times)} steps: {t * 1e3:.1f} ms/step, {tokens / t:,.0f} tok/s{comm}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
