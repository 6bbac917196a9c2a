"""Starting the ranks of a benchmark, watching them, and stopping them with
everything they started. Torch-free.

``Ranks`` holds the processes of one run, of two kinds that mix freely:
``spawn`` runs a Python function in fresh interpreters (nothing of the parent,
threads or CUDA state, leaks into them), optionally with a pipe to each
(``ask``); ``command`` runs a command in a session of its own, output to a
log: an mpiexec, one rank, or one torchrun per emulated host, whose ranks find
RANK and WORLD_SIZE set (``launched_externally``) and run as one rank of the
benchmark. ``wait`` bounds the run: the first rank that fails, or the
deadline, stops every other one, with a message instead of a hang.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Iterator, Sequence

EXIT_TIMEOUT = 124
EXIT_WRONG = 3  # a rank that measured wrong results; not a failure of the run


def launched_externally() -> bool:
    """Whether a launcher already started this process as one rank."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


@contextlib.contextmanager
def environ(changes: dict[str, str]) -> Iterator[None]:
    """This process's environment with ``changes``, restored on the way out."""
    saved = dict(os.environ)
    os.environ.update(changes)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...)."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                # The command name may hold spaces and parentheses: fields follow the last ")".
                kids.setdefault(int(f.read().rpartition(")")[2].split()[1]), []).append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    out, todo = [], [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            if child not in out:
                out.append(child)
                todo.append(child)
    return out


def kill_tree(pids: Sequence[int], sessions: Sequence[int] = ()) -> None:
    """SIGKILL to these processes, everything below them, and the process
    groups ``sessions``. Launchers fork daemons and ranks that may sit in
    sessions of their own, so the tree is frozen (SIGSTOP) before anything
    dies and gets reparented."""
    victims = [p for pid in pids for p in (pid, *descendants(pid))]
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        if sig == signal.SIGKILL:  # stopped processes cannot fork: look again for late children
            victims += [d for pid in pids for d in descendants(pid) if d not in victims]
            for pgid in sessions:
                with contextlib.suppress(OSError):
                    os.killpg(pgid, sig)
        for pid in victims:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)


def _child(entry: Callable[..., int], rank: int, world: int, init_method: str, args: tuple,
           conn: Any) -> None:  # pragma: no cover - child  # fmt: skip
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    try:
        code = entry(*args, rank=rank, world=world, init_method=init_method, local_rank=rank,
                     **({} if conn is None else {"conn": conn}))  # fmt: skip
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        sys.stdout.flush()
        text = traceback.format_exc().rstrip().splitlines()
        sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in text))
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a rank has nothing left to flush, and a
    # torch/gloo destructor must not turn a finished run into a hang.
    os._exit(int(code or 0))


class RankError(RuntimeError):
    """A rank failed, died, or stayed silent past its deadline."""


