"""Multi-process test harness: ranks that join a process group once and then
run many test cases on request.

    pool = RankPool(world=4, env={"SMDDP_RANKS_PER_NODE": "2"})
    results = pool.run(case_allreduce, torch.float32, 1024)   # one per rank
    pool.close()

A case is a module-level function of a test module, called in every rank as
``fn(*args, **kwargs)`` after ``init_process_group`` (so ``dist.get_rank()``
etc. work); whatever it returns (picklable) comes back as a list indexed by
rank. An exception in any rank fails the call with every failing rank's
traceback. Every call is bounded in time: a rank that does not answer within
``timeout`` seconds gets the whole pool killed and the call fails with a
TimeoutError naming the silent ranks, so a hang is a test failure, never a
stuck CI job.

Two environment variables adapt the bounds to the machine (the GPU check
script uses them to fit every test into one short run):

- ``SMDDP_TEST_TIMEOUT_SCALE`` (a positive float, default 1) multiplies every
  bound the harness applies: rank start-up, each call, closing, and the
  process group's own timeout (not below 5 s), so that their order (the
  group's timeout fires before the harness gives up) is kept.
- ``SMDDP_TEST_STACK_DUMPS=1`` makes every rank register
  ``faulthandler`` for SIGUSR1 (all threads, to the rank's stderr); before it
  kills a pool whose ranks are silent, the harness sends them SIGUSR1 and
  gives them a moment to print where they are stuck. Run pytest with ``-s``
  to see those stacks as they are written (a rank's stderr is the one it
  inherited when its pool started).
"""

from __future__ import annotations

import datetime
import faulthandler
import importlib
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

_HERE = os.path.dirname(os.path.abspath(__file__))


def _scaled(seconds: float) -> float:
    """A harness bound times SMDDP_TEST_TIMEOUT_SCALE."""
    text = os.environ.get("SMDDP_TEST_TIMEOUT_SCALE", "").strip()
    if not text:
        return seconds
    try:
        scale = float(text)
    except ValueError:
        scale = -1.0
    if not scale > 0:
        raise ValueError(f"SMDDP_TEST_TIMEOUT_SCALE={text!r} is not valid; use a positive number such as 0.5")
    return seconds * scale


def _stack_dumps() -> bool:
    return os.environ.get("SMDDP_TEST_STACK_DUMPS", "").strip() == "1"


class RankFailure(AssertionError):
    """A case raised in one or more ranks."""


