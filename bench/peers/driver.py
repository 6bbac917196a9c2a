"""The driver of the peer comparison: arguments, the plan, the peers'
environments, the jobs (one launch of an implementation's ranks per world
size, watched point by point) and the outputs."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any, Callable

from smddp.bench import launch, plot, record, timing, views
from smddp.bench import ops as _ops
from smddp.bench.units import OP_ALIASES, HelpFormatter, arg, choose, format_size, parse_counts
from smddp.bench.units import parse_size_list, positive

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUIREMENTS = os.path.join(REPO, "bench", "peers_requirements.txt")
IMPLS = ("smddp", "gloo", "mpich", "openmpi", "deepspeed")
MPI_IMPLS = ("mpich", "openmpi")
OPS = ("all_gather", "reduce_scatter", "all_reduce")
DTYPES = ("float32", "bfloat16")
# Packages of each peer venv; versions come from peers_requirements.txt.
PEER_PACKAGES = {"mpich": ("mpi4py", "mpich"), "openmpi": ("mpi4py", "openmpi"), "deepspeed": ("deepspeed",)}
ALIASES = {"fp32": "float32", "float": "float32", "f32": "float32", "bf16": "bfloat16",
           "ompi": "openmpi", "open-mpi": "openmpi", "ds": "deepspeed", **OP_ALIASES}  # fmt: skip


# Spinning implementations with more ranks than cores can take seconds per
# call: a barrier before each call, and a cap on the seconds of a point.
TIMING = timing.Timing(timing.BARRIER_EACH, 2, 0, None, 0.2, 5, 1000, 1, 6.0)
TIMING_OPTIONS = ("warmup", "time_per_point", "min_iters", "max_iters", "cap")


# What the record keeps of the settings (besides its timing and command).
SETTINGS = ("impls", "ops", "dtypes", "sizes", "ranks", "point_timeout", "start_timeout",
            "mpi_bf16", "venv_dir", "setup", "out", "plot")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.peers", formatter_class=HelpFormatter,
        description="smddp, gloo, MPICH, Open MPI and DeepSpeed's shared-memory collectives on "
        "this host, measured alike, in one table (busbw and smddp's ratio to the best peer).",
    )  # fmt: skip
    g = p.add_argument_group("what to run")
    for flag, allowed, what in (("--impls", IMPLS, "implementation"), ("--ops", OPS, "op"),
                                ("--dtypes", DTYPES, "dtype")):  # fmt: skip
        names = lambda text, allowed=allowed, what=what: choose(text, allowed, what, ALIASES, True)  # noqa: E731
        g.add_argument(flag, type=arg(names), default=",".join(allowed), help="comma list, or all")
    g.add_argument("--sizes", type=arg(lambda text: tuple(sorted(set(parse_size_list(text))))),
                   default="4K,64K,1M,16M,256M", help="comma list of nccl-tests sizes")
    g.add_argument("--ranks", type=arg(lambda text: parse_counts(text, 2)), default="2,4,8",
                   help="comma list of world sizes")
    g.add_argument("--mpi-bf16", choices=("numpy", "off"), default="numpy",
                   help="MPI bfloat16 reductions: a user-defined MPI_Op in numpy, or n/a")
    g = p.add_argument_group("how long")
    timing.add_options(g, TIMING, TIMING_OPTIONS)
    g.add_argument("--point-timeout", type=positive, default=40.0,
                   help="seconds after which a point is taken as hung: the ranks are killed")
    g.add_argument("--start-timeout", type=positive, default=300.0,
                   help="seconds the ranks of one implementation may take to start")
    g = p.add_argument_group("environments and output")
    g.add_argument("--venv-dir", default=".venv-peers", help="where the peer venvs live")
    how = g.add_mutually_exclusive_group()
    how.add_argument("--setup-only", action="store_true", help="create the peer venvs and stop")
    how.add_argument("--no-setup", action="store_true", help="use the peer venvs as they are; never pip")
    g.add_argument("--out", default=os.path.join("bench-results", "peers"),
                   help="prefix of the .txt, .json, .png files")
    g.add_argument("--json", help="the record here instead of OUT.json")
    g.add_argument("--no-plot", action="store_true", help="no PNG")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The settings a command line asks for (SystemExit(2) with a message if wrong)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    s = parser.parse_args(argv)
    s.timing = timing.from_options(s, TIMING, parser)
    if s.timing.warmup < 1:
        parser.error("--warmup must be at least 1: the warm-up plans the point")
    if s.point_timeout <= s.timing.cap:
        parser.error("--point-timeout must be above --point-cap")
    # auto: create the missing venvs; only: create them and stop; skip: never.
    s.setup = "only" if s.setup_only else "skip" if s.no_setup else "auto"
    s.json_path, s.plot = s.json or s.out + ".json", not s.no_plot
    s.argv = ["python", "-m", "bench.peers", *argv]
    return s


# -- the plan ---------------------------------------------------------------------------

Point = tuple[str, str, int]  # op, dtype, requested bytes


@dataclass
class Job:
    """One implementation at one world size: one launch of its ranks."""

    impl: str
    world: int
    points: list[Point]


def unsupported(impl: str, op: str, dtype: str, mpi_bf16: str = "numpy") -> str | None:
    """Why ``impl`` has no ``op`` on ``dtype`` (None: it has)."""
    if impl == "deepspeed" and op != "all_reduce":
        return "DeepSpeed's shared-memory path is AllReduce only"
    if impl in MPI_IMPLS and dtype == "bfloat16" and op != "all_gather" and mpi_bf16 == "off":
        return "MPI has no bfloat16 type (--mpi-bf16 off)"
    return None


def status_record(impl: str, world: int, p: Point, status: str, note: str) -> dict[str, Any]:
    """A cell that has no time: n/a, skipped, timeout, error, absent."""
    redop = "sum" if _ops.OPS[p[0]].reduces else "none"
    return record.point(impl, p[0], p[1], redop, world, p[2], status=status, note=note)


def plan(s: argparse.Namespace) -> tuple[list[Job], list[dict[str, Any]]]:
    """The jobs to launch, and the records of cells that need none (n/a)."""
    jobs: list[Job] = []
    fixed: list[dict[str, Any]] = []
    for world, impl in itertools.product(s.ranks, s.impls):
        job = Job(impl, world, [])
        for op, dtype, n in itertools.product(s.ops, s.dtypes, s.sizes):
            if _ops.geometry(op, n, _ops.DTYPES[dtype][0], world) is None:
                continue
            if why := unsupported(impl, op, dtype, s.mpi_bf16):
                fixed.append(status_record(impl, world, (op, dtype, n), "n/a", why))
            else:
                job.points.append((op, dtype, n))
        jobs += [job] if job.points else []
    return jobs, fixed


# -- the peers' environments --------------------------------------------------------------


def _fingerprint(name: str) -> str:
    with open(REQUIREMENTS, "rb") as f:
        h = hashlib.sha256(f.read())
    h.update(repr((name, PEER_PACKAGES[name], sys.version, sysconfig.get_paths()["purelib"])).encode())
    return h.hexdigest()[:16]


def _run_logged(cmd: list[str], log: str, timeout: float, env: dict[str, str] | None = None) -> int:
    """``cmd``, output to ``log``; killed with all it started past ``timeout`` seconds."""
    with launch.Ranks() as ranks:
        ranks.command(cmd, env, log, cmd[0])
        try:
            return ranks.procs[0][1].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            ranks.kill()
    with open(log, "a") as f:
        f.write(f"\n(killed after {timeout:.0f} s)\n")
    return launch.EXIT_TIMEOUT


def _tail(path: str, lines: int = 6) -> str:
    try:
        with open(path, errors="replace") as f:
            return " | ".join([ln.rstrip() for ln in f if ln.strip()][-lines:])
    except OSError:
        return ""


_VERSION_PROBE = {
    "mpich": "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0].strip())",
    "openmpi": "from mpi4py import MPI; print(MPI.Get_library_version().split(',')[0].strip())",
    "deepspeed": "import deepspeed; print('DeepSpeed', deepspeed.__version__)",
}


def deepspeed_env(env_path: str) -> dict[str, str]:
    """Where DeepSpeed builds and finds its shared-memory op."""
    return {"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": os.path.join(env_path, "torch_extensions")}


def ensure_env(name: str, s: argparse.Namespace, say: Callable[[str], None]) -> SimpleNamespace:
    """The venv of one peer (path, ok, version, error), created (or recreated)
    when missing or stale."""
    path = os.path.abspath(os.path.join(s.venv_dir, name))
    env = SimpleNamespace(name=name, path=path, ok=False, version="", error="")
    python, stamp, log = (os.path.join(path, *p) for p in (("bin", "python"), (".peers-ready",), ("setup.log",)))
    try:
        with open(stamp) as f:
            ready = json.load(f)
        if ready.get("fingerprint") == _fingerprint(name) and os.path.exists(python):
            env.ok, env.version = True, ready.get("version", "")
            return env
    except (OSError, ValueError):
        pass
    if s.setup == "skip":
        env.error = f"no usable venv at {path} (--no-setup)"
        return env
    say(f"setting up {name} in {path} (once; a few minutes)")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    run_env = {**os.environ, **deepspeed_env(path), "OMP_NUM_THREADS": "1"}
    pth = f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"
    link = ("import sysconfig; open(sysconfig.get_paths()['purelib'] + '/_smddp_project_venv.pth',"
            f" 'w').write({pth!r})")  # fmt: skip
    steps = [
        ("python -m venv", [sys.executable, "-m", "venv", path], None),
        # The project venv's packages (torch, numpy) come after the venv's own on
        # sys.path: pip sees them as installed and never touches them.
        ("linking the project venv", [python, "-c", link], None),
        (f"pip install {' '.join(PEER_PACKAGES[name])}", [python, "-m", "pip", "install",
         "--disable-pip-version-check", "-c", REQUIREMENTS, *PEER_PACKAGES[name]], None),
    ]
    if name == "deepspeed":
        build = ("from deepspeed.accelerator import get_accelerator; "
                 "get_accelerator().create_op_builder('ShareMemCommBuilder').load()")
        steps.append(("building DeepSpeed's shared-memory op", [python, "-c", build], run_env))
    for what, cmd, cmd_env in steps:
        if _run_logged(cmd, log, 1800, cmd_env) != 0:
            env.error = f"{what} failed: {_tail(log)}"
            return env
    probe = subprocess.run([python, "-c", _VERSION_PROBE[name]], capture_output=True, text=True,
                           timeout=300, env=run_env)  # fmt: skip
    if probe.returncode != 0:
        env.error = f"import failed: {probe.stderr.strip().splitlines()[-1:]}"
        return env
    env.ok, env.version = True, probe.stdout.strip().splitlines()[-1]
    with open(stamp, "w") as f:
        json.dump({"fingerprint": _fingerprint(name), "version": env.version}, f)
    return env


# -- the jobs ------------------------------------------------------------------------------


class ProgressReader:
    """The events a job's rank 0 appends to its progress file, as they come."""

    def __init__(self, path: str):
        self.path, self._pos, self._partial = path, 0, ""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path) as f:
                f.seek(self._pos)
                text = self._partial + f.read()
                self._pos = f.tell()
        except OSError:
            return []
        lines = text.split("\n")
        self._partial = lines.pop()
        return [json.loads(ln) for ln in lines if ln.strip()]


