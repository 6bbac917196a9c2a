"""The core every benchmark is built on (smddp.bench): torch-free, the timing
function and its two policies, the table formatter, the record, the rank
launcher with its process-tree kill, and the docs' renderer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from smddp.bench import launch, ops, record, render, table, timing, views

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE = ("units", "ops", "timing", "record", "table", "views", "plot", "launch", "model", "render")


def test_the_core_imports_neither_torch_nor_the_extension():
    # smddp/__init__.py loads torch and smddp._C; the core must not need them.
    code = (
        "import sys, types\n"
        "sys.modules['torch'] = None\n"  # any import of torch raises ImportError
        "pkg = types.ModuleType('smddp'); pkg.__path__ = ['smddp']; sys.modules['smddp'] = pkg\n"
        f"for m in {CORE!r}: __import__('smddp.bench.' + m)\n"
        "assert 'smddp._C' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# -- timing -----------------------------------------------------------------------------


class Log:
    """A comm and cases that write down what happens, in order."""

    rank, world = 0, 1

    def __init__(self):
        self.events: list[str] = []

    def barrier(self):
        self.events.append("barrier")

    def max_each(self, values):
        return list(values)

    def sum_int(self, value):
        return value

    def agree(self, error):
        return None if error is None else f"rank 0: {error}"

    def case(self, name, seconds=0.0, wrong=0, fail_after=None):
        log, calls = self.events, []

        class Case:
            def run(self):
                calls.append(1)
                if fail_after is not None and len(calls) > fail_after:
                    raise RuntimeError(f"{name} broke")
                log.append(name)
                time.sleep(seconds)

            def restore(self):
                log.append(f"restore {name}")

            def poison(self):
                log.append(f"poison {name}")

            def wrong(self):
                log.append(f"check {name}")
                return wrong

        return Case()


def test_back_to_back_blocks_alternate_and_are_checked():
    log = Log()
    t = timing.Timing(timing.BACK_TO_BACK, warmup=1, block_warmup=2, iters=5, rounds=2)
    res = timing.measure({"a": log.case("a", wrong=1), "b": log.case("b")}, log, t)
    assert res["a"].iters == res["b"].iters == 5
    assert len(res["a"].samples) == 2 and len(res["a"].warm) == 1
    assert (res["a"].wrong, res["b"].wrong) == (2, 0)  # one check per block, summed

    def block(x, k):  # untimed calls, restore, barrier, k timed calls, then the check
        return [x, x, f"restore {x}", "barrier"] + [x] * k + [f"poison {x}", f"restore {x}", x,
                                                               f"check {x}"]  # fmt: skip

    warm = ["restore a", "barrier", "a", "restore b", "barrier", "b"]
    # ABBA: 3 + 2 calls each, a's block, b's, b's, a's.
    assert log.events == warm + block("a", 3) + block("b", 3) + block("b", 2) + block("a", 2)


def test_a_barrier_before_each_call():
    log = Log()
    t = timing.Timing(timing.BARRIER_EACH, warmup=2, block_warmup=0, iters=3, rounds=1)
    res = timing.measure({"a": log.case("a", seconds=0.002)}, log, t)
    assert len(res["a"].samples) == 3 and all(s >= 0.002 for s in res["a"].samples)
    # Every call after a barrier, from restored inputs; one more call is checked.
    assert log.events == ["restore a", "barrier", "a"] * (2 + 3) + ["poison a", "restore a", "a",
                                                                    "check a"]  # fmt: skip


def test_a_time_budget_sizes_the_blocks():
    t = timing.Timing(timing.BACK_TO_BACK, warmup=1, block_warmup=0, time_per_point=0.05,
                      min_iters=3, max_iters=40, rounds=2)  # fmt: skip
    log = Log()
    res = timing.measure({"a": log.case("a", seconds=0.002)}, log, t)["a"]
    # Calibration stops once a block lasts 20 ms; 50 ms of 2 ms calls is ~25.
    assert 10 <= res.iters <= 40 and len(res.samples) == 2
    assert all(0.0015 < s < 0.02 for s in res.samples)


def test_the_cap_cuts_a_slow_point():
    t = timing.Timing(timing.BARRIER_EACH, 2, 0, None, 1.0, 5, 10, 1, cap=0.01)
    res = timing.measure({"a": Log().case("a", seconds=0.02, wrong=7)}, Log(), t)["a"]
    assert (res.status, len(res.samples), res.iters, res.wrong) == ("slow", 1, 1, 7)
    t = timing.Timing(timing.BARRIER_EACH, 2, 0, None, 1.0, 5, 10, 1, cap=0.1)
    res = timing.measure({"a": Log().case("a", seconds=0.02)}, Log(), t)["a"]
    assert res.status == "few" and 1 <= len(res.samples) < 5


def test_a_failing_case_is_out_and_the_others_go_on():
    log = Log()
    t = timing.Timing(timing.BACK_TO_BACK, warmup=1, block_warmup=0, iters=4, rounds=2)
    res = timing.measure({"a": log.case("a", fail_after=3), "b": log.case("b")}, log, t)
    assert res["a"].status == "error" and res["a"].error == "rank 0: RuntimeError: a broke"
    assert res["b"].status == "ok" and res["b"].iters == 4


def test_timing_describes_its_policy():
    b2b = timing.Timing(warmup=2, block_warmup=3, iters=10, rounds=4).describe()
    assert b2b.startswith("timing back-to-back: per backend and size 2 warm-up calls, then 10 timed")
    assert "each after 3 untimed calls and one barrier" in b2b and "time per call" in b2b
    each = timing.Timing(timing.BARRIER_EACH, block_warmup=0, rounds=1, cap=6).describe()
    assert "0.3 s of calls (at most 6 s per point) in 1 block" in each
    assert "each with a barrier before every call" in each


# -- table ------------------------------------------------------------------------------


def test_columns_groups_text_and_markdown():
    cols = [table.Column("op", left=True, width=6), table.Column("time", "(us)", "{:.1f}", 8),
            table.Column("busbw", "(GB/s)", "{:.2f}", 7)]  # fmt: skip
    groups = [("", 1), ("smddp", 2)]
    head = table.header(cols, groups).splitlines()
    assert head == ["#              smddp", "# op          time   busbw",
                    "#             (us)  (GB/s)"]  # fmt: skip
    assert table.row(cols, ["ag", 12.34, None], groups) == "  ag          12.3"
    assert table.text(cols, [["ag", 1.0, 2.0], None, ["rs", 3.0, 4.0]], groups).splitlines()[3:] == [
        "  ag           1.0    2.00", "", "  rs           3.0    4.00"]  # fmt: skip
    auto = table.text([table.Column("x"), table.Column("name", left=True)], [[123456, "a"]])
    assert auto.splitlines() == ["#      x name", "  123456 a"]
    md = table.markdown(cols, [["ag", 1.0, "n/a"]], groups).splitlines()
    assert md == ["| op | smddp time (us) | smddp busbw (GB/s) |", "|---|---:|---:|",
                  "| ag | 1.0 | n/a |"]  # fmt: skip
    with pytest.raises(ValueError):
        table.header(cols, [("x", 2)])


# -- record -------------------------------------------------------------------------------


def test_point_records_and_strict_json(tmp_path):
    res = timing.Result(samples=[3e-3, 1e-3, 2e-3], warm=[5e-3], iters=30, wrong=0)
    rec = record.point("gloo", "all_reduce", "float32", "sum", 4, 1 << 20, res)
    assert rec["time_us"] == pytest.approx(2000.0) and rec["iters"] == 30
    assert rec["busbw_gbs"] == pytest.approx((1 << 20) / 2e-3 / 1e9 * 1.5)
    assert (rec["time_min_us"], rec["time_max_us"]) == pytest.approx((1000.0, 3000.0))
    skipped = record.point("gloo", "all_gather", "float32", "none", 4, 8, status="n/a", note="x")
    assert skipped["size_bytes"] is None and "busbw_gbs" not in skipped
    rec = record.new("sweep", ["smddp-bench", "-n", "3"], {"sizes": (1, 2)}, timing.Timing(),
                     results=[rec, skipped])  # fmt: skip
    path = str(tmp_path / "r" / "x.json")
    record.write(rec, path)
    back = record.read(path)
    assert back["settings"] == {"sizes": [1, 2]} and back["timing"]["policy"] == "back-to-back"
    m = back["machine"]
    assert m["cpu_cores"] >= 1 and m["kernel"] and m["torch"] and m["load_average"]["end"]
    with open(path, "w") as f:
        json.dump({"schema": "smddp-bench/1"}, f)
    with pytest.raises(ValueError, match="smddp-bench/2"):
        record.read(path)


# -- launch -------------------------------------------------------------------------------


def rank_exits(code: int, hang_rank: int, rank: int, world: int, init_method: str,
               local_rank: int) -> int:  # fmt: skip
    if rank == hang_rank:
        time.sleep(600)
    return code if rank == world - 1 else 0


def rank_answers(rank: int, world: int, init_method: str, local_rank: int, conn) -> int:
    while True:
        msg = conn.recv()
        if msg is None:
            return 0
        conn.send(("ok", rank * msg) if msg >= 0 else ("error", f"rank {rank}: negative"))


def test_a_failing_rank_stops_the_others(capfd):
    with launch.Ranks("t") as ranks:
        ranks.spawn(rank_exits, 3, (5, 0))
        t0 = time.monotonic()
        assert ranks.wait(60) == 5
    assert time.monotonic() - t0 < 30
    assert "t: rank 2 failed (exit status 5); stopping the other ranks" in capfd.readouterr().err
    with launch.Ranks("t") as ranks:
        ranks.spawn(rank_exits, 2, (launch.EXIT_WRONG, -1))
        assert ranks.wait(60) == launch.EXIT_WRONG  # wrong results: not a failure


def test_a_hung_run_is_killed_at_its_deadline(capfd):
    with launch.Ranks("t") as ranks:
        ranks.spawn(rank_exits, 2, (0, 1))
        assert ranks.wait(3) == launch.EXIT_TIMEOUT
        assert all(c is not None for c in ranks.codes())
    assert "did not finish within 3 s" in capfd.readouterr().err


def test_ranks_with_pipes_answer():
    with launch.Ranks("t") as ranks:
        ranks.spawn(rank_answers, 3, pipes=True)
        assert ranks.ask(2, 60, "double") == [0, 2, 4]
        with pytest.raises(launch.RankError, match=r"negative failed on rank (\d):\nrank \1: neg"):
            ranks.ask(-1, 60, "negative")


def test_commands_are_killed_with_their_grandchildren(tmp_path):
    with launch.Ranks("t") as ranks:
        ranks.command(["sh", "-c", "sleep 60 & sleep 60 & wait"], dict(os.environ),
                      str(tmp_path / "log"), "shell")  # fmt: skip
        proc = ranks.procs[0][1]
        deadline = time.monotonic() + 10
        while len(launch.descendants(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        kids = launch.descendants(proc.pid)
        assert len(kids) == 2
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 10 and proc.poll() is not None

    def alive(pid):  # neither gone nor a zombie waiting for init to reap it
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rpartition(")")[2].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 5  # SIGKILL is delivered, the exit takes a moment
    while any(alive(pid) for pid in kids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in kids)
    assert (tmp_path / "log").read_text().startswith("$ sh -c")


# -- render -------------------------------------------------------------------------------


def _sweep_record() -> dict:
    results = []
    for b, t in (("smddp", 1e-4), ("gloo", 4e-4)):
        for n in (4096, 1 << 20):
            res = timing.Result(samples=[t * n / 4096], warm=[], iters=10)
            results.append(record.point(b, "all_gather", "float32", "none", 4, n, res))
    rec = record.new("sweep", ["smddp-bench", "--sizes", "4K,1M"],
                     {"backends": ["smddp", "gloo"], "inplace": False}, timing.Timing(),
                     topology={"label": "4 ranks = 2 nodes x 2 (emulated nodes)", "world": 4},
                     results=results)  # fmt: skip
    rec["summary"] = views.sweep_summary(results, ("smddp", "gloo"))
    return rec


def test_render_rewrites_marked_tables_and_checks_them(tmp_path, capsys):
    record.write(_sweep_record(), str(tmp_path / "results" / "s.json"))
    doc = tmp_path / "perf.md"
    marked = "<!-- smddp-bench:table results/s.json -->\n"
    doc.write_text(f"# Title\n\n{marked}| typed | by hand |\n<!-- /smddp-bench:table -->\n")
    assert render.main(["--check", str(doc)]) == 1
    assert "differ from their records" in capsys.readouterr().err
    assert render.main([str(doc)]) == 0
    text = doc.read_text()
    assert "typed" not in text and text.startswith("# Title\n\n" + marked)
    assert "| AllGather | float32 | 4K | 100.0 | 0.031 | 400.0 | 0.008 | 4.00 |" in text
    assert "- command: `smddp-bench --sizes 4K,1M`" in text and "timing back-to-back" in text
    assert "Linux" in text and "torch" in text
    assert render.main(["--check", str(doc)]) == 0
    doc.write_text(text.replace("| 4.00 |", "| 4.01 |"))
    assert render.main(["--check", str(doc)]) == 1
    doc.write_text(marked.replace("s.json", "missing.json") + "<!-- /smddp-bench:table -->\n")
    assert render.main(["--check", str(doc)]) == 2


def test_sizes_rounded_to_the_ranks_show_what_was_asked():
    assert views.size_text(4096, 4096) == "4K"
    assert views.size_text(4194288, 4 << 20) == "4194288 (of 4M)"
    assert views.size_text(None, 1 << 20) == "1M"  # a point that was not run


def test_the_gpu_records_render_as_tables():
    """The GPU benchmarks' records (bench/gpu_kernels.py, bench/gpu_latency.py,
    a sweep with bench/gpu_collectives.py's floor) as the docs show them."""
    machine = {"gpus": ["NVIDIA H200"]}
    kernels = record.new("gpu-kernels", ["python", "bench/gpu_kernels.py"], {}, results=[
        {"dtype": "float32", "bytes": 1 << 26, "offset": o, "copy_gbps": 4000.0, "blocks": b,
         "reduce_gbps": 1000.0 * b / 32 - o, "ratio": (1000.0 * b / 32 - o) / 4000.0}
        for o in (0, 1) for b in (32, 128)], device="NVIDIA H200")  # fmt: skip
    kernels["machine"].update(machine)
    text = views.markdown(kernels)
    assert "| dtype | size (B) | offset | copy (GB/s) | 32 blocks (GB/s) | 128 blocks (GB/s) |" in text
    assert "| float32 | 64M | 0 | 4000 | 1000 (25 %) | 4000 (100 %) |" in text
    assert "| float32 | 64M | 1 | 4000 | 999 (25 %) | 3999 (100 %) |" in text
    assert "NVIDIA H200" in text.split("- machine:")[1]
    latency = record.new("gpu-latency", ["python", "bench/gpu_latency.py"], {"bytes": "4K", "nproc": 2},
                         results=[{"mode": "host", "bytes": 4096, "latency_us": 12.5, "ok": True},
                                  {"mode": "device", "bytes": 4096, "latency_us": 7.5, "ok": False}],
                         device="NVIDIA H200")  # fmt: skip
    text = views.markdown(latency)
    assert "| host | 12.5 | ok |" in text and "| device | 7.5 | WRONG |" in text
    for r, host_us in zip(latency["results"], (40.0, 3.25)):
        r["host_us"] = host_us
    text = views.markdown(latency)
    assert "| synchronization | latency (µs) | host in the call (µs) | checked |" in text
    assert "| host | 12.5 | 40.0 | ok |" in text and "| device | 7.5 | 3.2 | WRONG |" in text
    latency["results"].append({"mode": "memops+batch", "bytes": 4096, "latency_us": None, "host_us": None,
                               "ok": False, "error": "rank 1 exited with 1"})  # fmt: skip
    text = views.markdown(latency)
    assert "| memops+batch |  |  | failed: rank 1 exited with 1 |" in text and "batch: each step's" in text
    sweep = _sweep_record()
    sweep["floor"] = [{"op": "all_gather", "dtype": "float32", "size_bytes": 4096, "world": 4, "floor_us": 25.0,
                       "time_over_floor": {"smddp": 4.0, "gloo": None}}]  # fmt: skip
    text = views.markdown(sweep)
    assert "| op | size (B) | floor (µs) | smddp / floor | gloo / floor |" in text
    assert "| all_gather | 4K | 25.0 | 4.00 |  |" in text and "floor: the same bytes copied by one process" in text


