"""The model that examples/train_fsdp.py trains and ``smddp-bench step`` times:
a small GPT (token and position embeddings, causal self-attention blocks with
an MLP, LayerNorm, an LM head) on synthetic tokens, and how it is wrapped for
FSDP2, HSDP, FSDP1 or DDP. A workload, not part of smddp's API: one
definition, in the package so that an installed smddp runs the step
benchmark; the example imports it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

STRATEGIES = ("fsdp2", "hsdp", "fsdp1", "ddp")
FSDP1_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


# --------------------------------------------------------------------- model


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 512
    seq_len: int = 64
    width: int = 128
    layers: int = 4
    heads: int = 4
    hidden: int = 0  # inner width of each block's MLP; 0: 4 x width


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if cfg.width % cfg.heads:
            raise ValueError(f"--width {cfg.width} is not a multiple of --heads {cfg.heads}")
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (
            z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
            for z in self.qkv(x).split(c, dim=-1)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.width)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.width)
        hidden = cfg.hidden or 4 * cfg.width
        self.mlp = nn.Sequential(
            nn.Linear(cfg.width, hidden), nn.GELU(), nn.Linear(hidden, cfg.width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.width)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab_size, bias=False)
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2's scheme: the projections that write into the residual stream
        # are scaled down so its variance does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln" in name:
                nn.init.ones_(p)
            elif name.endswith(("attn.proj.weight", "mlp.2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * self.cfg.layers))
            else:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def synthetic_batch(
    cfg: GPTConfig, batch: int, seed: int, rank: int, step: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets for one rank and one step.

    Each sequence counts from a random start with a random stride (mod the
    vocabulary), and a tenth of its tokens are replaced by noise: a pattern a
    small model learns within tens of steps, so the loss visibly falls. The
    batch depends only on (seed, rank, step), which is what makes runs
    comparable across backends and resumable.
    """
    g = torch.Generator().manual_seed(
        (seed * 0x9E3779B1 + rank * 0x85EBCA77 + step * 0xC2B2AE3D) % (1 << 62)
    )
    v, n = cfg.vocab_size, cfg.seq_len + 1
    start = torch.randint(v, (batch, 1), generator=g)
    stride = torch.randint(1, 8, (batch, 1), generator=g)
    tokens = (start + stride * torch.arange(n)) % v
    noise = torch.rand(batch, n, generator=g) < 0.1
    tokens = torch.where(noise, torch.randint(v, (batch, n), generator=g), tokens)
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)


# ------------------------------------------------------------- parallelism


def nodes_in_job() -> int:
    """How many nodes the world spans, as the backend sees them.

    smddp knows its nodes, including emulated ones (SMDDP_RANKS_PER_NODE);
    for other backends torchrun's LOCAL_WORLD_SIZE tells.
    """
    world = dist.get_world_size()
    with contextlib.suppress(Exception):
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        if hasattr(backend, "topology"):
            return int(backend.topology()["nodes"])
    return max(1, world // int(os.environ.get("LOCAL_WORLD_SIZE", world)))


def make_mesh(device_type: str, replicate: int) -> DeviceMesh:
    """A (replicate, shard) mesh over the world, shard groups made of
    consecutive ranks: with torchrun's node-major rank order, a shard group
    is inside one node and a replicate group takes one rank of each node."""
    world = dist.get_world_size()
    if replicate < 1 or world % replicate:
        raise ValueError(f"--replicate-size {replicate} does not divide the world size {world}")
    return init_device_mesh(
        device_type, (replicate, world // replicate), mesh_dim_names=("replicate", "shard")
    )


def parallelize(
    model: GPT, args: argparse.Namespace, device: torch.device
) -> tuple[nn.Module, DeviceMesh | None]:
    """Wraps ``model`` for ``args.strategy``; returns it and its mesh."""
    world = dist.get_world_size()
    bf16 = args.mixed_precision == "bf16"
    reduce_dtype = DTYPES[args.reduce_dtype]
    if args.reduce_divide_factor and args.strategy not in ("fsdp2", "hsdp"):
        raise ValueError("--reduce-divide-factor needs --strategy fsdp2 or hsdp")
    if args.ddp_powersgd_rank and (args.strategy != "ddp" or reduce_dtype != torch.float32):
        raise ValueError("--ddp-powersgd-rank needs --strategy ddp and --reduce-dtype fp32")

    if args.strategy == "ddp":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=args.ddp_bucket_mb,
        )
        if reduce_dtype == torch.bfloat16:
            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        if args.ddp_powersgd_rank:
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

            # Its callbacks issue all-reduces and wait for them.
            state = powerSGD_hook.PowerSGDState(
                process_group=None,
                matrix_approximation_rank=args.ddp_powersgd_rank,
                start_powerSGD_iter=2,
                min_compression_rate=0.5,
            )
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return ddp, None

    if args.strategy in ("fsdp2", "hsdp"):
        if args.strategy == "fsdp2":
            mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
        else:
            mesh = make_mesh(device.type, args.replicate_size or nodes_in_job())
        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
            if bf16
            else MixedPrecisionPolicy(reduce_dtype=reduce_dtype)
        )
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        if args.reduce_divide_factor:
            # gloo has no PREMUL_SUM: FSDP then sums and divides afterwards.
            force_sum = dist.get_backend() == "gloo"
            for m in model.modules():
                if isinstance(m, FSDPModule):
                    m.set_gradient_divide_factor(args.reduce_divide_factor)
                    m.set_force_sum_reduction_for_comms(force_sum)
        return model, mesh

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    mesh = None
    if args.fsdp1_sharding == "HYBRID_SHARD":
        mesh = make_mesh(device.type, args.replicate_size or nodes_in_job())
    wrapped = FSDP(
        model,
        sharding_strategy=ShardingStrategy[args.fsdp1_sharding],
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        mixed_precision=MixedPrecision(
            param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype, buffer_dtype=torch.bfloat16
        )
        if bf16
        else MixedPrecision(reduce_dtype=reduce_dtype),
        # FSDP1 otherwise assumes a GPU per rank.
        device_id=device,
        device_mesh=mesh,
        use_orig_params=True,
    )
    return wrapped, mesh


def thread_times() -> tuple[float, float]:
    """CPU seconds of the calling thread, and seconds it was ready to run but
    waiting for a core (Linux's run-queue delay; 0 where it is not known)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            cpu_ns, queued_ns = f.read().split()[:2]
        return int(cpu_ns) / 1e9, int(queued_ns) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), 0.0
