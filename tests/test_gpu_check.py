"""The GPU check script (tools/gpu_check.py) and the bounds it relies on, on
a machine without a GPU: hung steps are killed with their whole process tree
after their stacks are dumped, the deadline is kept, later steps still run,
and what comes back fits the device tool's limits (at most 8 plain files in
$OUT, names of letters, digits, '.', '_' and '-').
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))

import gpu_check  # noqa: E402

NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_dead(pid: int, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _check_out(out: str) -> list[str]:
    """The device tool's limits on what comes back; returns the file names."""
    names = sorted(os.listdir(out))
    assert len(names) <= 8, names
    for name in names:
        assert NAME.match(name), name
        assert os.path.isfile(os.path.join(out, name)), f"{name} is not a plain file"
        assert os.path.getsize(os.path.join(out, name)) <= 16 << 20, name
    assert not [n for n in names if n.endswith(".part")], names
    return names


def test_a_hung_tree_is_dumped_then_killed(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    log = tmp_path / "step.log"
    code = (
        "import subprocess, sys, time\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time\\ntime.sleep(120)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(g.pid))\n"
        "time.sleep(120)\n"
    )
    t = time.monotonic()
    out = gpu_check.run_bounded([sys.executable, "-c", code], str(log), 4.0, env=gpu_check.child_env())
    assert time.monotonic() - t < 20
    assert out.timed_out and not out.ok
    text = log.read_text()
    # Both the child and the grandchild printed their stacks before the kill.
    assert text.count("most recent call first") >= 2, text
    assert "SIGUSR1" in text
    assert "killed after" in text
    assert _wait_dead(int(pidfile.read_text())), "the grandchild outlived the kill"


def test_leftovers_are_killed_after_a_normal_exit(tmp_path):
    pidfile = tmp_path / "leftover.pid"
    log = tmp_path / "step.log"
    code = (
        "import subprocess, sys\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time\\ntime.sleep(120)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(g.pid))\n"
    )
    out = gpu_check.run_bounded([sys.executable, "-c", code], str(log), 30.0, env=gpu_check.child_env())
    assert out.ok and not out.timed_out
    assert "left running" in log.read_text()
    assert _wait_dead(int(pidfile.read_text()))


def test_output_is_never_lost_on_a_kill(tmp_path):
    log = tmp_path / "step.log"
    code = "import sys, time\nfor i in range(3): print('line', i, flush=True)\nsys.stdout.write('no newline')\ntime.sleep(60)"
    out = gpu_check.run_bounded([sys.executable, "-c", code], str(log), 3.0, env=gpu_check.child_env())
    assert out.timed_out
    text = log.read_text()
    assert "line 2" in text and "no newline" in text


def _sleeper(check, run):
    out = run.python(["-c", "import time\ntime.sleep(60)"])
    return ("ok" if out.ok else "FAIL"), out.describe()


def _quick(check, run):
    out = run.python(["-c", "print('quick step ran')"])
    check.facts = {"torch": {"cuda_available": False}}
    return ("ok" if out.ok else "FAIL"), "ran"


def _broken(check, run):
    raise KeyError("a bug in a step")


def _never(check, run):  # pragma: no cover - must be skipped
    raise AssertionError("this step should not have run")


def test_deadline_caps_and_what_comes_back(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "out"
    steps = [
        gpu_check.Step("sleeper", _sleeper, cap_s=3, min_s=1, doc="sleeps past its cap"),
        gpu_check.Step("after-sleeper", _never, cap_s=10, min_s=1, needs=("sleeper",), doc="needs the sleeper"),
        gpu_check.Step("quick", _quick, cap_s=20, min_s=1, doc="runs after the sleeper"),
        gpu_check.Step("broken", _broken, cap_s=10, min_s=1, doc="raises"),
        gpu_check.Step("gpu-only", _never, cap_s=10, min_s=1, gpu=True, doc="needs a GPU"),
        gpu_check.Step("too-long", _never, cap_s=100, min_s=1000, doc="needs more than the deadline"),
    ]
    t = time.monotonic()
    rc = gpu_check.main(["--deadline-s", "40", "--out", str(out)], steps=steps)
    assert time.monotonic() - t < 30
    assert rc == 1
    printed = capsys.readouterr().out
    names = _check_out(str(out))
    assert {"summary.txt", "results.json", "logs.tar.gz"} <= set(names)
    results = json.loads((out / "results.json").read_text())
    by_name = {s["name"]: s for s in results["steps"]}
    assert by_name["sleeper"]["status"] == "timeout"
    assert by_name["sleeper"]["seconds"] < 10
    assert by_name["after-sleeper"]["status"] == "skipped"
    assert "needs sleeper" in by_name["after-sleeper"]["reason"]
    assert by_name["quick"]["status"] == "ok"
    assert by_name["broken"]["status"] == "FAIL"
    assert "KeyError" in by_name["broken"]["reason"]
    assert by_name["gpu-only"]["status"] == "skipped" and by_name["gpu-only"]["reason"] == "no GPU"
    assert by_name["too-long"]["status"] == "skipped" and "no time left" in by_name["too-long"]["reason"]
    # The summary table is the last thing printed, one row per step.
    tail = printed.strip().splitlines()[-(len(steps) + 2):]
    assert "step" in tail[1] and "status" in tail[1]
    for step, line in zip(steps, tail[2:]):
        assert step.name in line and by_name[step.name]["status"] in line
    summary = (out / "summary.txt").read_text()
    assert "sleeper" in summary and "timeout" in summary
    with tarfile.open(out / "logs.tar.gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert all(m.isfile() and m.name.count("/") <= 1 for m in members.values())
        sleeper_log = tar.extractfile(members["logs/sleeper.log"]).read().decode()
        assert "most recent call first" in sleeper_log and "time.sleep" in sleeper_log
        assert "quick step ran" in tar.extractfile(members["logs/quick.log"]).read().decode()
        assert "KeyError" in tar.extractfile(members["logs/broken.log"]).read().decode()
        assert "logs/gpu_check.log" in members


FAKE_SETUP = """
import os, sys
print("[1/2] c++ -c csrc/common/error.cc -o build/error.o")
if os.environ.get("CXX") != os.environ["FAKE_SYSTEM_CXX"]:
    sys.exit("RuntimeError: _C.so was linked without the shared libstdc++ (it needs only libc.so.6): the compiler cc")
print("built with", os.environ["CXX"], os.environ["CC"], os.environ["CUDAHOSTCXX"])
"""


@pytest.mark.parametrize("system_compiler", [True, False])
def test_a_build_with_a_static_cxx_runtime_is_redone_with_the_systems_compiler(tmp_path, monkeypatch, system_compiler):
    """setup.py refuses an extension that carries its own C++ runtime; the
    check's build then tries the system's compiler once, where there is one,
    and says why; else the step fails with setup.py's reason (not a build
    command's line)."""
    root = tmp_path / "repo"
    (root / "build").mkdir(parents=True)
    (root / "setup.py").write_text(FAKE_SETUP)
    cxx = tmp_path / "bin" / "g++"
    if system_compiler:
        cxx.parent.mkdir()
        cxx.write_text("")
    monkeypatch.setattr(gpu_check, "ROOT", str(root))
    monkeypatch.setattr(gpu_check, "SYSTEM_CXX", str(cxx))
    monkeypatch.setenv("FAKE_SYSTEM_CXX", str(cxx))
    out = tmp_path / "out"
    steps = [gpu_check.Step("build", gpu_check.step_build, cap_s=60, min_s=1, doc="the build")]
    rc = gpu_check.main(["--deadline-s", "60", "--out", str(out)], steps=steps)
    build = json.loads((out / "results.json").read_text())["steps"][0]
    if system_compiler:
        assert rc == 0 and build["status"] == "ok", build
        assert f"again with CXX={cxx} after: RuntimeError: _C.so was linked without the shared" in build["reason"]
        with tarfile.open(out / "logs.tar.gz") as tar:
            log = tar.extractfile("logs/build.log").read().decode()
        assert f"built with {cxx} {tmp_path / 'bin' / 'gcc'} {cxx}" in log
        assert not (root / "build").exists()
    else:
        assert rc == 1 and build["status"] == "FAIL", build
        assert "linked without the shared libstdc++" in build["reason"] and "error.o" not in build["reason"]


FAKE_KERNEL_TESTS = """
import time

def test_a():
    pass

def test_b_hangs():
    time.sleep(120)

def test_c():
    pass

def test_d_fails():
    assert 1 == 2, "d is wrong"
"""

FAKE_ALONE_TESTS = """
import os, time

def test_x():
    pass

def test_y_fails():
    assert False, "y is wrong"

# Each passes only while the other runs: the test ids run side by side.
def _meet(me, other):
    open(os.path.join(MEET, me), "w").close()
    t = time.monotonic()
    while not os.path.exists(os.path.join(MEET, other)):
        assert time.monotonic() - t < 20, f"{other} never ran beside {me}"
        time.sleep(0.05)

def test_p():
    _meet("p", "q")

def test_q():
    _meet("q", "p")
"""


def test_a_hung_kernel_test_is_isolated_and_the_rest_still_run(tmp_path, monkeypatch, capsys):
    """The kernel step is killed in a hung test: the tests step runs each
    other GPU test alone (two at a time, --test-jobs 2), then the hung kernel
    test alone and the kernel tests after it together, so that every one gets
    a verdict."""
    monkeypatch.chdir(ROOT)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_fake_kernel.py").write_text(FAKE_KERNEL_TESTS)
    (tmp_path / "tests" / "test_fake_alone.py").write_text(f"MEET = {str(tmp_path)!r}\n" + FAKE_ALONE_TESTS)
    out = tmp_path / "out"
    steps = [s for s in gpu_check.STEPS if s.name in ("kernel", "tests")]
    steps = [gpu_check.Step(s.name, s.fn, cap_s=c, min_s=1) for s, c in zip(steps, (12, 60))]
    args = gpu_check.parse_args(["--deadline-s", "90", "--out", str(out), "--test-cap-s", "8", "--test-jobs", "2"])
    check = gpu_check.Check(args, steps)
    check.test_root = str(tmp_path)
    check.kernel_file = "tests/test_fake_kernel.py"
    check.alone_files = ["tests/test_fake_alone.py"]
    assert check.run() == 1
    results = json.loads((out / "results.json").read_text())
    kernel, tests = results["steps"]
    assert kernel["status"] == "timeout", kernel
    assert check.kernel_verdicts == {"tests/test_fake_kernel.py::test_a": ("ok", "")}
    subs = {s["name"]: s for s in tests["subs"]}
    assert subs["test_fake_alone.py::test_x"]["status"] == "ok"
    assert subs["test_fake_alone.py::test_y_fails"]["status"] == "FAIL"
    assert "y is wrong" in subs["test_fake_alone.py::test_y_fails"]["reason"]
    for node in ("test_p", "test_q"):
        assert subs[f"test_fake_alone.py::{node}"]["status"] == "ok", subs[f"test_fake_alone.py::{node}"]
    assert subs["test_fake_kernel.py::test_b_hangs"]["status"] == "timeout"
    assert subs["2 more kernel tests together"]["status"] == "FAIL"
    assert subs["test_fake_kernel.py::test_d_fails"]["status"] == "FAIL"
    assert tests["status"] == "timeout"
    assert tests["reason"] == "4 ok, 2 FAIL, 1 timeout"
    with tarfile.open(out / "logs.tar.gz") as tar:
        log = tar.extractfile("logs/tests.log").read().decode()
    # The hung test's stack, dumped before the kill.
    assert "test_b_hangs" in log and "most recent call first" in log


def test_tests_selects_test_ids_by_name(tmp_path, monkeypatch):
    """--tests x,fails: only the ids naming one of them run, the kernel
    tests included (none here), and nothing else is reported."""
    monkeypatch.chdir(ROOT)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_fake_kernel.py").write_text(FAKE_KERNEL_TESTS)
    (tmp_path / "tests" / "test_fake_alone.py").write_text(f"MEET = {str(tmp_path)!r}\n" + FAKE_ALONE_TESTS)
    out = tmp_path / "out"
    steps = [gpu_check.Step(s.name, s.fn, cap_s=60, min_s=1) for s in gpu_check.STEPS if s.name == "tests"]
    args = gpu_check.parse_args(["--deadline-s", "90", "--out", str(out), "--test-cap-s", "20",
                                 "--tests", "test_x,y_fails"])
    check = gpu_check.Check(args, steps)
    check.test_root = str(tmp_path)
    check.kernel_file = "tests/test_fake_kernel.py"
    check.alone_files = ["tests/test_fake_alone.py"]
    check.run()
    (tests,) = json.loads((out / "results.json").read_text())["steps"]
    assert sorted(s["name"] for s in tests["subs"]) == ["test_fake_alone.py::test_x",
                                                        "test_fake_alone.py::test_y_fails"], tests["subs"]
    assert tests["reason"] == "1 ok, 1 FAIL", tests


def test_the_whole_check_without_a_gpu(tmp_path):
    """The real steps, as on the device, where there is no GPU: the machine
    facts, the IPC preflight and the import check run, every GPU step says
    why it was skipped, and the results are packed."""
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=ROOT, OUT=str(out))
    t = time.monotonic()
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gpu_check.py"), "--skip-build",
                        "--deadline-s", "90"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
    assert time.monotonic() - t < 100, "the check overran its deadline"
    names = _check_out(str(out))
    assert {"summary.txt", "results.json", "logs.tar.gz"} <= set(names)
    results = json.loads((out / "results.json").read_text())
    by_name = {s["name"]: s for s in results["steps"]}
    assert [s["name"] for s in results["steps"]] == [s.name for s in gpu_check.STEPS]
    assert by_name["env"]["status"] == "ok", by_name["env"]
    assert "python" in by_name["env"]["reason"] and "runtime" in by_name["env"]["reason"]
    assert results["facts"]["torch"]["version"]
    if results["facts"]["torch"].get("cuda_available"):
        pytest.skip("this machine has a GPU: the GPU steps ran")
    assert by_name["ipc"]["status"] == "skipped" and "no GPU" in by_name["ipc"]["reason"]
    assert by_name["build"]["status"] == "skipped"
    assert by_name["import"]["status"] == "ok", by_name["import"]
    for step in gpu_check.STEPS:
        if step.gpu:
            assert by_name[step.name]["status"] == "skipped", by_name[step.name]
            assert by_name[step.name]["reason"] == "no GPU"
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = p.stdout.strip().splitlines()
    assert gpu_check.STEPS[-1].name in lines[-1], "the summary does not end with the last step"
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = tar.getnames()
    assert {"logs/env.log", "logs/env.json", "logs/import.log", "logs/import.json", "logs/gpu_check.log"} <= set(names)


def test_a_stopped_check_still_leaves_its_results(tmp_path):
    """SIGTERM in the middle of a step: its process tree is stopped, the
    results so far are written, the summary is printed."""
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=ROOT, OUT=str(out))
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "tools", "gpu_check.py"), "--only", "env,import",
                          "--deadline-s", "120"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    end = time.monotonic() + 60
    probes = []
    while not probes and time.monotonic() < end:
        time.sleep(0.1)
        probes = _probe_pids(str(out))
    assert probes, "the env probe did not start"
    time.sleep(0.5)
    p.terminate()
    printed, _ = p.communicate(timeout=30)
    assert p.returncode == 1, printed
    results = json.loads((out / "results.json").read_text())
    by_name = {s["name"]: s for s in results["steps"]}
    assert by_name["env"]["status"] == "timeout" and "SIGTERM" in by_name["env"]["reason"], by_name
    assert by_name["import"]["status"] == "skipped"
    assert "env" in printed.strip().splitlines()[-2] and "import" in printed.strip().splitlines()[-1]
    assert probes and all(_wait_dead(pid) for pid in probes)
    _check_out(str(out))