def _bench_script(name: str):
    """One of bench/'s scripts, imported as a module (bench/ is no package)."""
    import importlib

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def test_the_gpu_floor_moves_what_the_zero_copy_path_moves(tmp_path):
    """bench/gpu_collectives.py's floor (one process, the same copies and
    reductions) on CPU tensors: the bytes of each op's plan are the zero-copy
    schedule's, and every point of a record gets its floor and each path's
    ratio to it."""
    g = _bench_script("gpu_collectives")
    # world 4, count 1000: AllGather copies 16 inputs; ReduceScatter reduces
    # 4 sources into 4 blocks; AllReduce reduces 250-element slices, then
    # copies the 3 others' slices on every rank.
    assert g.floor_plan("all_gather", 1000, 4) == [("copy", 1000, 16)]
    assert g.floor_plan("reduce_scatter", 1000, 4) == [("reduce", 1000, 4)] * 4
    assert g.floor_plan("all_reduce", 1000, 4) == [("reduce", 250, 4)] * 4 + [("copy", 250, 12)]
    res = timing.Result(samples=[2e-3, 2e-3], iters=2)
    points = [record.point(b, op, "float32", "sum", 2, 1 << 16, res, "ok")
              for b in g.BACKENDS.split(",") for op in ("all_gather", "reduce_scatter", "all_reduce")]  # fmt: skip
    points[-1] = record.point("smddp:zero-copy", "all_reduce", "float32", "sum", 2, 1 << 16, status="timeout")
    path = str(tmp_path / "c.json")
    record.write(record.new("sweep", ["gpu_collectives.py"], {}, results=points), path)
    lines = g.add_floor(path, 3, device="cpu")
    floor = json.loads(open(path).read())["floor"]
    assert [r["op"] for r in floor] == ["all_gather", "reduce_scatter", "all_reduce"]
    for r in floor:
        assert r["floor_us"] > 0
        ratios = r["time_over_floor"]
        assert ratios["smddp:staged"] == pytest.approx(2e-3 / (r["floor_us"] * 1e-6))
    assert floor[-1]["time_over_floor"]["smddp:zero-copy"] is None
    assert "the floor" in lines[1] and len(lines) == 4 + 3 and "n/a" in lines[-1]


