"""One rank of the peer comparison for DeepSpeed's shared-memory AllReduce
(``deepspeed.comm.inference_all_reduce`` on CPU; bench/README.md says how it
works), run with the python of its venv, RANK etc. set by the driver:

    .venv-peers/deepspeed/bin/python -m bench.peers.deepspeed_shm SPEC

For a dtype or a CPU its kernels do not cover, DeepSpeed silently falls back
to the process group's all_reduce: this worker refuses to measure instead.
"""

from __future__ import annotations

import datetime
import os
import sys
from typing import Any

from bench.peers import worker


def shm_problem(cdb: Any, torch: Any) -> str | None:
    """Why inference_all_reduce would not take the shared-memory path."""
    if getattr(cdb, "shm_comm_op", None) is None:
        return "DeepSpeed did not build or load its shared-memory op (ShareMemCommBuilder)"
    if not hasattr(torch.ops, "deepspeed") or not hasattr(torch.ops.deepspeed, "inference_all_reduce_"):
        return "torch.ops.deepspeed.inference_all_reduce_ is not registered"
    if getattr(cdb, "shm_vector_kernel_level", 0) < 2:
        return "this CPU lacks AVX-512BW, which the bfloat16 shared-memory kernels need"
    return None


def main(argv: list[str]) -> int:
    spec = worker.load_spec(argv[0])
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if os.environ.get("LOCAL_SIZE") != os.environ.get("WORLD_SIZE"):
        # Without it the op skips its set-up and the first call dereferences nothing.
        raise SystemExit("deepspeed_shm: LOCAL_SIZE must equal WORLD_SIZE")
    import deepspeed
    import deepspeed.comm as dscomm
    import torch
    import torch.distributed as dist
    from deepspeed.comm import comm as dscomm_state

    from smddp.bench.sweep import TorchComm

    torch.set_num_threads(1)
    dscomm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False,
                            timeout=datetime.timedelta(seconds=spec["pg_timeout"]))  # fmt: skip
    try:
        problem = shm_problem(dscomm_state.cdb, torch)
        if problem:
            raise RuntimeError(problem)
        # The op has no barrier, and gloo's would start the ranks less together
        # than the shared-memory flags do: a one-element shared-memory AllReduce,
        # which no rank can leave before every rank entered.
        token = torch.zeros(1, dtype=torch.float32)
        comm = TorchComm(dist.group.WORLD, barrier=lambda: dscomm.inference_all_reduce(token))

        def call(buf: Any) -> Any:
            assert buf.op == "all_reduce"
            return lambda: dscomm.inference_all_reduce(buf.out)

        info = {"deepspeed": deepspeed.__version__, "torch": torch.__version__,
                "shm_vector_kernel_level": dscomm_state.cdb.shm_vector_kernel_level}  # fmt: skip
        worker.run_points(spec, comm, worker.torch_cases(None, comm, call), info)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    worker.worker_exit(main(sys.argv[1:]))