def _rank_main(rank, world, conn, env, init_file, backend, pg_timeout_s):  # pragma: no cover - child
    os.environ.update(env)
    if _stack_dumps():
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world)
    try:
        import torch  # noqa: F401
        import torch.distributed as dist

        import smddp  # noqa: F401

        dist.init_process_group(
            backend,
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=pg_timeout_s),
        )
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
        module, name, args, kwargs = msg
        try:
            fn = getattr(importlib.import_module(module), name)
            conn.send(("ok", fn(*args, **kwargs)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    conn.send(("closed", None))
    # The group is gone and the answer sent: what is left is the
    # interpreter's teardown of torch, which only delays the next test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class RankPool:
    """``world`` rank processes in one process group, ready to run cases."""

    def __init__(
        self,
        world: int,
        env: dict[str, str] | None = None,
        backend: str = "smddp",
        start_timeout: float = 120.0,
        pg_timeout: float = 60.0,
    ):
        self.world = world
        self.env = dict(env or {})
        self.backend = backend
        self._ctx = mp.get_context("spawn")
        fd, self._init_file = tempfile.mkstemp(prefix="smddp-test-init-")
        os.close(fd)
        os.unlink(self._init_file)
        child_env = dict(self.env)
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        # Several ranks share few cores: torch's own thread pools would fight
        # over them (local reference computations slow down many times).
        child_env.setdefault("OMP_NUM_THREADS", "1")
        self._conns = []
        self._procs = []
        # The group's own timeout also bounds its set-up (rendezvous, device
        # communicators), which a loaded machine slows: scaled down, it stops
        # at the 5 s a test may ask for, so that a shorter bound fails set-up
        # rather than the collective the test is about.
        group_timeout = max(_scaled(pg_timeout), min(pg_timeout, 5.0))
        for rank in range(world):
            parent, child = self._ctx.Pipe()
            p = self._ctx.Process(
                target=_rank_main,
                args=(rank, world, child, child_env, self._init_file, backend, group_timeout),
                daemon=True,
                name=f"rank{rank}",
            )
            p.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(p)
        self.alive = True
        self._collect("start-up", start_timeout)

    def _collect(self, what: str, timeout: float, may_die: frozenset[int] = frozenset()) -> list[Any]:
        timeout = _scaled(timeout)
        deadline = time.monotonic() + timeout
        results: list[Any] = [None] * self.world
        pending = set(range(self.world))
        errors = {}
        while pending:
            for rank in sorted(pending):
                conn = self._conns[rank]
                if conn.poll(0.01):
                    try:
                        status, payload = conn.recv()
                    except EOFError:
                        status, payload = "error", f"rank {rank} exited (code {self._procs[rank].exitcode})"
                    pending.discard(rank)
                    if status == "error" and rank not in may_die:
                        errors[rank] = payload
                    elif status != "error":
                        results[rank] = payload
                elif not self._procs[rank].is_alive() and not conn.poll(0):
                    pending.discard(rank)
                    if rank not in may_die:
                        errors[rank] = f"rank {rank} died (exit code {self._procs[rank].exitcode})"
            if pending and time.monotonic() > deadline:
                self._dump_stacks(pending)
                self.kill()
                raise TimeoutError(
                    f"{what}: ranks {sorted(pending)} of {self.world} did not finish within "
                    f"{timeout:.0f} s; the pool was killed"
                    + "".join(f"\n--- rank {r} ---\n{e}" for r, e in sorted(errors.items()))
                )
        if errors:
            raise RankFailure(
                f"{what} failed on ranks {sorted(errors)}:"
                + "".join(f"\n--- rank {r} ---\n{e}" for r, e in sorted(errors.items()))
            )
        return results

    def _dump_stacks(self, ranks) -> None:
        """Asks silent ranks to print their Python stacks (SMDDP_TEST_STACK_DUMPS)."""
        if not _stack_dumps():
            return
        signalled = False
        for rank in sorted(ranks):
            p = self._procs[rank]
            if p.is_alive() and p.pid is not None:
                print(f"dist_harness: rank {rank} (pid {p.pid}) is silent; its stacks:", file=sys.stderr, flush=True)
                try:
                    os.kill(p.pid, signal.SIGUSR1)
                    signalled = True
                except OSError:
                    pass
        if signalled:
            # faulthandler writes from its signal handler at once; a moment
            # is enough for every rank to finish.
            time.sleep(1.0)

    def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        timeout: float = 120.0,
        may_die: frozenset[int] | set[int] = frozenset(),
        **kwargs: Any,
    ) -> list[Any]:
        """Runs ``fn(*args, **kwargs)`` in every rank; returns the results.

        Ranks in ``may_die`` may exit or be killed on purpose (their result
        is None); the pool is unusable afterwards.
        """
        if not self.alive:
            raise RuntimeError("this rank pool was killed by an earlier failure")
        module = fn.__module__
        if module == "__main__":
            raise ValueError("cases must live in an importable module")
        for conn in self._conns:
            conn.send((module, fn.__name__, args, kwargs))
        try:
            results = self._collect(f"{fn.__name__}{args!r}", timeout, frozenset(may_die))
            if may_die:
                self.kill()
            return results
        except RankFailure:
            # The group may be broken (a communication error is sticky):
            # don't reuse it.
            self.kill()
            raise

    def kill(self) -> None:
        self.alive = False
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(timeout=10)
        # The store's file outlives ranks that were killed.
        try:
            os.unlink(self._init_file)
        except OSError:
            pass

    def close(self, timeout: float = 30.0) -> None:
        self.begin_close()
        self.finish_close(timeout)

    def begin_close(self) -> None:
        """Asks every rank to leave (so that several pools close at once)."""
        if not self.alive:
            return
        for conn in self._conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass

    def finish_close(self, timeout: float = 30.0) -> None:
        """Waits for the ranks (killing stragglers) and cleans up."""
        if not self.alive:
            return
        deadline = time.monotonic() + _scaled(timeout)
        for p in self._procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        self.kill()


def assert_no_failures(results: list[list[str]]) -> None:
    """For cases that return the list of what went wrong on their rank."""
    failures = [f"rank {r}: {f}" for r, fs in enumerate(results) for f in fs]
    assert not failures, "\n".join(failures)


def spawn_ranks(
    fn: Callable[..., Any],
    world: int,
    *args: Any,
    env: dict[str, str] | None = None,
    timeout: float = 180.0,
    backend: str = "smddp",
    may_die: frozenset[int] | set[int] = frozenset(),
    **kwargs: Any,
) -> list[Any]:
    """One-shot: a fresh pool runs one case and is closed."""
    pool = RankPool(world, env=env, backend=backend)
    try:
        return pool.run(fn, *args, timeout=timeout, may_die=may_die, **kwargs)
    finally:
        pool.close()


# The tests directory is importable in the children (cases live there).
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
