"""One rank of bench/peers.py for DeepSpeed, run with the python of its venv
(RANK, WORLD_SIZE, LOCAL_SIZE, MASTER_ADDR and MASTER_PORT set by the driver):

    .venv-peers/deepspeed/bin/python bench/peers_deepspeed.py SPEC

DeepSpeed on CPU (DS_ACCELERATOR=cpu) builds its shared-memory communication
op (op_builder ShareMemCommBuilder, csrc/cpu/comm/shm.cpp) when
``deepspeed.comm.init_distributed`` creates its TorchBackend; with every rank
on this host (LOCAL_SIZE == WORLD_SIZE) the op maps one segment per rank in
/dev/shm, and ``deepspeed.comm.inference_all_reduce`` sums float32, bfloat16
and float16 tensors through it in place: below 1 MiB every rank reduces all
buffers, above it each rank reduces a slice and copies the others' slices
(32 MiB at a time). Its waits spin without yielding. It has no AllGather or
ReduceScatter of its own, and for any other dtype, or a CPU without the ISA
its kernels need, it silently falls back to the process group's all_reduce:
this worker refuses to measure in that case instead.
"""

from __future__ import annotations

import datetime
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peers  # noqa: E402


class DeepSpeedComm(peers.TorchComm):
    """The barrier is a one-element shared-memory AllReduce: the op has no
    barrier, and gloo's would start the ranks less together than the
    shared-memory flags do."""

    def __init__(self, dscomm: Any, ctrl: Any):
        import torch

        token = torch.zeros(1, dtype=torch.float32)
        super().__init__(None, ctrl, barrier=lambda: dscomm.inference_all_reduce(token))


def shm_problem(cdb: Any, torch: Any) -> str | None:
    """Why inference_all_reduce would not take the shared-memory path."""
    if getattr(cdb, "shm_comm_op", None) is None:
        return "DeepSpeed did not build or load its shared-memory op (ShareMemCommBuilder)"
    if not hasattr(torch.ops, "deepspeed") or not hasattr(
        torch.ops.deepspeed, "inference_all_reduce_"
    ):
        return "torch.ops.deepspeed.inference_all_reduce_ is not registered"
    if getattr(cdb, "shm_vector_kernel_level", 0) < 2:
        return "this CPU lacks AVX-512BW, which the bfloat16 shared-memory kernels need"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    spec = peers.load_spec(argv[0])
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if os.environ.get("LOCAL_SIZE") != os.environ.get("WORLD_SIZE"):
        # Without it the op skips its set-up and the first call dereferences nothing.
        raise SystemExit("peers_deepspeed.py: LOCAL_SIZE must equal WORLD_SIZE")
    import torch
    import torch.distributed as dist

    import deepspeed
    import deepspeed.comm as dscomm
    from deepspeed.comm import comm as dscomm_state

    torch.set_num_threads(1)
    dscomm.init_distributed(
        dist_backend="gloo",
        auto_mpi_discovery=False,
        verbose=False,
        timeout=datetime.timedelta(seconds=spec["pg_timeout"]),
    )
    try:
        problem = shm_problem(dscomm_state.cdb, torch)
        if problem:
            raise RuntimeError(problem)
        comm = DeepSpeedComm(dscomm, dist.group.WORLD)

        def call(op: str, out: Any, inp: Any) -> None:
            assert op == "all_reduce"
            dscomm.inference_all_reduce(out)

        info = {
            "deepspeed": deepspeed.__version__,
            "torch": torch.__version__,
            "shm_vector_kernel_level": dscomm_state.cdb.shm_vector_kernel_level,
        }
        peers.run_points(
            spec, comm, lambda p: peers.TorchCase(p, comm.rank, comm.world, call), info
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    peers.worker_exit(main())