def _probe_pids(out: str) -> list[int]:
    """The env probes that a check writing to out started."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")
            except OSError:
                continue
            if any(c.endswith(b"gpu_probes.py") for c in cmd) and _alive(int(name)):
                if _env_of(int(name)).get("OUT") == out:
                    pids.append(int(name))
    return pids


def _env_of(pid: int) -> dict:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(i.decode(errors="replace").split("=", 1) for i in items if b"=" in i)


def test_the_device_command_fits():
    doc = gpu_check.__doc__
    command = next(line.strip() for line in doc.splitlines() if "tools/gpu_check.py" in line and "OUT=" in line)
    assert len(command) < 500
    assert command.startswith("OUT=$OUT ")


def test_steps_are_listed():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gpu_check.py"), "--list"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0
    for step in gpu_check.STEPS:
        assert step.name in p.stdout


def case_sleep(seconds: float) -> None:
    time.sleep(seconds)


def test_harness_scales_its_timeouts_and_dumps_silent_ranks(monkeypatch, capfd):
    from dist_harness import RankPool

    monkeypatch.setenv("SMDDP_TEST_STACK_DUMPS", "1")
    pool = RankPool(1, backend="gloo")
    try:
        # 100 s scaled down to 2 s.
        monkeypatch.setenv("SMDDP_TEST_TIMEOUT_SCALE", "0.02")
        t = time.monotonic()
        with pytest.raises(TimeoutError, match="within 2 s"):
            pool.run(case_sleep, 60, timeout=100)
        assert time.monotonic() - t < 15
    finally:
        pool.kill()
    err = capfd.readouterr().err
    assert "rank 0" in err and "is silent" in err
    assert "case_sleep" in err and "most recent call first" in err


def test_harness_rejects_a_bad_scale(monkeypatch):
    import dist_harness

    monkeypatch.setenv("SMDDP_TEST_TIMEOUT_SCALE", "fast")
    with pytest.raises(ValueError, match="SMDDP_TEST_TIMEOUT_SCALE"):
        dist_harness._scaled(10)


@pytest.mark.slow
def test_smoke_script_survives_a_hung_op(tmp_path):
    """tests/gpu_smoke.py on CPU tensors, with one op made to hang: the op is
    reported as a timeout with the ranks' stacks, and the ops after it run in
    a fresh pair of ranks."""
    path = tmp_path / "smoke.json"
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, os.path.join(HERE, "gpu_smoke.py"), "--device", "cpu", "--json", str(path),
                        "--ops", "all_reduce,broadcast,barrier", "--inject-hang", "all_reduce",
                        "--op-timeout-s", "6", "--deadline-s", "120"],
                       env=env, capture_output=True, text=True, timeout=180)
    rep = json.loads(path.read_text())
    status = {o["op"]: o["status"] for o in rep["ops"]}
    assert status == {"all_reduce": "timeout", "broadcast": "ok", "barrier": "ok"}, rep
    assert len(rep["pairs"]) == 2
    assert p.returncode == 1
    assert "most recent call first" in p.stderr and "_rank" in p.stderr


def test_the_bench_summaries_read_the_records_the_benches_write(tmp_path):
    """The one-line results of bench-collectives, bench-kernels and
    bench-latency come from the records' points, as smddp.bench.record writes
    them: a change of the record's layout fails here, not on the device."""
    from smddp.bench import record, timing

    points = [record.point(b, op, "float32", "sum", 2, size, timing.Result(samples=[1e-3, 2e-3], iters=2))
              for op in ("all_gather", "all_reduce") for size in (1 << 20, 16 << 20)
              for b in ("smddp:staged", "smddp:zero-copy")]  # fmt: skip
    points.append(record.point("smddp:staged", "reduce_scatter", "float32", "sum", 2, 1 << 20, status="timeout"))
    points[2]["wrong"] = 3
    rec = record.new("sweep", ["smddp-bench"], {}, results=points)
    rec["floor"] = [{"op": "all_gather", "size_bytes": 16 << 20, "time_over_floor": {"smddp:zero-copy": 1.25}}]
    record.write(rec, str(tmp_path / "c.json"))
    line = gpu_check._collectives_reason(str(tmp_path / "c.json"))
    assert line is not None
    first = line.split(";")[0]
    assert first.startswith("all_gather 16 MiB: smddp:staged busbw") and "WRONG" in first, line
    assert "smddp:zero-copy busbw" in first and "(1.25x the floor)" in first, line
    assert "all_reduce 16 MiB: smddp:staged busbw" in line and "reduce_scatter 1 MiB: smddp:staged timeout" in line
    rows = [{"dtype": "float32", "bytes": b, "offset": off, "copy_gbps": 3000.0, "blocks": 32,
             "reduce_gbps": 3000.0 * ratio, "ratio": ratio}
            for b, off, ratio in ((1 << 26, 0, 0.5), (1 << 28, 0, 0.8), (1 << 28, 1, 0.9))]  # fmt: skip
    none = argparse.Namespace()
    record.write_gpu("gpu-kernels", "bench/gpu_kernels.py", [], none, None, "H200", rows, str(tmp_path / "k.json"))
    assert gpu_check._kernel_bench_reason(str(tmp_path / "k.json")) == (
        "float32 256 MiB: 80 % of copy (2400 against 3000 GB/s, 32 blocks)")
    rows = [{"mode": "host", "bytes": 4096, "latency_us": 41.3, "ok": True},
            {"mode": "device+graph", "bytes": 4096, "latency_us": 9.0, "host_us": 2.25, "ok": False},
            {"mode": "memops+batch", "bytes": 4096, "latency_us": None, "host_us": None, "ok": False,
             "error": "rank 1 exited with 1"}]
    record.write_gpu("gpu-latency", "bench/gpu_latency.py", [], none, None, "H200", rows, str(tmp_path / "l.json"))
    assert gpu_check._latency_reason(str(tmp_path / "l.json")) == (
        "host 41.3 us, device+graph 9.0 us (host 2.2) WRONG, memops+batch failed (rank 1 exited with 1)")
    assert gpu_check._collectives_reason(str(tmp_path / "missing.json")) is None
    assert gpu_check._latency_reason(str(tmp_path / "missing.json")) is None
    # What the steps may write into OUT fits the device tool's limits.
    assert len(gpu_check.OUT_FILES) <= 8 and all(NAME.match(n) for n in gpu_check.OUT_FILES)
    assert f"latency-{gpu_check.WIDE_RANKS}.json" in gpu_check.OUT_FILES