class Ranks:
    """The processes of one run (see the module docstring); a context manager
    that kills whatever is left on exit."""

    def __init__(self, what: str = "smddp-bench"):
        self.what = what
        self.procs: list[tuple[str, Any]] = []  # (label, multiprocessing.Process or Popen)
        self.conns: list[Any] = []
        self._files: list[str] = []
        self._swept = False  # the commands' sessions were killed once

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()

    def spawn(self, entry: Callable[..., int], world: int, args: tuple = (),
              env: dict[str, str] | None = None, pipes: bool = False) -> None:  # fmt: skip
        """``entry(*args, rank=, world=, init_method=, local_rank=[, conn=])`` in
        ``world`` processes, with ``env`` added to this one's environment."""
        fd, init_file = tempfile.mkstemp(prefix="smddp-bench-init-")
        os.close(fd)
        os.unlink(init_file)
        self._files.append(init_file)
        ctx = mp.get_context("spawn")
        # The ranks copy this process's environment when they start.
        with environ({"PYTHONUNBUFFERED": "1", **(env or {})}):
            for rank in range(world):
                parent, child = ctx.Pipe() if pipes else (None, None)
                p = ctx.Process(target=_child, name=f"{self.what}-rank{rank}", daemon=True,
                                args=(entry, rank, world, f"file://{init_file}", args, child))
                p.start()
                self.procs.append((f"rank {rank}", p))
                if pipes:
                    child.close()
                    self.conns.append(parent)

    def command(self, argv: list[str], env: dict[str, str], log: str, label: str, cwd: str | None = None) -> None:
        with open(log, "a") as out:
            out.write(f"$ {' '.join(argv)}\n")
            out.flush()
            p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        self.procs.append((label, p))

    def codes(self) -> list[int | None]:
        """Exit status of each process (None while it runs; -N: killed by signal N)."""
        return [p.poll() if isinstance(p, subprocess.Popen) else p.exitcode for _, p in self.procs]

    def wait(self, timeout: float, ok: Sequence[int] = (0, EXIT_WRONG)) -> int:
        """The run's exit status: the worst of ``ok``, the first failure's status,
        or EXIT_TIMEOUT past ``timeout`` seconds; 130 on Ctrl-C."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                codes = self.codes()
                for (label, _), code in zip(self.procs, codes):
                    if code is not None and code not in ok:
                        why = f"signal {-code}" if code < 0 else f"exit status {code}"
                        print(f"{self.what}: {label} failed ({why}); stopping the other ranks", file=sys.stderr)
                        return code if code > 0 else 1
                if None not in codes:
                    return max(codes, default=0)
                left = deadline - time.monotonic()
                if left <= 0:
                    running = [label for (label, _), c in zip(self.procs, codes) if c is None]
                    print(f"{self.what}: the run did not finish within {timeout:.0f} s "
                          f"(--timeout); {', '.join(running)} were still running and have been "
                          "killed. A collective may be hung: rerun with SMDDP_LOG_LEVEL=debug, "
                          "fewer sizes, or a larger --timeout.", file=sys.stderr)  # fmt: skip
                    return EXIT_TIMEOUT
                # Blocked in the kernel on the spawned ranks; commands are polled.
                waitable = [p.sentinel for (_, p), c in zip(self.procs, codes)
                            if c is None and not isinstance(p, subprocess.Popen)]  # fmt: skip
                polled = len(waitable) < codes.count(None)
                mp.connection.wait(waitable, timeout=min(left, 0.2) if polled else left)
        except KeyboardInterrupt:
            print(f"{self.what}: interrupted; the ranks were stopped", file=sys.stderr)
            return 130
        finally:
            self.kill()

    def ask(self, message: Any, timeout: float, what: str, send: bool = True) -> list[Any]:
        """Sends ``message`` to every spawned rank with a pipe (unless not
        ``send``: their first answers) and returns their answers, in rank order;
        a rank answers ("ok", payload) or ("error", traceback). RankError if one
        fails, dies, or is silent past ``timeout``."""
        for conn in self.conns if send else ():
            conn.send(message)
        deadline = time.monotonic() + timeout
        answers: list[Any] = [None] * len(self.conns)
        pending = dict(enumerate(self.conns))
        while pending:
            left = max(0.0, deadline - time.monotonic())
            ready = mp.connection.wait(list(pending.values()), left)
            if not ready:
                raise RankError(f"{self.what}: {what}: ranks {sorted(pending)} silent for {timeout:.0f} s")
            for rank, conn in [(r, c) for r, c in pending.items() if c in ready]:
                del pending[rank]
                try:
                    status, payload = conn.recv()
                except EOFError:
                    raise RankError(f"{self.what}: {what}: rank {rank} died (exit status "
                                    f"{self.codes()[rank]})") from None  # fmt: skip
                if status != "ok":
                    raise RankError(f"{self.what}: {what} failed on rank {rank}:\n{payload}")
                answers[rank] = payload
        return answers

    def kill(self) -> None:
        """Every process and everything it started, at once."""
        live = [p.pid for (_, p), c in zip(self.procs, self.codes()) if c is None]
        # A command's session may outlive it (ranks left by an mpiexec that exited).
        sessions = [] if self._swept else [p.pid for _, p in self.procs if isinstance(p, subprocess.Popen)]
        if live or sessions:
            kill_tree(live, sessions)
        self._swept = not live
        for _, p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10) if isinstance(p, subprocess.Popen) else p.join(timeout=10)
        for path in self._files:
            with contextlib.suppress(OSError):
                os.unlink(path)
