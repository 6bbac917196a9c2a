"""``smddp-bench``: smddp against its rival, side by side, nccl-tests style.

smddp-bench                                   # the default sweep (make bench)
smddp-bench --nproc 8 --nodes 2 --op all -b 4K -e 256M -f 4
torchrun --nproc-per-node 8 -m smddp.bench --op all_gather
smddp-bench model --preset p4d --nodes 16,128 --sizes 64M,256M
smddp-bench calibrate                         # the model's constants for this host
smddp-bench step ...                          # the FSDP training-step benchmark
smddp-bench render docs/performance.md        # the docs' tables from their records
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import torch

from smddp.bench import cluster_run, launch, sweep, timing
from smddp.bench import ops as _ops
from smddp.bench.units import OP_ALIASES, HelpFormatter, SizeOptions, arg, at_least, choose
from smddp.bench.units import format_size, positive

DEFAULT_JSON = os.path.join("bench-results", "bench.json")
DEFAULT_PLOT = os.path.join("bench-results", "bench.png")
SIZES = SizeOptions(minbytes="4K", maxbytes="64M", factor=4.0)
TIMING_OPTIONS = ("policy", "warmup", "block_warmup", "iters", "time_per_point", "min_iters",
                  "max_iters", "rounds")  # fmt: skip

_KNOWN_BACKENDS = ("smddp", "gloo", "nccl", "ucc", "mpi", "xccl")


def parse_backends(text: str, device: str) -> tuple[str, ...]:
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError("no backend given")
    for n in names:
        base, colon, variant = n.partition(":")
        if base not in _KNOWN_BACKENDS:
            raise ValueError(f"unknown backend {n!r} (choose from {', '.join(_KNOWN_BACKENDS)})")
        if colon and (base != "smddp" or variant not in sweep.SMDDP_VARIANTS):
            raise ValueError(f"unknown backend {n!r}: a variant of smddp is one of "
                             + ", ".join(f"smddp:{v}" for v in sweep.SMDDP_VARIANTS))  # fmt: skip
    import torch.distributed as dist

    for n in names:
        available = getattr(dist, f"is_{n}_available", None)
        if not n.startswith("smddp") and available is not None and not available():
            raise ValueError(f"backend {n!r} is not built into this torch")
    if len(set(names)) != len(names):
        raise ValueError(f"a backend is listed twice: {text!r}")
    if device == "cpu" and "nccl" in names:
        raise ValueError("nccl runs on CUDA tensors only; on CPU compare smddp with gloo (or "
                         "pass --device cuda)")  # fmt: skip
    return tuple(names)


def _gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="smddp-bench",
        description="Benchmark smddp against its rival (gloo on CPU, nccl on GPU) in one run, "
        "interleaved on the same buffers, and print nccl-tests-style tables with a ratio column.",
        epilog="Other commands: 'smddp-bench model --help' (the cost model: flat ring against "
        "smddp's hierarchical schedule), 'smddp-bench calibrate --help' (the model's constants "
        "fitted on this host), 'smddp-bench step --help' (the FSDP training-step benchmark), "
        "'smddp-bench render --help' (the docs' tables from benchmark records). Under torchrun "
        "or any launcher that sets RANK and WORLD_SIZE, smddp-bench runs as one rank and spawns "
        "nothing.",
        formatter_class=HelpFormatter,
    )
    g = p.add_argument_group("ranks")
    g.add_argument("--nproc", type=at_least(1),
                   help="ranks to launch (default: the GPUs of this host, or 4 without GPU)")
    g.add_argument("--nodes", type=at_least(1),
                   help="emulate this many nodes: SMDDP_RANKS_PER_NODE=nproc/nodes in the ranks "
                   "(default: SMDDP_RANKS_PER_NODE if set; else 2 without GPU when nproc is even "
                   "and >= 4; else 1)")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="tensor device")
    g.add_argument("--backends", default=None,
                   help="comma list; the first is compared with each other one (default: "
                   "smddp,gloo on CPU, smddp,nccl on GPU); smddp:ring and smddp:hierarchical are "
                   "smddp with that SMDDP_ALGO")
    g = p.add_argument_group("what to run")
    g.add_argument("--op", dest="ops", metavar="OP", default=",".join(_ops.DEFAULT_OPS),
                   type=arg(lambda text: choose(text, _ops.OPS, "op", OP_ALIASES)),
                   help=f"comma list of {', '.join(_ops.OPS)}, or all")
    SIZES.add(g)
    g.add_argument("-d", "--dtype", dest="dtypes", metavar="DTYPE", default="float32",
                   type=arg(lambda text: choose(text, _ops.DTYPES, "dtype", _ops.DTYPE_ALIASES)),
                   help=f"comma list of {', '.join(_ops.DTYPES)}")
    g.add_argument("-o", "--redop", default="sum", choices=_ops.REDOPS, help="reduction")
    g.add_argument("-r", "--root", type=int, default=0, help="root of broadcast")
    g.add_argument("--inplace", action="store_true",
                   help="in place, as nccl-tests' in-place columns: AllGather's input is the "
                   "rank's block of its output (FSDP2 gathers this way), ReduceScatter's output "
                   "is the rank's block of its input (AllReduce and broadcast are always in place)")
    g = p.add_argument_group("how long")
    timing.add_options(g, timing.Timing(), TIMING_OPTIONS)
    g.add_argument("--timeout", type=positive, default=1800.0,
                   help="seconds the whole run may take before it is killed")
    g.add_argument("--pg-timeout", type=positive, default=120.0,
                   help="seconds one collective may take")
    g = p.add_argument_group("output")
    g.add_argument("--json", default=DEFAULT_JSON, help="JSON record of every sample")
    g.add_argument("--plot", default=DEFAULT_PLOT, help="PNG plot of busbw against size")
    g.add_argument("--no-save", action="store_true", help="write neither the JSON nor the plot")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    cluster_run.add_arguments(p)
    return p


def resolve(ns: argparse.Namespace, parser: argparse.ArgumentParser, argv: list[str],
            external_world: int | None = None) -> tuple[argparse.Namespace, int, int | None]:
    """Checks the arguments; returns the settings (``ns``, completed: what a
    rank needs, picklable), the world size and the ranks per node to emulate
    (None: leave SMDDP_RANKS_PER_NODE alone)."""
    gpus = _gpu_count()
    ns.device = ns.device if ns.device != "auto" else ("cuda" if gpus else "cpu")
    if ns.device == "cuda" and not gpus:
        parser.error("--device cuda: this host has no usable CUDA GPU")
    try:
        ns.backends = parse_backends(
            ns.backends or ("smddp,nccl" if ns.device == "cuda" else "smddp,gloo"), ns.device
        )
        ns.sizes = tuple(SIZES.parse(ns))
    except ValueError as e:
        parser.error(str(e))
    if external_world is not None and ns.nproc not in (None, external_world):
        parser.error(f"--nproc {ns.nproc} disagrees with WORLD_SIZE={external_world} set by the "
                     "launcher")  # fmt: skip
    world = external_world or ns.nproc or (gpus if ns.device == "cuda" else 4)
    rpn: int | None = None
    if ns.nodes is not None:
        if world % ns.nodes:
            parser.error(f"--nodes {ns.nodes} does not divide {world} ranks into equal nodes")
        rpn = world // ns.nodes
    elif external_world is None and not os.environ.get("SMDDP_RANKS_PER_NODE"):
        rpn = world // 2 if ns.device == "cpu" and world >= 4 and world % 2 == 0 else world
    if not 0 <= ns.root < world:
        parser.error(f"--root {ns.root} is not a rank of {world}")
    ns.timing = timing.from_options(ns, timing.Timing(), parser)
    ns.json, ns.plot = (None, None) if ns.no_save else (ns.json or None, ns.plot or None)
    ns.launcher = "external" if external_world is not None else "spawn"
    ns.argv = ["smddp-bench", *argv]
    return ns, world, rpn


def parse_run_args(argv: list[str]) -> tuple[argparse.Namespace, int, int | None]:
    """The settings a command line asks for (SystemExit(2) with a message if
    it is wrong), as if smddp-bench spawned the ranks itself."""
    parser = build_parser()
    return resolve(parser.parse_args(argv), parser, argv)


def describe(s: argparse.Namespace, world: int, rpn: int | None) -> str:
    """The header of a run: what runs where, and how it is timed."""
    rpn = rpn or int(os.environ.get("SMDDP_RANKS_PER_NODE") or 0) or None
    nodes = -(-world // rpn) if rpn else None
    shape = f"{world} ranks" + (f" = {nodes} nodes x {rpn}" if nodes and nodes > 1 else "")
    span = (format_size(s.sizes[0]) if len(s.sizes) == 1 else
            f"{format_size(s.sizes[0])}..{format_size(s.sizes[-1])} ({len(s.sizes)} sizes)")
    return (f"# smddp-bench: {shape} on {s.device}; {' vs '.join(s.backends)}; "
            f"{', '.join(s.ops)}; {', '.join(s.dtypes)}; {span}\n# {s.timing.describe()}")


def run(argv: list[str]) -> int:
    """The benchmark sweep (the default command)."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    shape = cluster_run.check_arguments(ns, parser) if ns.cluster else None
    if shape and not launch.launched_externally():
        return cluster_run.run(ns, parser, argv, *shape)
    if launch.launched_externally():
        settings, world, rpn = resolve(ns, parser, argv, int(os.environ["WORLD_SIZE"]))
        if shape:  # one rank of the cluster's torchrun
            cluster_run.as_rank(settings, parser)
        elif not os.environ.get("MASTER_ADDR") or not os.environ.get("MASTER_PORT"):
            parser.error("RANK and WORLD_SIZE are set but MASTER_ADDR/MASTER_PORT are not: "
                         "start smddp-bench with torchrun, or unset RANK to let it spawn its ranks")
        if rpn is not None:
            os.environ["SMDDP_RANKS_PER_NODE"] = str(rpn)
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        return sweep.run_rank(settings, int(os.environ["RANK"]), world, "env://", local_rank)

    settings, world, rpn = resolve(ns, parser, argv)
    print(describe(settings, world, rpn), flush=True)
    started = time.monotonic()
    # Another way of starting the ranks (one torchrun per emulated host) adds
    # commands to the same Ranks instead: they run `python -m smddp.bench ARGV`
    # and find RANK and WORLD_SIZE set.
    with launch.Ranks("smddp-bench") as ranks:
        ranks.spawn(sweep.run_rank, world, (settings,),
                    {"SMDDP_RANKS_PER_NODE": str(rpn)} if rpn is not None else {})  # fmt: skip
        code = ranks.wait(ns.timeout)
    print(f"# wall time: {time.monotonic() - started:.1f} s", flush=True)
    return code


# The other commands: the module whose main runs it, and what main takes besides argv.
COMMANDS: dict[str, tuple[str, dict]] = {
    "model": ("smddp.bench.model", {}),
    "calibrate": ("smddp.bench.model", {"prog": "smddp-bench calibrate", "calibrate": True}),
    "step": ("smddp.bench.step", {}),
    "render": ("smddp.bench.render", {}),
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``smddp-bench`` and ``python -m smddp.bench``."""
    args = list(sys.argv[1:] if argv is None else argv)
    name = args[0] if args else ""
    if name not in COMMANDS:
        return run(args[1:] if name == "run" else args)
    module, kwargs = COMMANDS[name]
    try:
        command = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        print(f"smddp-bench {name}: not available in this installation (the module {module} is "
              "missing)", file=sys.stderr)  # fmt: skip
        return 2
    return int(command.main(args[1:], **kwargs) or 0)