def test_the_longest_tests_start_first(tmp_path):
    """The tests step starts the test ids with the longest timeout marks
    first (ties in file order), those without a mark last."""
    (tmp_path / "test_t.py").write_text(
        "import pytest\n\ndef test_short():\n    pass\n\n"
        "@pytest.mark.timeout(300)\n@pytest.mark.parametrize('x', [0, 1])\ndef test_long(x):\n    pass\n\n"
        "@pytest.mark.timeout(100)\ndef test_mid():\n    pass\n")
    ids = ["test_t.py::test_short", "test_t.py::test_long[0]", "test_t.py::test_long[1]", "test_t.py::test_mid"]
    assert gpu_check.longest_first(ids, str(tmp_path)) == [
        "test_t.py::test_long[0]", "test_t.py::test_long[1]", "test_t.py::test_mid", "test_t.py::test_short"]
    # The GPU tests' own marks are read.
    marks = gpu_check.timeout_marks(os.path.join(ROOT, "tests", "test_cuda.py"))
    assert marks["test_cuda_rails_zero_copy_on_one_gpu"] > marks["test_cuda_graph_capture"] > 0


def test_sanitizer_summaries_are_read_per_tool():
    # The tools' own closing lines: racecheck's names hazards even when it
    # found none, and its warnings are not errors.
    clean = ("========= COMPUTE-SANITIZER\n5 passed\n========= ERROR SUMMARY: 0 errors\n"
             "========= COMPUTE-SANITIZER\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n")
    assert gpu_check.sanitizer_errors(clean) == (True, 0)
    warned = "========= RACECHECK SUMMARY: 3 hazards displayed (0 errors, 3 warnings)\n"
    assert gpu_check.sanitizer_errors(warned) == (True, 0)
    raced = "========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)\n"
    assert gpu_check.sanitizer_errors(raced) == (True, 2)
    found = ("========= Invalid __global__ read of size 4 bytes\n=========     at reduce+0x90\n"
             "========= ERROR SUMMARY: 1 error\n")
    assert gpu_check.sanitizer_errors(found) == (True, 1)
    # Killed before the summary: the reports printed so far count.
    killed = ("========= COMPUTE-SANITIZER\n========= Invalid __global__ write of size 16 bytes\n"
              "========= Error: Race reported between Write access at a and Read access at b\n")
    assert gpu_check.sanitizer_errors(killed) == (False, 2)
    assert gpu_check.sanitizer_errors("========= COMPUTE-SANITIZER\n") == (False, 0)