def test_the_gpu_latency_bench_modes():
    """bench/gpu_latency.py's modes: each one's knobs, and what is not a
    mode refused before any rank starts."""
    g = _bench_script("gpu_latency")
    for mode in g.MODES:
        g.parse_mode(mode)
    assert g.mode_env("memops+batch+graph", 2, 4096) == {
        "SMDDP_CUDA_RANKS_PER_GPU": "2", "SMDDP_CUDA_SYNC": "memops", "SMDDP_CUDA_ONESHOT_BYTES": "0",
        "SMDDP_CUDA_BATCH_MEMOPS": "1"}  # fmt: skip
    assert g.mode_env("device+graph+oneshot", 4, 4096)["SMDDP_CUDA_ONESHOT_BYTES"] == "4096"
    assert g.mode_env("host", 2, 4096)["SMDDP_CUDA_BATCH_MEMOPS"] == "0"
    for bad in ("host+graph", "device+batch", "memops+graph+graph", "kernels", "memops+fast"):
        with pytest.raises(ValueError, match="is not a mode"):
            g.parse_mode(bad)
        with pytest.raises(SystemExit):
            g.main(["--modes", bad])


def _exit_with(code: int) -> None:
    os._exit(code)


def _put_row(q) -> None:
    q.put({"mode": "memops", "latency_us": 1.0})


