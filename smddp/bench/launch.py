"""Starting the ranks of a benchmark: spawned here, or already started by a
launcher (torchrun, mpirun wrappers, Slurm scripts that set RANK and
WORLD_SIZE).

Spawned ranks are fresh interpreters ("spawn"), so nothing of the parent
(threads, CUDA state) leaks into them. The parent only waits on their exit,
blocked in the kernel, and bounds the whole run: past the deadline every rank
is killed and the run fails with a message instead of hanging.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Iterator

EXIT_TIMEOUT = 124


def launched_externally() -> bool:
    """Whether a launcher already started this process as one rank."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _child(
    entry: Callable[..., int], rank: int, world: int, init_method: str, args: tuple
) -> None:  # pragma: no cover - child
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world)
    os.environ["LOCAL_RANK"] = str(rank)
    os.environ["LOCAL_WORLD_SIZE"] = str(world)
    try:
        code = entry(*args, rank=rank, world=world, init_method=init_method, local_rank=rank)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        sys.stdout.flush()
        text = traceback.format_exc()
        sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in text.rstrip().splitlines()))
        sys.stderr.flush()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a rank has nothing left to flush, and a
    # torch/gloo destructor must not turn a finished run into a hang.
    os._exit(code)


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` set while the ranks start (they copy the environment then),
    and the caller's environment as it was afterwards."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def spawn(
    entry: Callable[..., int],
    world: int,
    args: tuple,
    env: dict[str, str],
    timeout: float,
    what: str = "smddp-bench",
) -> int:
    """Runs ``entry(*args, rank=, world=, init_method=, local_rank=)`` in
    ``world`` fresh processes; returns the exit status of the run.

    ``env`` is added to the ranks' environment (they inherit this process's);
    this process's own environment is left as it was.
    """
    ctx = mp.get_context("spawn")
    fd, init_file = tempfile.mkstemp(prefix="smddp-bench-init-")
    os.close(fd)
    os.unlink(init_file)
    procs: list[Any] = []
    try:
        with _environment({"PYTHONUNBUFFERED": "1", **env}):
            for rank in range(world):
                p = ctx.Process(
                    target=_child,
                    args=(entry, rank, world, f"file://{init_file}", args),
                    name=f"{what}-rank{rank}",
                    daemon=True,
                )
                p.start()
                procs.append(p)
        return _wait(procs, timeout, what)
    except KeyboardInterrupt:
        _kill(procs)
        print(f"{what}: interrupted; the ranks were stopped", file=sys.stderr)
        return 130
    finally:
        _kill(procs)
        try:
            os.unlink(init_file)
        except OSError:
            pass


def _wait(procs: list[Any], timeout: float, what: str) -> int:
    deadline = time.monotonic() + timeout
    pending = {p.sentinel: p for p in procs}
    status = 0
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            ranks = sorted(int(p.name.rsplit("rank", 1)[1]) for p in pending.values())
            _kill(procs)
            print(
                f"{what}: the run did not finish within {timeout:.0f} s (--timeout); ranks {ranks} "
                "were still running and have been killed. A collective may be hung: rerun with "
                "SMDDP_LOG_LEVEL=debug, fewer sizes, or a larger --timeout.",
                file=sys.stderr,
            )
            return EXIT_TIMEOUT
        for sentinel in mp.connection.wait(list(pending), timeout=left):
            p = pending.pop(sentinel)
            p.join()
            code = p.exitcode
            if code not in (0, 3):
                rank = p.name.rsplit("rank", 1)[1]
                why = f"signal {-code}" if code is not None and code < 0 else f"exit status {code}"
                print(
                    f"{what}: rank {rank} failed ({why}); stopping the other ranks", file=sys.stderr
                )
                _kill(procs)
                return code if code and code > 0 else 1
            status = max(status, code)
    return status


def _kill(procs: list[Any]) -> None:
    for p in procs:
        if p.is_alive():
            try:
                os.kill(p.pid, signal.SIGKILL)
            except OSError:
                pass
    for p in procs:
        p.join(timeout=5)
