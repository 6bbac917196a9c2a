"""bench/peers.py without MPI or DeepSpeed: arguments, the plan, nccl-tests'
arithmetic, the timing loop on a fake communicator, the checks of outputs,
the table, the JSON record and the plot from made-up results, and the
killing of process trees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)

import peers  # noqa: E402
import peers_mpi  # noqa: E402

K, M = 1 << 10, 1 << 20


# -- arguments ----------------------------------------------------------------------


def test_defaults():
    s = peers.parse_args([])
    assert s.impls == ("smddp", "gloo", "mpich", "openmpi", "deepspeed")
    assert s.ops == ("all_gather", "reduce_scatter", "all_reduce")
    assert s.dtypes == ("float32", "bfloat16")
    assert s.sizes == (4 * K, 64 * K, M, 16 * M, 256 * M)
    assert s.ranks == (2, 4, 8)
    assert s.setup == "auto" and s.plot and s.mpi_bf16 == "numpy"


def test_choices_aliases_and_order():
    s = peers.parse_args(
        ["--impls", "ds,smddp,ompi", "--ops", "ar,ag", "--dtypes", "bf16", "--sizes", "1M,4K,1M"]
    )
    # Canonical order whatever the order typed; duplicates dropped.
    assert s.impls == ("smddp", "openmpi", "deepspeed")
    assert s.ops == ("all_gather", "all_reduce")
    assert s.dtypes == ("bfloat16",)
    assert s.sizes == (4 * K, M)
    assert peers.parse_args(["--ranks", "8,2"]).ranks == (2, 8)
    assert peers.parse_args(["--no-setup", "--no-plot"]).setup == "skip"
    assert peers.parse_args(["--setup-only"]).setup == "only"


@pytest.mark.parametrize(
    "argv",
    [
        ["--impls", "nccl"],
        ["--ops", "broadcast"],
        ["--dtypes", "float16"],
        ["--sizes", "12Q"],
        ["--sizes", "0"],
        ["--ranks", "1"],
        ["--ranks", "two"],
        ["--warmup", "0"],
        ["--min-iters", "10", "--max-iters", "5"],
        ["--point-cap", "10", "--point-timeout", "5"],
        ["--setup-only", "--no-setup"],
        ["--mpi-bf16", "maybe"],
    ],
)
def test_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as e:
        peers.parse_args(argv)
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


# -- the plan -----------------------------------------------------------------------


def test_unsupported():
    assert peers.unsupported("deepspeed", "all_gather", "float32")
    assert peers.unsupported("deepspeed", "all_reduce", "bfloat16") is None
    assert peers.unsupported("mpich", "all_reduce", "bfloat16") is None
    assert peers.unsupported("mpich", "all_reduce", "bfloat16", "off")
    # A bfloat16 gather moves bytes: no type needed.
    assert peers.unsupported("openmpi", "all_gather", "bfloat16", "off") is None
    assert peers.unsupported("smddp", "reduce_scatter", "bfloat16", "off") is None
    assert peers.user_op("mpich", "reduce_scatter", "bfloat16")
    assert not peers.user_op("mpich", "all_gather", "bfloat16")
    assert not peers.user_op("smddp", "all_reduce", "bfloat16")


def test_plan_covers_every_cell():
    s = peers.parse_args([])
    jobs, fixed = peers.plan(s)
    assert [(j.impl, j.world) for j in jobs[:5]] == [
        ("smddp", 2),
        ("gloo", 2),
        ("mpich", 2),
        ("openmpi", 2),
        ("deepspeed", 2),
    ]
    cells = 3 * 2 * 5  # ops x dtypes x sizes
    for j in jobs:
        if j.impl == "deepspeed":
            assert {p.op for p in j.points} == {"all_reduce"} and len(j.points) == 2 * 5
        else:
            assert len(j.points) == cells
    # DeepSpeed's AllGather and ReduceScatter: n/a, once per cell.
    assert len(fixed) == 3 * 2 * 2 * 5
    assert {r["status"] for r in fixed} == {"n/a"}
    assert sum(len(j.points) for j in jobs) + len(fixed) == 5 * 3 * cells


def test_plan_drops_sizes_below_one_element():
    s = peers.parse_args(
        ["--sizes", "8,4K", "--ranks", "4", "--impls", "smddp", "--dtypes", "float32"]
    )
    jobs, _ = peers.plan(s)
    sizes = {(p.op, p.nbytes) for p in jobs[0].points}
    # 8 B over 4 ranks is less than a float32 each for AllGather, but an AllReduce of 2.
    assert ("all_gather", 8) not in sizes and ("all_reduce", 8) in sizes


# -- arithmetic -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "op,world,factor",
    [("all_gather", 2, 0.5), ("reduce_scatter", 8, 7 / 8), ("all_reduce", 4, 1.5)],
)
def test_busbw(op, world, factor):
    p = peers.Point(op, "float32", M)
    rec = peers.finish_record("gloo", world, p, [300e-6, 100e-6, 200e-6], [1e-3], 0, "ok")
    algbw = M / 200e-6 / 1e9  # the median, GB = 1e9
    assert rec["time_us"] == pytest.approx(200.0)
    assert rec["algbw_gbs"] == pytest.approx(algbw)
    assert rec["busbw_gbs"] == pytest.approx(algbw * factor)
    assert rec["size_bytes"] == M and rec["iters"] == 3
    assert rec["time_min_us"] == pytest.approx(100.0) and rec["time_max_us"] == pytest.approx(300.0)
    count = M // 4 // world if op != "all_reduce" else M // 4
    assert rec["count"] == count


def test_reference_figure_arithmetic():
    # 2 ranks, AllGather of 1 MiB at 7.6 GB/s busbw is 69 us.
    p = peers.Point("all_gather", "float32", M)
    t = M / (7.6e9 * 2)  # busbw = size/t * 1/2
    rec = peers.finish_record("openmpi", 2, p, [t], [], 0, "ok")
    assert rec["busbw_gbs"] == pytest.approx(7.6)
    assert rec["time_us"] == pytest.approx(69.0, abs=0.1)


def test_plan_iterations():
    timing = {"time_per_point": 0.2, "min_iters": 5, "max_iters": 1000, "point_cap": 6.0}
    assert peers.plan_iterations(1e-6, timing, 0.0) == (1000, False)
    assert peers.plan_iterations(0.01, timing, 0.0) == (20, False)
    assert peers.plan_iterations(0.5, timing, 1.0) == (5, False)
    # 5 iterations of 2 s do not fit in the 6 s cap after 1 s of warm-up.
    assert peers.plan_iterations(2.0, timing, 1.0) == (2, True)
    assert peers.plan_iterations(10.0, timing, 7.0) == (1, True)


# -- the timing loop ------------------------------------------------------------------


class FakeComm:
    rank, world = 0, 1

    def __init__(self):
        self.barriers = 0

    def barrier(self):
        self.barriers += 1

    def max_each(self, values):
        return list(values)

    def sum_int(self, value):
        return value


class FakeCase:
    def __init__(self, seconds, broken=False):
        self.seconds, self.broken = seconds, broken
        self.calls: list[str] = []

    def run(self):
        self.calls.append("run")
        time.sleep(self.seconds)

    def restore(self):
        self.calls.append("restore")

    def poison(self):
        self.calls.append("poison")

    def wrong(self):
        self.calls.append("check")
        return 7 if self.broken else 0


def test_measure_case_ok():
    timing = {"warmup": 2, "time_per_point": 0.01, "min_iters": 3, "max_iters": 4, "point_cap": 5}
    comm, case = FakeComm(), FakeCase(0.001)
    res = peers.measure_case(case, comm, timing)
    assert res["status"] == "ok" and res["wrong"] == 0
    assert len(res["warm"]) == 2 and 3 <= len(res["samples"]) <= 4
    assert all(t >= 0.001 for t in res["samples"])
    n = len(res["warm"]) + len(res["samples"])
    assert comm.barriers == n and case.calls.count("run") == n
    # Every iteration starts from the input; the last one's output is poisoned first
    # and checked after.
    assert case.calls.count("restore") == n
    assert case.calls[-4:] == ["poison", "restore", "run", "check"]


def test_measure_case_slow_and_wrong():
    timing = {"warmup": 2, "time_per_point": 1, "min_iters": 5, "max_iters": 10, "point_cap": 0.01}
    res = peers.measure_case(FakeCase(0.02, broken=True), FakeComm(), timing)
    assert res["status"] == "slow" and len(res["samples"]) == 1 and res["wrong"] == 7


def test_measure_case_few():
    timing = {"warmup": 2, "time_per_point": 1, "min_iters": 5, "max_iters": 10, "point_cap": 0.1}
    res = peers.measure_case(FakeCase(0.02), FakeComm(), timing)
    assert res["status"] == "few" and 1 <= len(res["samples"]) < 5


def test_run_points_progress_and_give_up(tmp_path):
    progress = tmp_path / "progress"
    spec = {
        "impl": "gloo",
        "world": 1,
        "timing": {"warmup": 1, "time_per_point": 0.001, "min_iters": 1, "max_iters": 2,
                   "point_cap": 0.01},
        "progress": str(progress),
        "points": [
            # Sizes a factor 2 apart: the linear guess from a fast first point
            # must stay under the cap even when sleep(0) takes a loaded host's 1 ms.
            {"op": "all_reduce", "dtype": "float32", "bytes": 512 * K},
            {"op": "all_reduce", "dtype": "float32", "bytes": M},
            {"op": "all_reduce", "dtype": "float32", "bytes": 16 * M},
        ],
    }
    slow = {512 * K: 0.0, M: 0.02, 16 * M: 0.0}
    peers.run_points(spec, FakeComm(), lambda p: FakeCase(slow[p.nbytes]), {"v": 1})
    reader = peers.ProgressReader(str(progress))
    events = reader.read()
    kinds = [e["event"] for e in events]
    assert kinds == ["info", "begin", "point", "begin", "point", "point", "done"]
    recs = [e["record"] for e in events if e["event"] == "point"]
    assert [r["status"] for r in recs] == ["ok", "slow", "skipped"]
    assert reader.read() == []


def test_progress_reader_partial_line(tmp_path):
    path = tmp_path / "p"
    reader = peers.ProgressReader(str(path))
    assert reader.read() == []
    path.write_text('{"event": "info"}\n{"event": "be')
    assert reader.read() == [{"event": "info"}]
    with open(path, "a") as f:
        f.write('gin"}\n')
    assert reader.read() == [{"event": "begin"}]


# -- values and checks -------------------------------------------------------------------


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("nbytes", [4 * K, 3 * 4 * 1021 * 1024 + 12])
def test_layout_matches_smddp_bench(op, nbytes):
    ops = peers.bench_ops()
    world, rank = 3, 1
    layout = peers.Layout(op, "float32", nbytes, rank, world)
    geom = ops.geometry(op, nbytes, 4, world)
    assert np.array_equal(layout.input_f32(), ops.rank_input(op, "sum", rank, geom, 0))
    expected = ops.expected_output(op, "sum", rank, world, geom, 0).astype(np.float32)
    assert layout.wrong(lambda a, b: expected[a:b]) == 0
    bad = expected.copy()
    bad[[0, len(bad) // 2, -1]] += 1
    bad[1] = np.nan
    assert layout.wrong(lambda a, b: bad[a:b]) == 4


def test_bf16_helpers_match_torch():
    import torch

    x = np.array([0.0, 1.0, -3.0, 1.00390625, 1.01171875, 3.14159, -1e-3, 65504.0], np.float32)
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(peers_mpi.bf16_bits(x), want)
    back = peers_mpi.bf16_to_f32(want)
    assert np.array_equal(back, torch.from_numpy(x).to(torch.bfloat16).float().numpy())
    a = peers_mpi.bf16_bits(np.arange(-8, 8, dtype=np.float32))
    b = peers_mpi.bf16_bits(np.full(16, 24.0, np.float32))
    peers_mpi.bf16_sum(a.tobytes(), b, None)
    assert np.array_equal(peers_mpi.bf16_to_f32(b), np.arange(16, 32, dtype=np.float32))


# -- table, record, plot ------------------------------------------------------------------


def _rec(impl, op, dtype, nbytes, world, busbw=None, status="ok", wrong=0):
    p = peers.Point(op, dtype, nbytes)
    if busbw is None:
        return peers.status_record(impl, world, p, status, "why")
    size = peers.size_bytes(op, dtype, nbytes, world)
    factor = peers.bench_ops().bus_factor(op, world)
    t = size / (busbw / factor * 1e9)
    return peers.finish_record(impl, world, p, [t], [t], wrong, status)


def _fake_records():
    return [
        _rec("smddp", "all_gather", "float32", M, 2, 6.0),
        _rec("gloo", "all_gather", "float32", M, 2, 1.0),
        _rec("mpich", "all_gather", "float32", M, 2, 5.0, status="few"),
        _rec("openmpi", "all_gather", "float32", M, 2, 8.0),
        _rec("deepspeed", "all_gather", "float32", M, 2, status="n/a"),
        _rec("smddp", "all_reduce", "bfloat16", 4 * K, 4, 0.5),
        _rec("gloo", "all_reduce", "bfloat16", 4 * K, 4, status="timeout"),
        _rec("mpich", "all_reduce", "bfloat16", 4 * K, 4, 0.1),
        # Fastest, but wrong: never the best.
        _rec("openmpi", "all_reduce", "bfloat16", 4 * K, 4, 9.0, wrong=3),
        _rec("deepspeed", "all_reduce", "bfloat16", 4 * K, 4, 0.25, status="slow"),
        _rec("smddp", "reduce_scatter", "float32", 16 * M, 8, status="error"),
        _rec("gloo", "reduce_scatter", "float32", 16 * M, 8, 2.0),
    ]


def test_rows_best_and_ratio():
    rows = peers.build_rows(_fake_records(), peers.IMPLS)
    assert [(r["op"], r["world"]) for r in rows] == [
        ("all_gather", 2),
        ("reduce_scatter", 8),
        ("all_reduce", 4),
    ]
    ag, rs, ar = rows
    assert ag["best_peer"] == "openmpi" and ag["smddp_over_best"] == pytest.approx(0.75)
    assert ar["best_peer"] == "deepspeed" and ar["smddp_over_best"] == pytest.approx(2.0)
    assert rs["best_peer"] == "gloo" and rs["smddp_over_best"] is None
    # Only the implementations asked for compete.
    rows = peers.build_rows(_fake_records(), ("smddp", "gloo", "mpich"))
    assert rows[0]["best_peer"] == "mpich" and rows[0]["smddp_over_best"] == pytest.approx(1.2)


def test_cells():
    recs = {(r["impl"], r["op"]): r for r in _fake_records()}
    assert peers.cell_text(recs["smddp", "all_gather"]) == "6.000"
    assert peers.cell_text(recs["mpich", "all_gather"]) == "5.000*"
    assert peers.cell_text(recs["deepspeed", "all_gather"]) == "n/a"
    assert peers.cell_text(recs["gloo", "all_reduce"]) == "timeout"
    assert peers.cell_text(recs["mpich", "all_reduce"]) == "0.100u"
    assert peers.cell_text(recs["openmpi", "all_reduce"]) == "9.000u!"
    assert peers.cell_text(recs["deepspeed", "all_reduce"]) == "0.250~"
    assert peers.cell_text(recs["smddp", "reduce_scatter"]) == "error"
    assert peers.cell_text(None) == ""


def test_table_and_footer():
    records = _fake_records()
    rows = peers.build_rows(records, peers.IMPLS)
    text = peers.format_table(rows, peers.IMPLS, "# header")
    lines = text.splitlines()
    assert lines[0] == "# header"
    head = next(ln for ln in lines if ln.startswith("# op"))
    assert head.split()[1:] == [
        "op", "type", "size", "ranks", "smddp", "gloo", "mpich", "openmpi", "deepspeed",
        "smddp/best", "best",
    ]
    ag = next(ln for ln in lines if ln.lstrip().startswith("AllGather"))
    assert ag.split() == [
        "AllGather", "float32", "1M", "2", "6.000", "1.000", "5.000*", "8.000", "n/a", "0.75",
        "openmpi",
    ]
    rs = next(ln for ln in lines if ln.lstrip().startswith("ReduceScatter"))
    assert rs.split()[-2:] == ["n/a", "gloo"]
    summary = peers.summarize(rows, records)
    assert summary["wrong"] == {"smddp": 0, "gloo": 0, "mpich": 0, "openmpi": 3, "deepspeed": 0}
    assert [b["best_peer"] for b in summary["smddp_behind"]] == ["openmpi"]
    assert summary["geomean_smddp_over_best"]["all_gather float32"] == pytest.approx(0.75)
    footer = peers.format_footer(summary)
    assert "smddp 6.000 vs openmpi 8.000 GB/s (0.75x)" in footer
    assert "#wrong: 3 FAILED (openmpi 3)" in footer
    assert "gloo (timeout): why" in footer and "smddp (error): why" in footer


def test_record_is_strict_json_and_plots(tmp_path):
    s = peers.parse_args(["--out", str(tmp_path / "peers")])
    machine = {"cpu_model": "test", "cpu_cores_available": 2, "hostname": "h"}
    rec = peers.build_record(s, _fake_records(), {"mpich": {"version": "x"}}, 0.0, 1.0, machine)
    text = json.dumps(rec, allow_nan=False)
    back = json.loads(text)
    assert back["schema"] == "smddp-peers/1"
    assert len(back["rows"]) == 3 and len(back["results"]) == 12
    row = back["rows"][0]
    assert row["busbw_gbs"]["openmpi"] == pytest.approx(8.0)
    assert row["busbw_gbs"]["deepspeed"] is None and row["status"]["deepspeed"] == "n/a"
    assert back["settings"]["ranks"] == [2, 4, 8]
    png = tmp_path / "peers.png"
    peers.write_plot(rec, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- processes ---------------------------------------------------------------------------


def test_kill_tree_reaches_grandchildren():
    proc = subprocess.Popen(
        ["sh", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True
    )
    deadline = time.monotonic() + 10
    while len(peers.descendants(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    kids = peers.descendants(proc.pid)
    assert len(kids) == 2
    t0 = time.monotonic()
    peers.kill_tree([proc])
    assert time.monotonic() - t0 < 10
    assert proc.poll() is not None
    for pid in kids:
        # Gone, or a zombie waiting for init to reap it.
        try:
            with open(f"/proc/{pid}/stat") as f:
                assert f.read().rpartition(")")[2].split()[0] == "Z"
        except FileNotFoundError:
            pass