def _rank_cmd(impl: str, envs: dict[str, Any], spec_path: str, world: int) -> list[str]:
    if impl in ("smddp", "gloo"):
        return [sys.executable, "-m", "bench.peers.worker", spec_path]
    python = os.path.join(envs[impl].path, "bin", "python")
    if impl == "deepspeed":
        return [python, "-m", "bench.peers.deepspeed_shm", spec_path]
    # More ranks than cores needs --oversubscribe; --bind-to none places the
    # ranks as the kernel sees fit, as it does for every other implementation.
    extra = ["--oversubscribe", "--bind-to", "none"] if impl == "openmpi" else []
    mpiexec = os.path.join(envs[impl].path, "bin", "mpiexec")
    return [mpiexec, "-n", str(world), *extra, python, "-m", "bench.peers.mpi", spec_path]


def _job_env(impl: str, envs: dict[str, Any]) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1"}  # fmt: skip
    # The workers import this repository's bench package and smddp.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    if impl == "deepspeed":
        env.update(deepspeed_env(envs[impl].path))
    if impl == "mpich":
        env["MPIR_CVAR_CH4_CMA_ENABLE"] = "1"
    if impl == "openmpi" and os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def _clean_shm(before: set[str], port: int | None) -> None:
    """Segments the peers leave in /dev/shm when killed (DeepSpeed's also on a
    normal exit). Only names that appeared during the job go: other jobs on
    this host (smddp's tests among them) have segments of their own there."""
    for name in set(os.listdir("/dev/shm")) - before:
        if (name.startswith(("mpich", "MPICH", "sm_segment", "vader")) or port is not None and
                name.startswith("deepspeed_allreduce_buffer_") and f"_127.0.0.1_{port}_" in name):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join("/dev/shm", name))


