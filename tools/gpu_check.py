#!/usr/bin/env python3
"""The GPU check: one run on a GPU machine that learns as much as it can
within a fixed time, whatever fails or hangs.

On the GPU machine, from the repository root (no virtual environment; the
machine's python3 with its torch; nothing is installed):

    OUT=$OUT PYTHONUNBUFFERED=1 python3 tools/gpu_check.py

(give the command a limit of about 9 minutes: the check ends by itself after
8, --deadline-s 480). Options: --deadline-s S, --skip-build (use the
extension already built), --only A,B / --skip A,B (step names), --out DIR
(default $OUT), --tests A,B (only the test ids containing A or B), --list.
Rerunning some steps on the same machine, where the build is still there:

    OUT=$OUT python3 tools/gpu_check.py --skip-build --only env,kernel,tests --deadline-s 240

Steps, most information per second first; each one's cap is cut to what is
left of the deadline once the later steps' minimums are set aside:

    env           machine facts: runtime (gVisor?), driver, compute and MIG
                  mode, GPU, clocks, torch/CUDA/NCCL, /dev/shm, CPUs, tools
    ipc           a CUDA tensor and an interprocess event shared with a child
                  process, and two processes' kernels at once (torch alone);
                  how long the host waits behind its busy stream for a
                  kernel's first launch and for a cudaFree; a round between
                  the two through stream memory operations against one
                  through the host, and one such wait captured
    build         setup.py build_ext --inplace, sm_90 only, -lineinfo (again
                  with /usr/bin/g++ where setup.py refuses a static C++ runtime)
    import        import smddp, load its CUDA module, one device_reduce
    kernel        tests/test_cuda_kernel.py: the reduction kernel against the
                  CPU reduction, bit for bit
    smoke         tests/gpu_smoke.py: each native op, 2 ranks sharing GPU 0
    bench-kernels      bench/gpu_kernels.py --json $OUT/kernels.json
    bench-collectives  bench/gpu_collectives.py --nproc 2 --json $OUT/collectives.json
    bench-latency      bench/gpu_latency.py --nproc 2 --json $OUT/latency.json, then
                       --nproc 8 --modes memops,memops+batch (the host's enqueue cost)
    tests         each GPU test id (tests/test_cuda.py, and kernel tests the
                  kernel step left without a verdict) in its own pytest;
                  those of tests/test_cuda.py three at a time (--test-jobs),
                  the longest first (by their pytest timeout marks)
    sanitizer     compute-sanitizer memcheck (then racecheck) on the kernel
                  test, after a probe; "skipped: runtime" where it cannot run

Every step runs in child processes whose output goes straight to the step's
own log file (no pipe that a kill could cut). A child that outlives its cap
first gets SIGUSR1, on which every Python process of its tree prints the
stacks of all its threads (tools/gpu_check_site/sitecustomize.py), and then
its whole process tree is killed. A failed step never ends the run; a step
that needs a failed one is skipped with that reason.

What comes back, rewritten after every step (a run cut short still leaves
the steps it finished), at most 8 plain files directly in $OUT:

    summary.txt        the summary table, and the tail of each failed step's log
    results.json       machine facts and each step's status, time, reason, details
    logs.tar.gz        every log, the pytest JUnit files, the probes' JSON
    kernels.json       from bench/gpu_kernels.py
    collectives.json   from bench/gpu_collectives.py
    latency.json       from bench/gpu_latency.py
    latency-8.json     from bench/gpu_latency.py --nproc 8 (memops, batched or not)

The summary table is also the last thing printed. The exit status is 0 when
no step failed or timed out.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITE = os.path.join(ROOT, "tools", "gpu_check_site")
PY = sys.executable

OK, FAIL, SKIPPED, TIMEOUT = "ok", "FAIL", "skipped", "timeout"
# Set aside at the end of the deadline to write the results.
PACK_RESERVE_S = 8.0
# Between SIGUSR1 (stacks) and SIGKILL.
DUMP_GRACE_S = 2.0
OUT_FILES = ("summary.txt", "results.json", "logs.tar.gz", "kernels.json", "collectives.json", "latency.json",
             "latency-8.json")
# What one log may weigh in the tarball: the head and the tail are kept.
LOG_KEEP_BYTES = 4 << 20
TAR_LIMIT_BYTES = 15 << 20


# ---------------------------------------------------------------- processes


@dataclasses.dataclass
class Outcome:
    """How one child process ended."""

    argv: list[str]
    rc: int | None
    seconds: float
    timed_out: bool = False
    error: str | None = None
    # Where the child's own output is in the log (without the lines this
    # script writes around it).
    log_from: int = 0
    log_to: int = 0
    # The log, where it is not the step's own.
    log_path: str | None = None

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out

    def describe(self) -> str:
        if self.error:
            return self.error
        if self.timed_out:
            return f"killed after {self.seconds:.0f} s (over its cap)"
        return describe_rc(self.rc)


def describe_rc(rc: int | None) -> str:
    if rc is None:
        return "no exit status"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


def _proc_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, process group, session) of every process."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                text = f.read()
        except OSError:
            continue
        # The command name is in parentheses and may hold anything.
        fields = text[text.rfind(")") + 2:].split()
        try:
            table[int(name)] = (int(fields[1]), int(fields[2]), int(fields[3]))
        except (IndexError, ValueError):
            continue
    return table


def process_tree(root: int) -> set[int]:
    """The processes of root's session or group, and all its descendants
    (also those that left them)."""
    table = _proc_table()
    found = {pid for pid, (_, pgrp, sid) in table.items() if pgrp == root or sid == root}
    if root in table:
        found.add(root)
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _, _) in table.items():
            if ppid in found and pid not in found:
                found.add(pid)
                grew = True
    found.discard(os.getpid())
    return found


def _signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def stop_tree(root: int, dump: bool, log=None) -> int:
    """Kills root's process tree; with dump, first asks for stacks (SIGUSR1)
    and waits DUMP_GRACE_S. Returns how many processes were signalled."""
    pids = process_tree(root)
    if not pids:
        return 0
    if dump:
        if log is not None:
            log.write(f"\n*** SIGUSR1 (stack dump) to {len(pids)} processes: {sorted(pids)}\n".encode())
        _signal_all(pids, signal.SIGUSR1)
        time.sleep(DUMP_GRACE_S)
        pids |= process_tree(root)
    _signal_all(pids, signal.SIGKILL)
    try:
        os.killpg(root, signal.SIGKILL)
    except OSError:
        pass
    return len(pids)


class Child:
    """One child process with its output appended to log_path, for at most
    timeout_s; polled (poll) so that several can run side by side, or waited
    for (wait).

    The child leads a new session, so that its whole tree can be found and
    killed; leftovers (ranks that outlived their parent) are killed even
    after a normal exit.
    """

    def __init__(self, argv: list[str], log_path: str, timeout_s: float, env: dict | None = None,
                 cwd: str = ROOT, own_log: bool = False):
        self.argv, self.timeout_s, self.outcome = argv, timeout_s, None
        # Set by StepRun.start: its time is what was left of the step's.
        self.at_step_end = False
        self.log_path = log_path if own_log else None
        # Appending: the child's writes and this script's share the file's end.
        self.log = open(log_path, "ab", buffering=0)
        self.log.write(f"\n$ {shlex.join(argv)}\n# cap {timeout_s:.0f} s, started {time.strftime('%H:%M:%S')}\n".encode())
        self.start_offset = self.log.tell()
        self.t0 = time.monotonic()
        try:
            self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                      env=env, cwd=cwd, start_new_session=True)
        except OSError as e:
            self.log.write(f"# could not start: {e}\n".encode())
            self.outcome = Outcome(argv, None, 0.0, error=f"could not start {argv[0]}: {e}",
                                   log_from=self.start_offset, log_to=self.log.tell(), log_path=self.log_path)
            self.log.close()

    def poll(self) -> Outcome | None:
        """The outcome once the child has ended or outlived its time (its tree
        then killed), else None."""
        if self.outcome is None:
            rc = self.p.poll()
            if rc is not None or time.monotonic() - self.t0 >= self.timeout_s:
                self._finish(rc, timed_out=rc is None)
        return self.outcome

    def wait(self) -> Outcome:
        if self.outcome is None:
            try:
                rc = self.p.wait(timeout=max(0.1, self.timeout_s - (time.monotonic() - self.t0)))
                self._finish(rc, timed_out=False)
            except subprocess.TimeoutExpired:
                self._finish(None, timed_out=True)
            except BaseException:
                self.interrupt()
                raise
        return self.outcome

    def interrupt(self) -> None:
        """This script is being stopped: the child goes first."""
        if self.outcome is None and not self.log.closed:
            self.log.write(b"\n*** the check was interrupted\n")
            stop_tree(self.p.pid, dump=True, log=self.log)
            self.log.close()

    def _finish(self, rc: int | None, timed_out: bool) -> None:
        end_offset = self.log.tell()
        left = stop_tree(self.p.pid, dump=timed_out, log=self.log)
        if timed_out:
            rc = self.p.wait()
            # The stacks belong to what the child said.
            end_offset = self.log.tell()
        elif left:
            self.log.write(f"# killed {left} processes it left running\n".encode())
        seconds = time.monotonic() - self.t0
        self.outcome = Outcome(self.argv, rc, seconds, timed_out=timed_out, log_from=self.start_offset,
                               log_to=end_offset, log_path=self.log_path)
        self.log.write(f"# {self.outcome.describe()} after {seconds:.1f} s\n".encode())
        self.log.close()


def run_bounded(argv: list[str], log_path: str, timeout_s: float, env: dict | None = None,
                cwd: str = ROOT) -> Outcome:
    """Runs argv with its output appended to log_path, for at most timeout_s (Child)."""
    return Child(argv, log_path, timeout_s, env=env, cwd=cwd).wait()


def read_span(path: str, start: int, end: int) -> str:
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(max(0, end - start)).decode(errors="replace")


def tail_lines(text: str, n: int) -> list[str]:
    return [line for line in text.splitlines() if line.strip()][-n:]


def child_env(extra: dict | None = None) -> dict:
    """The environment of every child: this checkout first on the path, stack
    dumps on SIGUSR1, crash stacks, unbuffered output."""
    env = dict(os.environ)
    # The interpreter's own folder first: a virtual environment's tools
    # (ninja, which the build needs to run in parallel) live there.
    bindir = os.path.dirname(PY)
    if bindir and bindir not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    path = [SITE, ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env["SMDDP_STACKS_ON_SIGUSR1"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


# ---------------------------------------------------------------- steps


@dataclasses.dataclass
class Step:
    name: str
    fn: Callable
    cap_s: float
    min_s: float
    gpu: bool = False
    needs: tuple[str, ...] = ()
    doc: str = ""
    # Why the step is not to run at all (checked before its time is set aside).
    skip: Callable | None = None


@dataclasses.dataclass
class Result:
    name: str
    status: str
    seconds: float
    reason: str
    cap_s: float = 0.0
    log: str | None = None
    details: dict = dataclasses.field(default_factory=dict)
    subs: list[dict] = dataclasses.field(default_factory=list)


class StepRun:
    """What a step function gets: its log, its time, and bounded runs."""

    def __init__(self, check: "Check", step: Step, budget_s: float):
        self.check = check
        self.step = step
        self.budget_s = budget_s
        self.end = time.monotonic() + budget_s
        self.log_path = os.path.join(check.logs, f"{step.name}.log")
        self.capped = False
        self.details: dict = {}
        self.subs: list[dict] = []
        self.note(f"# step {step.name}: cap {budget_s:.0f} s")

    def left(self) -> float:
        return self.end - time.monotonic()

    def note(self, text: str) -> None:
        with open(self.log_path, "a") as f:
            f.write(text.rstrip("\n") + "\n")

    def run(self, argv: list[str], timeout: float | None = None, env: dict | None = None,
            cwd: str = ROOT) -> Outcome:
        """argv, bounded by timeout and by what is left of the step."""
        child = self.start(argv, timeout, env, cwd)
        if isinstance(child, Outcome):
            return child
        child.wait()
        return self.ended(child)

    def start(self, argv: list[str], timeout: float | None = None, env: dict | None = None, cwd: str = ROOT,
              log_path: str | None = None) -> "Child | Outcome":
        """argv started, bounded as run() bounds it (its output in log_path,
        else the step's log); its Outcome at once where no time is left.
        Pass what the Child gives to ended()."""
        left = self.left()
        limit = left if timeout is None else min(timeout, left)
        if limit < 1.0:
            self.capped = True
            self.note(f"# not started (no time left): {shlex.join(argv)}")
            return Outcome(argv, None, 0.0, timed_out=True, error="not started: the step's time was up")
        child = Child(argv, log_path or self.log_path, limit, env=child_env(env), cwd=cwd, own_log=bool(log_path))
        # Killed at the step's end rather than at its own cap: the step was capped.
        child.at_step_end = limit >= left - 0.5
        return child

    def ended(self, child: "Child") -> Outcome:
        """The outcome of a child start() gave, once it has one."""
        if child.outcome.timed_out and child.at_step_end:
            self.capped = True
        return child.outcome

    def python(self, args: list[str], timeout: float | None = None, env: dict | None = None,
               cwd: str = ROOT) -> Outcome:
        return self.run([PY] + args, timeout=timeout, env=env, cwd=cwd)

    def output(self, out: Outcome) -> str:
        return read_span(out.log_path or self.log_path, out.log_from, out.log_to)

    def sub(self, name: str, status: str, seconds: float, reason: str) -> None:
        self.subs.append({"name": name, "status": status, "seconds": round(seconds, 1), "reason": reason})

    def probe(self, name: str, timeout: float | None = None) -> tuple[dict, Outcome]:
        """tools/gpu_probes.py NAME: its JSON report (what it wrote before any kill)."""
        path = os.path.join(self.check.logs, f"{name}.json")
        out = self.python([os.path.join(ROOT, "tools", "gpu_probes.py"), name, "--json", path], timeout=timeout)
        try:
            with open(path) as f:
                rep = json.load(f)
        except (OSError, ValueError):
            rep = {"status": FAIL, "reason": f"the probe wrote nothing ({out.describe()})", "details": {}}
        if not out.ok and rep.get("status") == OK:
            rep["status"] = FAIL
            rep["reason"] = f"{out.describe()}: {rep.get('reason')}"
        elif not out.ok:
            rep["reason"] = f"{rep.get('reason')} ({out.describe()})"
        return rep, out


def _first_error_line(text: str) -> str | None:
    for line in text.splitlines():
        # Not a build's command lines, whose object files may be error.o.
        if re.match(r"\s*\[\d+/\d+\] ", line):
            continue
        if re.search(r"\berror\b|Error:|FAILED|No such file", line):
            return line.strip()[:240]
    return None


def _bench_line(text: str) -> str:
    lines = tail_lines(text, 3)
    return lines[-1][:240] if lines else ""


def step_env(check: "Check", run: StepRun):
    rep, _ = run.probe("env")
    check.facts = rep.get("details", {})
    run.details["reason"] = rep.get("reason")
    return rep.get("status", FAIL), rep.get("reason", "")


def step_ipc(check: "Check", run: StepRun):
    rep, _ = run.probe("ipc")
    run.details.update(rep.get("details", {}))
    for name, verdict in (rep.get("details", {}).get("verdicts") or {}).items():
        run.sub(name, OK if verdict == OK else FAIL, 0.0, verdict)
    status, reason = rep.get("status", FAIL), rep.get("reason", "")
    # A fact for SMDDP_CUDA_SYNC=memops, not a verdict on the machine: what a
    # round through the streams' own waits costs against host rounds.
    if status == OK and run.left() > 15:
        memops, out = run.probe("memops", timeout=min(40.0, run.left() - 5))
        run.details["memops"] = memops.get("details", {})
        run.sub("memops", memops.get("status", FAIL), out.seconds, memops.get("reason", ""))
    return status, reason


# setup.py's refusal of an extension linked with a static C++ runtime
# (tools/build_env.py), and the compiler the build step then falls back to.
STATIC_RUNTIME = "was linked without the shared libstdc++"
SYSTEM_CXX = "/usr/bin/g++"


def step_build(check: "Check", run: StepRun):
    tools = check.facts.get("tools") or {}
    env = {
        "SMDDP_CUDA_ARCHS": os.environ.get("SMDDP_CUDA_ARCHS", "90"),
        "SMDDP_NVCC_FLAGS": os.environ.get("SMDDP_NVCC_FLAGS", "-lineinfo"),
        "MAX_JOBS": os.environ.get("MAX_JOBS", str(os.cpu_count() or 1)),
    }
    # Without nvcc the build would leave the CUDA sources out silently; a
    # toolkit in the usual place but not on PATH is used.
    have_nvcc = tools.get("nvcc") or shutil.which("nvcc")
    if not have_nvcc and not os.environ.get("CUDA_HOME"):
        for home in ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True):
            if os.path.exists(os.path.join(home, "bin", "nvcc")):
                env["CUDA_HOME"] = home
                have_nvcc = os.path.join(home, "bin", "nvcc")
                break
    if have_nvcc:
        env["SMDDP_WITH_CUDA"] = os.environ.get("SMDDP_WITH_CUDA", "1")
    run.details["env"] = env

    def build() -> tuple[Outcome, str]:
        out = run.python(["setup.py", "build_ext", "--inplace"], env=env, cwd=ROOT)
        return out, run.output(out)

    out, text = build()
    what = f"sm_{env['SMDDP_CUDA_ARCHS']}, {env['SMDDP_NVCC_FLAGS'] or 'no extra nvcc flags'}, {env['MAX_JOBS']} jobs"
    if not have_nvcc:
        what += ", no nvcc: CPU only"
    refusal = next((ln.strip()[:240] for ln in text.splitlines() if STATIC_RUNTIME in ln), None) if not out.ok else None
    if refusal and os.path.exists(SYSTEM_CXX) and run.left() > 30:
        # The default compiler put its own C++ runtime into the extension
        # (setup.py refuses that build): the system's compiler instead.
        cc = os.path.join(os.path.dirname(SYSTEM_CXX), "gcc")
        env.update({"CXX": SYSTEM_CXX, "CC": cc, "CUDAHOSTCXX": SYSTEM_CXX})
        shutil.rmtree(os.path.join(ROOT, "build"), ignore_errors=True)
        out, text = build()
        what += f"; again with CXX={SYSTEM_CXX} after: {refusal}"
    if out.ok:
        return OK, f"built in {out.seconds:.0f} s ({what})"
    return FAIL, f"{out.describe()}: " + (_first_error_line(text) or _bench_line(text))


def step_import(check: "Check", run: StepRun):
    rep, _ = run.probe("import")
    run.details.update(rep.get("details", {}))
    return rep.get("status", FAIL), rep.get("reason", "")


def parse_junit(path: str) -> dict:
    """{node id: (status, message)} from a pytest JUnit XML file."""
    results = {}
    try:
        tree = ET.parse(path)
    except (OSError, ET.ParseError):
        return results
    for case in tree.iter("testcase"):
        cls = case.get("classname", "")
        node = cls.replace(".", "/") + ".py::" + case.get("name", "")
        status, message = OK, ""
        for child in case:
            if child.tag in ("failure", "error"):
                status = FAIL
                message = (child.get("message") or child.text or "").strip().splitlines()[:1]
                message = message[0][:200] if message else child.tag
                break
            if child.tag == "skipped":
                status = SKIPPED
                message = (child.get("message") or "").strip()[:200]
        results[node] = (status, message)
    return results


def parse_verbose(text: str) -> dict:
    """{node id: (status, "")} from pytest -v lines (what a killed pytest,
    which wrote no JUnit file, printed up to the kill)."""
    results = {}
    for m in re.finditer(r"^(\S+\.py::\S+) .*?\b(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b", text, re.M):
        word = m.group(2)
        results[m.group(1)] = ({"PASSED": OK, "SKIPPED": SKIPPED, "XFAIL": OK}.get(word, FAIL), "")
    return results


def pytest_results(junit: str, run: StepRun, out: Outcome) -> dict:
    """The JUnit file's results, else those pytest -v printed before a kill."""
    results = parse_junit(junit)
    return results if results else parse_verbose(run.output(out))


def pytest_argv(targets: list[str], junit: str, extra: list[str] = ()) -> list[str]:
    # -v: a line per test as it ends, so that a killed run still tells
    # which tests it finished; -s: ranks' and faulthandler's output as written.
    return ["-m", "pytest", "-v", "-s", "-rfEs", "-p", "no:cacheprovider",
            "-o", "faulthandler_timeout=90", f"--junitxml={junit}", *extra, *targets]


def summarize_junit(results: dict, out: Outcome) -> tuple[str, str]:
    """(status, reason) of one pytest run from its JUnit results."""
    counts = {OK: 0, FAIL: 0, SKIPPED: 0}
    for status, _ in results.values():
        counts[status] += 1
    failed = [(node, msg) for node, (status, msg) in results.items() if status == FAIL]
    parts = [f"{counts[OK]} passed"] + ([f"{counts[FAIL]} failed"] if counts[FAIL] else [])
    if counts[SKIPPED]:
        parts.append(f"{counts[SKIPPED]} skipped")
    text = ", ".join(parts)
    if failed:
        node, msg = failed[0]
        text += f"; first: {node.split('::')[-1]}: {msg}"
    if out.timed_out:
        return TIMEOUT, f"{out.describe()}; {text}"
    if not results:
        return FAIL, f"pytest reported nothing ({out.describe()})"
    if failed or out.rc not in (0, 5):
        return FAIL, text if failed else f"{out.describe()}; {text}"
    if counts[OK] == 0:
        reasons = sorted({msg for status, msg in results.values() if status == SKIPPED})
        return SKIPPED, f"all {counts[SKIPPED]} skipped: {'; '.join(reasons)[:200]}"
    return OK, text


def step_kernel(check: "Check", run: StepRun):
    junit = os.path.join(check.logs, "kernel.xml")
    out = run.python(pytest_argv([check.kernel_file], junit), cwd=check.test_root)
    results = pytest_results(junit, run, out)
    check.kernel_verdicts = results
    status, reason = summarize_junit(results, out)
    for node, (st, msg) in results.items():
        if st == FAIL:
            run.sub(node.split("::", 1)[-1], st, 0.0, msg)
    return status, reason


def step_smoke(check: "Check", run: StepRun):
    path = os.path.join(check.logs, "smoke.json")
    budget = max(5.0, run.left() - 3.0)
    out = run.python([os.path.join("tests", "gpu_smoke.py"), "--json", path, "--deadline-s", f"{budget:.0f}"])
    try:
        with open(path) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        return (TIMEOUT if out.timed_out else FAIL), f"the smoke test wrote no results ({out.describe()})"
    for op in rep.get("ops", []):
        run.sub(op["op"], op["status"], op.get("seconds", 0.0), op.get("reason", ""))
    run.details.update({k: v for k, v in rep.items() if k != "ops"})
    bad = [op for op in rep.get("ops", []) if op["status"] in (FAIL, TIMEOUT)]
    text = ", ".join(f"{op['op']} {op['status']}" for op in rep.get("ops", [])) or rep.get("reason", "")
    if out.timed_out:
        return TIMEOUT, f"{out.describe()}: {text}"
    if rep.get("status") == SKIPPED:
        return SKIPPED, rep.get("reason", "")
    if bad or not out.ok:
        first = bad[0] if bad else None
        detail = f"; {first['op']}: {first.get('reason', '')}" if first else f" ({out.describe()})"
        return (TIMEOUT if any(op["status"] == TIMEOUT for op in bad) else FAIL), text + detail[:200]
    return OK, text


# The kernel tests run under the sanitizers (with SMDDP_KERNEL_TEST_QUICK=1):
# every code path of the kernel once (its scalar head and tail, each vector
# width, every offset and small size, in place, the refusals) in float32, and
# the vector path of the half types. The tools slow each test to seconds, and
# the whole selection must end inside the step's cap to give a verdict.
SANITIZER_MEMCHECK = ("(float32 and (raw-finalize or every_offset or every_small_size)) or "
                      "(in_place and float32 and MAX) or (SUM-raw-finalize and not PREMUL) or seventeen or bad_out")
SANITIZER_RACECHECK = "float32-SUM-raw-finalize or float32-MAX-raw-finalize"


def sanitizer_errors(text: str) -> tuple[bool, int]:
    """(whether the tool printed its summary, the errors it counted) from
    compute-sanitizer's output. memcheck ends with "ERROR SUMMARY: N errors",
    racecheck with "RACECHECK SUMMARY: H hazards displayed (N errors, W
    warnings)"; warnings are not errors. A run killed before its summary is
    judged by the reports printed as they happened."""
    counts = [int(n) for n in re.findall(r"^=+ ERROR SUMMARY: (\d+) error", text, re.M)]
    counts += [int(n) for n in re.findall(r"^=+ RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) error", text, re.M)]
    if counts:
        return True, sum(counts)
    reports = re.findall(r"^=+ (?!\w+ SUMMARY)(?:Invalid|Program hit|Error|Race|.*[Hh]azard)", text, re.M)
    return False, len(reports)


def step_sanitizer(check: "Check", run: StepRun):
    cs = (check.facts.get("tools") or {}).get("compute-sanitizer") or shutil.which("compute-sanitizer")
    runtime = check.facts.get("runtime", "?")
    if not cs:
        return SKIPPED, "compute-sanitizer not found"
    # The probe: the smallest torch program under memcheck.
    probe = run.run([cs, "--tool", "memcheck", "--error-exitcode", "99", PY, "-c",
                     "import torch; x = torch.ones(8, device='cuda'); torch.cuda.synchronize(); print('probe', (x + 1).sum().item())"],
                    timeout=min(60.0, run.left()))
    text = run.output(probe)
    if not probe.ok or "probe 16.0" not in text:
        why = _first_error_line(text) or probe.describe()
        run.sub("probe", SKIPPED, probe.seconds, why)
        return SKIPPED, f"runtime ({runtime}): compute-sanitizer cannot run here: {why}"
    run.sub("probe", OK, probe.seconds, "memcheck runs a torch program")
    # The kernel test's quick set (every code path, small sizes: the tools
    # slow kernels down many times), every tensor its own allocation so that
    # memcheck sees an access past one.
    env = {"SMDDP_KERNEL_TEST_QUICK": "1", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    worst = OK
    reasons = []
    for tool, share, select in (("memcheck", 0.7, SANITIZER_MEMCHECK), ("racecheck", 1.0, SANITIZER_RACECHECK)):
        if run.left() < 20:
            run.sub(tool, SKIPPED, 0.0, "no time left")
            reasons.append(f"{tool} skipped (no time)")
            continue
        junit = os.path.join(check.logs, f"sanitizer-{tool}.xml")
        argv = [cs, "--tool", tool, "--error-exitcode", "99", "--print-limit", "50", "--target-processes", "all",
                PY, *pytest_argv([check.kernel_file], junit, ["-k", select])]
        out = run.run(argv, timeout=max(20.0, run.left() * share), env=env)
        text = run.output(out)
        summary, errors = sanitizer_errors(text)
        junit_status, junit_reason = summarize_junit(pytest_results(junit, run, out), out)
        if errors or out.rc == 99:
            status, why = FAIL, f"{errors} sanitizer errors: " + (_first_error_line(text) or "")
        elif out.timed_out:
            status, why = TIMEOUT, f"no error reported before the kill; {junit_reason}"
        elif junit_status == FAIL:
            status, why = FAIL, f"no sanitizer error, but tests failed: {junit_reason}"
        elif not summary:
            status, why = FAIL, f"no ERROR SUMMARY in its output ({out.describe()})"
        else:
            status, why = OK, f"0 errors; {junit_reason}"
        run.sub(tool, status, out.seconds, why)
        reasons.append(f"{tool} {status}")
        if status in (FAIL, TIMEOUT) and worst == OK:
            worst = status
    return worst, ", ".join(reasons)


def collect_ids(run: StepRun, files: list[str], cwd: str = ROOT) -> list[str]:
    out = run.python(["-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files], timeout=60, cwd=cwd)
    ids = []
    for line in run.output(out).splitlines():
        line = line.strip()
        if "::" in line and not line.startswith(("#", "$")) and " " not in line:
            ids.append(line)
    return ids


def timeout_marks(path: str) -> dict[str, float]:
    """Each test function's ``@pytest.mark.timeout(N)`` in the file at path."""
    import ast

    with open(path) as f:
        tree = ast.parse(f.read(), path)
    marks = {}
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef):
            for d in fn.decorator_list:
                if (isinstance(d, ast.Call) and ast.unparse(d.func) == "pytest.mark.timeout" and d.args
                        and isinstance(d.args[0], ast.Constant)):
                    marks[fn.name] = float(d.args[0].value)
    return marks


def longest_first(ids: list[str], root: str) -> list[str]:
    """Test ids by their timeout marks, the longest first (ties in file
    order): started first, the long tests are not cut by the step's end, and
    the short ones fill the job slots around them."""
    marks: dict[str, dict[str, float]] = {}
    for node in ids:
        file = node.split("::", 1)[0]
        if file not in marks:
            try:
                marks[file] = timeout_marks(os.path.join(root, file))
            except (OSError, SyntaxError):
                marks[file] = {}

    def bound(node: str) -> float:
        file, name = node.split("::", 1)
        return marks[file].get(name.split("[", 1)[0], 0.0)

    return sorted(ids, key=lambda node: -bound(node))


def _short(node: str) -> str:
    """A test id without its folder: test_cuda.py::test_x[2]."""
    return node.split("/", 1)[-1]


def step_tests(check: "Check", run: StepRun):
    """Each test id of tests/test_cuda.py in its own pytest process; then the
    kernel tests the kernel step left without a verdict (it was killed): the
    first of them alone (the one it was stuck in), the rest together, again
    while some are left and time allows."""
    ids = collect_ids(run, check.alone_files + [check.kernel_file], cwd=check.test_root)
    if check.args.tests:
        wanted = [w for w in check.args.tests.split(",") if w]
        ids = [i for i in ids if any(w in i for w in wanted)]
        run.details["selected_by"] = wanted
    if not ids:
        return FAIL, "no test ids collected (see the log)"
    env = {"SMDDP_TEST_TIMEOUT_SCALE": str(check.args.test_timeout_scale), "SMDDP_TEST_STACK_DUMPS": "1"}
    counts = {OK: 0, FAIL: 0, SKIPPED: 0, TIMEOUT: 0}
    runs = 0

    def verdict(out: Outcome, junit: str) -> tuple[str, str, dict, float]:
        results = pytest_results(junit, run, out)
        status, reason = summarize_junit(results, out)
        if status == SKIPPED:
            reason = reason.split(": ", 1)[-1]
        return status, reason, results, out.seconds

    def pytest(targets: list[str]) -> tuple[str, str, dict, float]:
        nonlocal runs
        junit = os.path.join(check.logs, f"tests-{runs:02d}.xml")
        runs += 1
        out = run.python(pytest_argv(targets, junit), timeout=check.args.test_cap_s, env=env, cwd=check.test_root)
        return verdict(out, junit)

    kernel = check.kernel_file + "::"
    alone = longest_first([i for i in ids if not i.startswith(kernel)], check.test_root)
    seen = set(check.kernel_verdicts)
    pending = [i for i in ids if i.startswith(kernel) and i not in seen]
    run.details["alone"] = alone
    run.details["kernel_leftovers"] = list(pending)
    # Each alone, --test-jobs of them side by side: most of a test's time is
    # its processes starting (torch, CUDA, NCCL), which the machine's cores
    # do in parallel. Each has a log of its own.
    queue, running = list(alone), []
    try:
        while queue or running:
            while queue and len(running) < max(1, check.args.test_jobs):
                node = queue.pop(0)
                if run.left() < 10:
                    run.sub(_short(node), SKIPPED, 0.0, "no time left")
                    counts[SKIPPED] += 1
                    continue
                junit, log = (os.path.join(check.logs, f"tests-{runs:02d}.{ext}") for ext in ("xml", "log"))
                runs += 1
                child = run.start([PY, *pytest_argv([node], junit)], timeout=check.args.test_cap_s, env=env,
                                  cwd=check.test_root, log_path=log)
                running.append((node, child, junit))
            for item in list(running):
                node, child, junit = item
                if isinstance(child, Child):
                    if child.poll() is None:
                        continue
                    child = run.ended(child)
                running.remove(item)
                status, reason, _, secs = verdict(child, junit)
                run.sub(_short(node), status, secs, reason)
                counts[status] += 1
            time.sleep(0.1)
    except BaseException:
        for _, child, _ in running:
            if isinstance(child, Child):
                child.interrupt()
        raise
    while pending and run.left() >= 10:
        first, rest = pending[0], pending[1:]
        status, reason, _, secs = pytest([first])
        run.sub(_short(first), status, secs, reason)
        counts[status] += 1
        if not rest or run.left() < 10:
            pending = rest
            break
        status, reason, res, secs = pytest(rest)
        run.sub(f"{len(rest)} more kernel tests together", status, secs, reason)
        for node, (st, msg) in res.items():
            if node in rest:
                counts[st] += 1
                if st == FAIL:
                    run.sub(_short(node), st, 0.0, msg)
        pending = [i for i in rest if i not in res]
        if status == TIMEOUT:
            counts[TIMEOUT] += 1
    if pending:
        run.sub(f"{len(pending)} kernel tests", SKIPPED, 0.0, "no time left")
        counts[SKIPPED] += len(pending)
    text = ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "nothing to run"
    if counts[TIMEOUT]:
        return TIMEOUT, text
    if counts[FAIL]:
        return FAIL, text
    if counts[OK] == 0:
        return SKIPPED, text
    return OK, text


def _kernel_bench_reason(path: str) -> str | None:
    """The best ratio to the device-to-device copy per dtype, at the largest
    size and aligned buffers (a gpu-kernels record's results)."""
    try:
        with open(path) as f:
            rows = json.load(f)["results"]
        best = {}
        for r in rows:
            if r.get("offset", 0):
                continue
            cur = best.get(r["dtype"])
            if cur is None or (r["bytes"], r["ratio"]) > (cur["bytes"], cur["ratio"]):
                best[r["dtype"]] = r
        return "; ".join(f"{k} {r['bytes'] >> 20} MiB: {r['ratio'] * 100:.0f} % of copy ({r['reduce_gbps']:.0f} "
                         f"against {r['copy_gbps']:.0f} GB/s, {r['blocks']} blocks)" for k, r in best.items()) or None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _collectives_reason(path: str) -> str | None:
    """The busbw of each op and backend at the op's largest size (a sweep
    record's points), and the time over the one-process floor where the
    record has one (bench/gpu_collectives.py)."""
    try:
        with open(path) as f:
            rec = json.load(f)
        points = rec["results"]
        largest = {}
        for r in points:
            largest[r["op"]] = max(largest.get(r["op"], 0), r["size_bytes"])
        floor = {(f["op"], f["size_bytes"]): f["time_over_floor"] for f in rec.get("floor", [])}
        parts = []
        for op, size in largest.items():
            cells = []
            for r in (r for r in points if r["op"] == op and r["size_bytes"] == size):
                over = floor.get((op, size), {}).get(r["backend"])
                cells.append(f"{r['backend']} " + (
                    f"busbw {r['busbw_gbs']:.0f} GB/s{' WRONG' if r.get('wrong') else ''}"
                    + (f" ({over:.2f}x the floor)" if over else "") if "busbw_gbs" in r
                    else r["status"] + (f" ({r['note']})" if r.get("note") else "")))  # fmt: skip
            parts.append(f"{op} {size >> 20} MiB: " + ", ".join(cells))
        return "; ".join(parts) or None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _latency_reason(path: str) -> str | None:
    """Each mode's latency, and the host's time in the call where the record
    has it (a gpu-latency record's results)."""
    try:
        with open(path) as f:
            rows = json.load(f)["results"]
        return ", ".join(f"{r['mode']} failed ({r['error']})" if r.get("error") else
                         f"{r['mode']} {r['latency_us']:.1f} us"
                         + (f" (host {r['host_us']:.1f})" if "host_us" in r else "")
                         + ("" if r["ok"] else " WRONG") for r in rows) or None  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return None


# The benchmarks write their records as they go: one killed at its cap still
# says what it measured.
def _fresh(path: str) -> str:
    """path, with no record of an earlier run left at it."""
    if os.path.exists(path):
        os.remove(path)
    return path


def step_bench_kernels(check: "Check", run: StepRun):
    path = _fresh(os.path.join(check.out, "kernels.json"))
    out = run.python([os.path.join("bench", "gpu_kernels.py"), "--json", path])
    summary = _kernel_bench_reason(path)
    if out.timed_out:
        return TIMEOUT, out.describe() + (f"; so far: {summary}" if summary else "")
    if not out.ok:
        return FAIL, f"{out.describe()}: {_bench_line(run.output(out))}"
    return OK, summary or _bench_line(run.output(out))


def step_bench_collectives(check: "Check", run: StepRun):
    path = _fresh(os.path.join(check.out, "collectives.json"))
    out = run.python([os.path.join("bench", "gpu_collectives.py"), "--nproc", "2", "--json", path])
    if out.timed_out:
        return TIMEOUT, out.describe()
    if not out.ok:
        return FAIL, f"{out.describe()}: {_bench_line(run.output(out))}"
    return OK, "2 ranks sharing the GPU (not NVLink): " + (_collectives_reason(path) or _bench_line(run.output(out)))


# A node's worth of ranks (as on p4d) for what the host spends enqueueing a
# call: a memops exchange's middle step is five operations per peer, each a
# driver call of its own unless batched (SMDDP_CUDA_BATCH_MEMOPS). A fact
# beside the step's verdict, run only when the two-rank modes passed.
WIDE_RANKS = 8
WIDE_RESERVE_S = 45.0


def step_bench_latency(check: "Check", run: StepRun):
    path = _fresh(os.path.join(check.out, "latency.json"))
    out = run.python([os.path.join("bench", "gpu_latency.py"), "--nproc", "2", "-n", "100", "--json", path],
                     timeout=max(1.0, run.left() - WIDE_RESERVE_S))  # fmt: skip
    summary = _latency_reason(path)
    if out.timed_out:
        return TIMEOUT, out.describe() + (f"; so far: {summary}" if summary else "")
    if not out.ok:
        return FAIL, f"{out.describe()}: {summary or _bench_line(run.output(out))}"
    if run.left() > 20:
        wide = _fresh(os.path.join(check.out, f"latency-{WIDE_RANKS}.json"))
        more = run.python([os.path.join("bench", "gpu_latency.py"), "--nproc", str(WIDE_RANKS), "--modes",
                           "memops,memops+batch", "-n", "30", "--json", wide], timeout=run.left() - 2)  # fmt: skip
        status = OK if more.ok else TIMEOUT if more.timed_out else FAIL
        run.sub(f"{WIDE_RANKS} ranks", status, more.seconds, _latency_reason(wide) or more.describe())
    return OK, "4 KiB AllReduce, 2 ranks sharing the GPU: " + (summary or _bench_line(run.output(out)))


STEPS = [
    Step("env", step_env, cap_s=45, min_s=10, doc="machine facts"),
    Step("ipc", step_ipc, cap_s=60, min_s=15, gpu=True, doc="CUDA IPC with torch alone"),
    Step("build", step_build, cap_s=240, min_s=60, doc="setup.py build_ext --inplace (sm_90, -lineinfo)",
         skip=lambda check: "--skip-build: the extension already built is used" if check.args.skip_build else None),
    Step("import", step_import, cap_s=40, min_s=10, doc="smddp and its CUDA module"),
    Step("kernel", step_kernel, cap_s=90, min_s=20, gpu=True, needs=("import",), doc="the reduction kernel, bit for bit"),
    Step("smoke", step_smoke, cap_s=60, min_s=20, gpu=True, needs=("import",), doc="each native op, 2 ranks"),
    # The benchmarks give the numbers a GPU run is for and end by themselves;
    # the tests step can use any time it gets, so it comes after them and
    # takes what is left.
    Step("bench-kernels", step_bench_kernels, cap_s=60, min_s=30, gpu=True, needs=("import",),
         doc="bench/gpu_kernels.py"),
    Step("bench-collectives", step_bench_collectives, cap_s=120, min_s=60, gpu=True, needs=("import",),
         doc="bench/gpu_collectives.py --nproc 2 (staged and zero-copy)"),
    Step("bench-latency", step_bench_latency, cap_s=180, min_s=50, gpu=True, needs=("import",),
         doc="bench/gpu_latency.py --nproc 2, then 8"),
    Step("tests", step_tests, cap_s=200, min_s=60, gpu=True, needs=("import",), doc="each GPU test id alone, --test-jobs at a time"),
    Step("sanitizer", step_sanitizer, cap_s=90, min_s=20, gpu=True, needs=("import",), doc="compute-sanitizer"),
]


# ---------------------------------------------------------------- the run


class Interrupted(BaseException):
    """SIGTERM or SIGINT: the results so far are written, then the check ends."""


def _interrupt(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


class Check:
    def __init__(self, args, steps: list[Step]):
        self.args = args
        self.steps = steps
        self.t0 = time.monotonic()
        self.started = time.strftime("%Y-%m-%d %H:%M:%S")
        self.deadline = self.t0 + args.deadline_s
        self.out = os.path.abspath(args.out)
        os.makedirs(self.out, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="smddp-gpu-check-")
        self.logs = os.path.join(self.work, "logs")
        os.makedirs(self.logs)
        self.main_log = open(os.path.join(self.logs, "gpu_check.log"), "a", buffering=1)
        self.facts: dict = {}
        self.kernel_verdicts: dict = {}
        # The GPU tests (relative to test_root, where pytest runs).
        self.test_root = ROOT
        self.kernel_file = "tests/test_cuda_kernel.py"
        self.alone_files = ["tests/test_cuda.py"]
        self.results: list[Result] = []

    def say(self, text: str) -> None:
        stamp = f"[{time.monotonic() - self.t0:6.1f} s] "
        for line in text.splitlines() or [""]:
            print(stamp + line, flush=True)
            self.main_log.write(stamp + line + "\n")

    def gpu(self) -> bool:
        """Whether there is a GPU to run the GPU steps on (when the env step
        could not tell, nvidia-smi's list decides; when nothing is known, the
        steps run and say what is wrong)."""
        if self.args.force_gpu_steps:
            return True
        tf = self.facts.get("torch") or {}
        if "cuda_available" in tf:
            return bool(tf["cuda_available"])
        if "gpus" in self.facts:
            return bool(self.facts["gpus"])
        return True

    def status_of(self, name: str) -> str | None:
        for r in self.results:
            if r.name == name:
                return r.status
        return None

    def budget(self, index: int) -> tuple[float, str | None]:
        step = self.steps[index]
        left = self.deadline - time.monotonic() - PACK_RESERVE_S
        later = sum(s.min_s for s in self.steps[index + 1:]
                    if not (s.gpu and not self.gpu()) and not (s.skip and s.skip(self)))
        budget = min(step.cap_s, left - later)
        if budget < step.min_s:
            # Short of time: this step takes what there is, later ones less.
            budget = min(step.cap_s, left)
        if budget < step.min_s:
            return budget, f"no time left ({max(0.0, left):.0f} s, needs {step.min_s:.0f} s)"
        return budget, None

    def run_step(self, index: int) -> Result:
        step = self.steps[index]
        t = time.monotonic()
        why = None
        for dep in step.needs:
            st = self.status_of(dep)
            if st not in (OK, None) and not (dep == "build" and st == SKIPPED):
                why = f"needs {dep}, which ended {st}"
                break
        if why is None and step.skip is not None:
            why = step.skip(self)
        if why is None and step.gpu and not self.gpu():
            why = "no GPU"
        budget = 0.0
        if why is None:
            budget, why = self.budget(index)
        if why is not None:
            return Result(step.name, SKIPPED, 0.0, why)
        self.say(f"=== {step.name}: {step.doc} (cap {budget:.0f} s, {self.deadline - time.monotonic():.0f} s left)")
        run = StepRun(self, step, budget)
        try:
            status, reason = step.fn(self, run)
        except Exception:
            text = traceback.format_exc()
            run.note(text)
            status, reason = FAIL, "the check itself failed: " + text.strip().splitlines()[-1]
        if run.capped and status in (OK, FAIL):
            status, reason = TIMEOUT, f"over its {budget:.0f} s cap: {reason}"
        return Result(step.name, status, time.monotonic() - t, reason, cap_s=budget,
                      log=os.path.basename(run.log_path), details=run.details, subs=run.subs)

    def run(self) -> int:
        self.say(f"smddp GPU check: deadline {self.args.deadline_s:.0f} s, results in {self.out}, work in {self.work}")
        self.pack()
        previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._run_steps()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        failed = [r for r in self.results if r.status in (FAIL, TIMEOUT)]
        for r in failed:
            if r.log:
                self.say(f"\n--- the end of {r.log} ({r.name}: {r.status})")
                for line in self.log_tail(r.log, 25):
                    self.say("  " + line)
        self.say("")
        self.say(self.table())
        self.main_log.flush()
        self.pack()
        return 1 if failed else 0

    def _run_steps(self) -> None:
        for i, step in enumerate(self.steps):
            t = time.monotonic()
            try:
                res = self.run_step(i)
            except Interrupted as e:
                self.say(f"--- interrupted ({e}) in {step.name}")
                self.results.append(Result(step.name, TIMEOUT, time.monotonic() - t, f"interrupted ({e})",
                                           log=f"{step.name}.log"))
                self.results += [Result(s.name, SKIPPED, 0.0, "the check was interrupted") for s in self.steps[i + 1:]]
                return
            self.results.append(res)
            self.say(f"--- {res.name}: {res.status} ({res.seconds:.1f} s) {res.reason}")
            for sub in res.subs:
                self.say(f"      {sub['name']}: {sub['status']} {sub['reason']}")
            self.pack()

    def log_tail(self, name: str, n: int) -> list[str]:
        path = os.path.join(self.logs, name)
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - 64 * 1024))
                return [line[:300] for line in tail_lines(f.read().decode(errors="replace"), n)]
        except OSError:
            return []

    def table(self) -> str:
        rows = [("step", "status", "secs", "reason")]
        for r in self.results:
            rows.append((r.name, r.status, f"{r.seconds:.1f}", r.reason))
            for sub in r.subs:
                rows.append(("  " + sub["name"], sub["status"], f"{sub['seconds']:.1f}", sub["reason"]))
        # Longer names push their row's other columns right, uncut.
        width = min(40, max(len(r[0]) for r in rows))
        lines = [f"{'smddp GPU check':{width}}  {self.started}, "
                 f"{time.monotonic() - self.t0:.0f} s of {self.args.deadline_s:.0f} s"]
        for name, status, secs, reason in rows:
            lines.append(f"{name:{width}}  {status:8} {secs:>6}  {reason}")
        return "\n".join(lines)

    # What comes back: at most len(OUT_FILES) plain files in OUT.
    def pack(self) -> None:
        try:
            self._write(os.path.join(self.out, "results.json"), json.dumps(self.report(), indent=1, default=str))
            summary = [self.table(), ""]
            for r in self.results:
                if r.status in (FAIL, TIMEOUT) and r.log:
                    summary.append(f"--- the end of {r.log} ({r.name}: {r.status})")
                    summary.extend(self.log_tail(r.log, 40))
                    summary.append("")
            self._write(os.path.join(self.out, "summary.txt"), "\n".join(summary) + "\n")
            self._write_tar(os.path.join(self.out, "logs.tar.gz"))
        except Exception:
            # Writing the results must never end the run.
            traceback.print_exc()

    def report(self) -> dict:
        return {
            "started": self.started,
            "elapsed_s": round(time.monotonic() - self.t0, 1),
            "deadline_s": self.args.deadline_s,
            "argv": sys.argv,
            "work_dir": self.work,
            "facts": self.facts,
            "steps": [dataclasses.asdict(r) for r in self.results],
        }

    @staticmethod
    def _write(path: str, text: str) -> None:
        tmp = path + ".part"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)

    def _write_tar(self, path: str) -> None:
        keep = LOG_KEEP_BYTES
        while True:
            tmp = path + ".part"
            with tarfile.open(tmp, "w:gz") as tar:
                for name in sorted(os.listdir(self.logs)):
                    full = os.path.join(self.logs, name)
                    if not os.path.isfile(full) or name.endswith(".part"):
                        continue
                    data = _clipped(full, keep)
                    info = tarfile.TarInfo(f"logs/{name}")
                    info.size = len(data)
                    info.mtime = int(time.time())
                    tar.addfile(info, io.BytesIO(data))
            if os.path.getsize(tmp) <= TAR_LIMIT_BYTES or keep <= 64 * 1024:
                os.replace(tmp, path)
                return
            keep //= 4


def _clipped(path: str, keep: int) -> bytes:
    """A file's bytes, or its head and tail when it is longer than keep."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if size <= keep:
            return f.read()
        head = f.read(keep // 4)
        f.seek(size - (keep - keep // 4))
        tail = f.read()
    return head + f"\n[... {size - len(head) - len(tail)} bytes left out ...]\n".encode() + tail


def select(steps: list[Step], only: str | None, skip: str | None) -> list[Step]:
    names = {s.name for s in steps}
    chosen = steps
    for opt, value in (("--only", only), ("--skip", skip)):
        if value:
            wanted = {v.strip() for v in value.split(",") if v.strip()}
            unknown = wanted - names
            if unknown:
                sys.exit(f"{opt}: unknown steps {sorted(unknown)}; steps: {', '.join(s.name for s in steps)}")
            chosen = [s for s in chosen if (s.name in wanted) == (opt == "--only")]
    return chosen


def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deadline-s", type=float, default=480.0, help="the whole run's limit (default 480)")
    p.add_argument("--out", default=os.environ.get("OUT") or "gpu-results",
                   help="where the results go (default $OUT, else gpu-results)")
    p.add_argument("--skip-build", action="store_true", help="use the extension already built")
    p.add_argument("--only", help="run only these steps (comma-separated)")
    p.add_argument("--skip", help="leave these steps out (comma-separated)")
    p.add_argument("--list", action="store_true", help="list the steps and exit")
    p.add_argument("--force-gpu-steps", action="store_true", help="run the GPU steps even where no GPU is seen")
    p.add_argument("--tests", help="run only the test ids that contain one of these (comma-separated)")
    p.add_argument("--test-cap-s", type=float, default=150.0, help="the cap of one test id in the tests step")
    p.add_argument("--test-jobs", type=int, default=3, help="test ids the tests step runs side by side (default 3)")
    p.add_argument("--test-timeout-scale", type=float, default=0.5,
                   help="SMDDP_TEST_TIMEOUT_SCALE for the tests step (default 0.5: the harness gives up on a "
                        "silent pool, with its ranks' stacks, before the test's cap)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None, steps: list[Step] | None = None) -> int:
    args = parse_args(argv)
    steps = select(steps or STEPS, args.only, args.skip)
    if args.list:
        for s in steps:
            print(f"{s.name:18} cap {s.cap_s:4.0f} s  min {s.min_s:3.0f} s  {'GPU ' if s.gpu else '    '}{s.doc}")
        return 0
    os.chdir(ROOT)
    return Check(args, steps).run()


if __name__ == "__main__":
    sys.exit(main())
