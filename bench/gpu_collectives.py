"""AllGather, ReduceScatter and AllReduce of smddp's CUDA path with several
ranks sharing one GPU (CUDA IPC between processes on the same device).

    python bench/gpu_collectives.py [--nproc 2] [--sizes 1M,16M] [-n 20] [--json FILE]

The smddp-bench sweep (nccl-tests' size, algbw and busbw; every result
checked) with smddp alone on CUDA tensors, every rank on the first visible
GPU (SMDDP_CUDA_RANKS_PER_GPU = --nproc), and a barrier before every call:
time = median over calls of the slowest rank's time, the device synchronized.
Exit status 0, or 3 if a result was wrong.
"""

from __future__ import annotations

import argparse
import os
import sys

if __package__ in (None, ""):  # run as a script: the repository's root is one folder up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2, help="ranks, all on one GPU")
    p.add_argument("--sizes", default="1M,16M,64M,256M", help="nccl-tests sizes")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed calls per size")
    p.add_argument("--json", default=None, help="the smddp-bench record")
    args = p.parse_args(argv)
    from smddp.bench import cli

    gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    os.environ.update(CUDA_VISIBLE_DEVICES=gpu, SMDDP_CUDA_RANKS_PER_GPU=str(args.nproc))
    sweep = ["--device", "cuda", "--backends", "smddp", "--nproc", str(args.nproc), "--nodes", "1",
             "--op", "all_gather,reduce_scatter,all_reduce", "--sizes", args.sizes, "-n",
             str(args.iters), "--timing", "barrier-each", "--rounds", "1", "--block-warmup", "0",
             "-w", "3", "--timeout", "600", "--no-progress", "--plot", ""]
    return cli.main(sweep + (["--json", args.json] if args.json else ["--no-save"]))


if __name__ == "__main__":
    sys.exit(main())
