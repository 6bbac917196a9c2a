"""The rank side of the peer comparison: every worker (torch.distributed here,
MPI in bench/peers/mpi.py, DeepSpeed in bench/peers/deepspeed_shm.py) runs
the points of its spec through ``run_points``, which times them with
smddp.bench.timing and checks them with smddp.bench.ops like every other
benchmark of this repository, and reports each point to the driver as it
ends. Run by the driver:

    python -m bench.peers.worker SPEC        # smddp or gloo, RANK etc. set
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable

from smddp.bench import ops, record, timing


def run_points(spec: dict[str, Any], comm: timing.Comm, make_case: Callable[[str, str, int], Any],
               info: dict[str, Any]) -> None:
    """A worker's main loop: every point of the spec, in order, each reported
    as it ends. A point is skipped once a smaller size of its table exceeded
    the cap in one call, or would exceed twice the cap by linear extrapolation
    from the previous size (which overestimates while latency dominates, and
    is about right once bandwidth does, when skipping matters)."""
    impl, world = spec["impl"], spec["world"]
    t = timing.Timing(**spec["timing"])
    given_up: dict[tuple[str, str], str] = {}
    last: dict[tuple[str, str], tuple[int, float]] = {}  # size and seconds of the last point
    # Rank 0's running account of the job, one JSON object per line: the driver
    # reads it to know which point is running and to collect the results.
    with open(spec["progress"] if comm.rank == 0 else os.devnull, "a") as log:

        def emit(event: str, **fields: Any) -> None:
            log.write(json.dumps({"event": event, **fields}, allow_nan=False) + "\n")
            log.flush()

        emit("info", impl=impl, info=info)
        for p in spec["points"]:
            op, dtype, nbytes = p["op"], p["dtype"], p["bytes"]
            redop = "sum" if ops.OPS[op].reduces else "none"
            size = ops.geometry(op, nbytes, ops.DTYPES[dtype][0], world).size
            why = given_up.get((op, dtype))
            if not why and (op, dtype) in last:
                guess = last[op, dtype][1] * size / max(last[op, dtype][0], 1)
                if guess > 2 * t.cap:
                    why = (f"one call would take about {guess:.0f} s (linear in size from the "
                           "previous size), over 2x --point-cap")  # fmt: skip
            if why:
                emit("point", record=record.point(impl, op, dtype, redop, world, nbytes, status="skipped", note=why))
                continue
            emit("begin", point=p)
            case = make_case(op, dtype, nbytes)
            res = timing.measure({impl: case}, comm, t)[impl]
            rec = record.point(impl, op, dtype, redop, world, nbytes, res)
            if getattr(case, "flags", ""):
                rec["flags"] = case.flags
            del case
            if res.status == "slow":
                rec["note"] = f"one call exceeded --point-cap {t.cap:g} s"
                given_up[op, dtype] = "a smaller size already exceeded --point-cap in one call"
            elif res.status == "few":
                rec["note"] = f"fewer than --min-iters within --point-cap {t.cap:g} s"
            if record.measured(rec):
                last[op, dtype] = (size, rec["time_us"] * 1e-6)
            emit("point", record=rec)
        emit("done")


def load_spec(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def worker_exit(code: int) -> None:
    """Leaves without interpreter teardown: a destructor of a communication
    library must not turn a finished job into a hang."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def torch_cases(group: Any, comm: Any, call: Callable[[Any], Callable[[], Any]] | None = None
                ) -> Callable[[str, str, int], Any]:  # fmt: skip
    """Cases on torch tensors (smddp.bench.sweep.Buffers: out of place, except
    AllReduce, which torch has in place only and which is refilled from a
    pristine copy before every call, outside the timed region)."""
    from smddp.bench.sweep import Buffers

    def make(op: str, dtype: str, nbytes: int) -> Any:
        geom = ops.geometry(op, nbytes, ops.DTYPES[dtype][0], comm.world)
        buf = Buffers(op, dtype, geom, "sum", 0, comm.rank, comm.world)
        return buf.case(call(buf) if call else buf.call(group))

    return make


def main(argv: list[str]) -> int:
    spec = load_spec(argv[0])
    import torch
    import torch.distributed as dist

    import smddp
    from smddp.bench.sweep import TorchComm, process_group

    world = int(os.environ["WORLD_SIZE"])
    with process_group(int(os.environ["RANK"]), world, "env://", spec["pg_timeout"]) as timeout:
        group = dist.new_group(backend=spec["impl"], timeout=timeout)
        # The barrier of the measured implementation; timings reduced on gloo.
        comm = TorchComm(dist.group.WORLD, barrier=lambda: dist.barrier(group=group))
        info: dict[str, Any] = {"torch": torch.__version__}
        if spec["impl"] == "smddp":
            info.update(smddp=smddp.__version__, config=smddp.config.current())
        run_points(spec, comm, torch_cases(group, comm), info)
        dist.barrier()
    return 0


if __name__ == "__main__":
    worker_exit(main(sys.argv[1:]))