def run_once(job: Job, points: list[Point], envs: dict[str, Any], s: argparse.Namespace,
             logdir: str, attempt: int, on_record: Callable[[dict], None]) -> SimpleNamespace:
    """Runs the ranks of one job on ``points`` and watches them: a point that
    outlives --point-timeout, or ranks that do not start within --start-timeout,
    are killed with everything they started. Returns records, info, and for a
    job that ended early its status (timeout, error), note and failed point."""
    tag = f"{job.impl}-n{job.world}-{attempt}"
    progress, spec_path = (os.path.join(logdir, tag + ext) for ext in (".progress", ".json"))
    port, shm_before = launch.free_port(), set(os.listdir("/dev/shm"))
    with open(spec_path, "w") as f:
        json.dump({"impl": job.impl, "world": job.world, "progress": progress,
                   "points": [{"op": o, "dtype": d, "bytes": n} for o, d, n in points],
                   "timing": asdict(s.timing), "pg_timeout": s.point_timeout + 60}, f)
    out = SimpleNamespace(records=[], info={}, status="", note="", failed=None)
    per_rank = job.impl not in MPI_IMPLS
    with launch.Ranks(job.impl) as ranks:
        for rank in range(job.world if per_rank else 1):
            env = _job_env(job.impl, envs)
            if per_rank:
                env.update(RANK=str(rank), WORLD_SIZE=str(job.world), LOCAL_RANK=str(rank),
                           LOCAL_WORLD_SIZE=str(job.world), LOCAL_SIZE=str(job.world),
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
            log = f"{tag}-r{rank}.log" if per_rank else f"{tag}.log"
            ranks.command(_rank_cmd(job.impl, envs, spec_path, job.world), env,
                          os.path.join(logdir, log), log, cwd=REPO)  # fmt: skip
        reader, started, done = ProgressReader(progress), False, False
        deadline = time.monotonic() + s.start_timeout
        while True:
            for ev in reader.read():
                started |= ev["event"] == "info"
                out.info = ev.get("info", out.info)
                if ev["event"] == "begin":
                    out.failed = (ev["point"]["op"], ev["point"]["dtype"], ev["point"]["bytes"])
                elif ev["event"] == "point":
                    out.records.append(ev["record"])
                    on_record(ev["record"])
                    out.failed = None
                done |= ev["event"] == "done"
                deadline = time.monotonic() + (60 if done else s.point_timeout)
            codes = ranks.codes()
            bad = [(label, c) for (label, _), c in zip(ranks.procs, codes) if c not in (None, 0)]
            if done and (None not in codes or time.monotonic() > deadline):
                out.failed = None
                break  # finished (a slow exit loses nothing)
            if bad and not done:
                time.sleep(1.0)  # the others wait on it in a collective; let them say so
                label, code = bad[0]
                why = f"signal {-code}" if code < 0 else f"exit status {code}"
                out.status, out.note = "error", f"{label}: {why}: {_tail(os.path.join(logdir, label), 3)}"
                break
            if None not in codes:
                out.status, out.note = "error", "the ranks exited before the end of the job"
                break
            if time.monotonic() > deadline:
                out.status, out.note = (
                    ("timeout", f"killed after {s.point_timeout:g} s (--point-timeout)") if started
                    else ("error", f"the ranks did not start within {s.start_timeout:g} s"))
                break
            time.sleep(0.1)
    _clean_shm(shm_before, port if job.impl == "deepspeed" else None)
    return out


def run_job(job: Job, envs: dict[str, Any], s: argparse.Namespace, logdir: str,
            say: Callable[[str], None]) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """All points of a job, relaunching the ranks after a point that failed
    (the larger sizes of its table are skipped: they would fail too)."""
    remaining, records, info = list(job.points), {}, {}
    for attempt in range(1, 5):
        out = run_once(job, remaining, envs, s, logdir, attempt, lambda r: say(progress_line(r)))
        info = info or out.info
        records.update({(r["op"], r["dtype"], r["requested_bytes"]): r for r in out.records})
        remaining = [p for p in remaining if p not in records]
        if not out.status or not remaining:
            break
        f = out.failed
        if f is None or attempt == 4:
            records.update({p: status_record(job.impl, job.world, p, "error", out.note) for p in remaining})
            say(f"{job.impl} {job.world} ranks: {out.note}")
            break
        records[f] = status_record(job.impl, job.world, f, out.status, out.note)
        say(progress_line(records[f]))
        why = f"{out.status} at {format_size(f[2])}"
        records.update({p: status_record(job.impl, job.world, p, "skipped", why)
                        for p in remaining if p[:2] == f[:2] and p[2] > f[2]})  # fmt: skip
        remaining = [p for p in remaining if p not in records]
    return [records[p] for p in job.points if p in records], info


def progress_line(rec: dict[str, Any]) -> str:
    head = (f"{rec['backend']:>9} {rec['world']} ranks  {_ops.OPS[rec['op']].title:<13} "
            f"{rec['dtype']:<8} {format_size(rec['requested_bytes']):>5}")  # fmt: skip
    if not record.measured(rec):
        return f"{head}  {rec['status']}: {rec.get('note', '')}"
    return (f"{head}  {rec['busbw_gbs']:8.3f} GB/s  {rec['time_us']:10.1f} us  "
            f"{rec['iters']:4d} calls{'' if rec['status'] == 'ok' else '  (' + rec['status'] + ')'}"
            f"{'  #wrong ' + str(rec['wrong']) if rec['wrong'] else ''}")  # fmt: skip


def build_record(s: argparse.Namespace, records: list[dict[str, Any]], impl_info: dict[str, Any],
                 elapsed: float, rec: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """The peers record (kind "peers"); ``rec``: one made by record.new at the start."""
    settings = {k: getattr(s, k) for k in SETTINGS}
    rec = rec or record.new("peers", s.argv, settings, s.timing)
    rec["settings"] = settings
    m = rec["machine"]
    rows = views.peer_rows(records, s.impls, s.ops, s.dtypes)
    versions = {"smddp": m["smddp"], "gloo": f"(torch {m['torch']})"}
    versions = {n: impl_info.get(n, {}).get("version") or versions.get(n, "?") for n in s.impls}
    rec.update(elapsed_s=round(elapsed, 1), implementations=impl_info, versions=versions,
               results=records, summary=views.peer_summary(rows, records))  # fmt: skip
    return rec


def write_plot(rec: dict[str, Any], path: str) -> bool:
    """busbw against size: one panel per (op, dtype, world), one line per implementation."""
    title = lambda k: f"{_ops.OPS[k[0]].title} {k[1]}, {k[2]} ranks"  # noqa: E731
    m, impls = rec["machine"], ", ".join(rec["settings"]["impls"])
    return plot.busbw(rec["results"], ("op", "dtype", "world"), title, path,
                      f"shared-memory collectives on one host: {impls}\n{m['cpu_model']}, "
                      f"{m['cpu_cores_available']} cores, {m['hostname']}",
                      ncols=len(rec["settings"]["ranks"]))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not (importlib.util.find_spec("torch") and importlib.util.find_spec("smddp")):
        # The driver needs the project venv (torch, smddp): re-run there.
        venv_python = os.path.join(REPO, ".venv", "bin", "python")
        if os.path.exists(venv_python) and os.path.realpath(sys.executable) != os.path.realpath(venv_python):
            os.execv(venv_python, [venv_python, "-m", "bench.peers", *argv])
        sys.exit("bench.peers: needs torch and smddp; run 'make build' first")
    s = parse_args(argv)
    t0 = time.time()

    def say(text: str) -> None:
        print(f"[{time.time() - t0:6.0f}s] {text}", file=sys.stderr, flush=True)

    envs, impl_info = {}, {}
    for name in (i for i in s.impls if i in PEER_PACKAGES):
        env = envs[name] = ensure_env(name, s, say)
        impl_info[name] = {"venv": env.path, "installed": env.ok, "version": env.version,
                           **({"error": env.error} if not env.ok else {})}  # fmt: skip
        if not env.ok:
            say(f"{name}: not available: {env.error}")
    if s.setup == "only":
        return 0 if all(e.ok for e in envs.values()) else 1
    import smddp  # noqa: F401  (its version, in the record)

    rec = record.new("peers", s.argv, {}, s.timing)
    jobs, records = plan(s)
    logdir = s.out + ".logs"
    shutil.rmtree(logdir, ignore_errors=True)
    os.makedirs(logdir)
    say(f"{len(jobs)} jobs, {sum(len(j.points) for j in jobs)} points; logs in {logdir}/")
    for job in jobs:
        if job.impl in envs and not envs[job.impl].ok:
            records += [status_record(job.impl, job.world, p, "absent", envs[job.impl].error) for p in job.points]
            continue
        say(f"{job.impl}: {job.world} ranks, {len(job.points)} points")
        recs, info = run_job(job, envs, s, logdir, say)
        records += recs
        if info:
            impl_info.setdefault(job.impl, {}).setdefault("ranks_report", {})[str(job.world)] = info
    rec = build_record(s, records, impl_info, time.time() - t0, rec)
    m = rec["machine"]
    text = views.peers_text(rec, f"# smddp and its peers, shared memory on one host: "
                            f"{m['cpu_model']}, {m['cpu_cores_available']} cores; {rec['created']};"
                            f" {rec['elapsed_s']:.0f} s\n# versions: "
                            + "; ".join(f"{n} {v}" for n, v in rec["versions"].items()))
    print(text, flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(s.out)), exist_ok=True)
    with open(s.out + ".txt", "w") as f:
        f.write(text + "\n")
    record.write(rec, s.json_path)
    if s.plot:
        write_plot(rec, s.out + ".png")
    say(f"wrote {s.out}.txt, {s.json_path}" + (f", {s.out}.png" if s.plot else ""))
    return launch.EXIT_WRONG if sum(rec["summary"]["wrong"].values()) else 0