def _sleep_long() -> None:
    import time

    time.sleep(60)


@pytest.mark.timeout(60)
def test_a_failed_latency_mode_costs_seconds_not_the_timeout():
    """bench/gpu_latency.py's collection of a mode's row: the row; a rank
    that died names itself at once (its peers would wait for it until the
    group's timeout); ranks that ended without a row, or no row in time."""
    import multiprocessing as mp
    import time

    g = _bench_script("gpu_latency")
    ctx = mp.get_context("spawn")

    def run(targets, timeout_s=30.0):
        q = ctx.Queue()
        procs = [ctx.Process(target=t, args=a if a != "q" else (q,)) for t, a in targets]
        for p in procs:
            p.start()
        t0 = time.monotonic()
        try:
            return g.collect(q, procs, timeout_s), time.monotonic() - t0
        finally:
            for p in procs:
                p.kill()
                p.join()

    got, _ = run([(_put_row, "q"), (_exit_with, (0,))])
    assert got == {"mode": "memops", "latency_us": 1.0}
    got, took = run([(_sleep_long, ()), (_exit_with, (3,))])
    assert got == "rank 1 exited with 3" and took < 15
    got, _ = run([(_exit_with, (0,)), (_exit_with, (0,))])
    assert got == "every rank exited without a result"
    got, took = run([(_sleep_long, ())], timeout_s=2.0)
    assert got == "no result within 2 s" and took < 10


def test_the_gpu_collectives_bench_meets_as_told(tmp_path, monkeypatch):
    """bench/gpu_collectives.py runs both paths with --sync as SMDDP_CUDA_SYNC
    (memops unless told), every rank on one GPU, and refuses other modes."""
    g = _bench_script("gpu_collectives")
    from smddp.bench import cli

    seen = []
    monkeypatch.setattr(os, "environ", dict(os.environ))
    monkeypatch.setattr(cli, "main", lambda argv: seen.append((dict(os.environ), argv)) or 0)
    path = str(tmp_path / "none.json")
    assert g.main(["--nproc", "3", "--json", path]) == 0
    assert g.main(["--sync", "host", "--json", path]) == 0
    env, argv = seen[0]
    assert env["SMDDP_CUDA_SYNC"] == "memops" and env["SMDDP_CUDA_RANKS_PER_GPU"] == "3"
    assert argv[argv.index("--backends") + 1] == g.BACKENDS and argv[argv.index("--nproc") + 1] == "3"
    assert seen[1][0]["SMDDP_CUDA_SYNC"] == "host"
    with pytest.raises(SystemExit):
        g.main(["--sync", "kernels"])
