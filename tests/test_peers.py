"""The peer comparison (bench.peers) without MPI or DeepSpeed: arguments, the
plan, the worker loop on a one-process communicator, the MPI bfloat16
helpers, the table, the JSON record and the plot from made-up results, and
one real job of smddp and gloo."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench.peers import driver, mpi, worker  # noqa: E402
from smddp.bench import ops, record, timing, views  # noqa: E402

K, M = 1 << 10, 1 << 20


# -- arguments ----------------------------------------------------------------------


def test_defaults():
    s = driver.parse_args([])
    assert s.impls == ("smddp", "gloo", "mpich", "openmpi", "deepspeed")
    assert s.ops == ("all_gather", "reduce_scatter", "all_reduce")
    assert s.dtypes == ("float32", "bfloat16")
    assert s.sizes == (4 * K, 64 * K, M, 16 * M, 256 * M)
    assert s.ranks == (2, 4, 8)
    assert s.setup == "auto" and s.plot and s.mpi_bf16 == "numpy"
    t = s.timing
    assert (t.policy, t.rounds, t.block_warmup, t.cap) == ("barrier-each", 1, 0, 6.0)
    assert s.argv == ["python", "-m", "bench.peers"]


def test_choices_aliases_and_order():
    s = driver.parse_args(
        ["--impls", "ds,smddp,ompi", "--ops", "ar,ag", "--dtypes", "bf16", "--sizes", "1M,4K,1M"]
    )
    # Canonical order whatever the order typed; duplicates dropped.
    assert s.impls == ("smddp", "openmpi", "deepspeed")
    assert s.ops == ("all_gather", "all_reduce")
    assert s.dtypes == ("bfloat16",)
    assert s.sizes == (4 * K, M)
    assert driver.parse_args(["--ranks", "8,2"]).ranks == (2, 8)
    assert driver.parse_args(["--no-setup", "--no-plot"]).setup == "skip"
    assert driver.parse_args(["--setup-only"]).setup == "only"
    s = driver.parse_args(["--point-cap", "3", "--time-per-point", "0.5", "--warmup", "4"])
    assert (s.timing.cap, s.timing.time_per_point, s.timing.warmup) == (3.0, 0.5, 4)


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
        driver.parse_args(argv)
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


# -- the plan -----------------------------------------------------------------------


def test_unsupported():
    assert driver.unsupported("deepspeed", "all_gather", "float32")
    assert driver.unsupported("deepspeed", "all_reduce", "bfloat16") is None
    assert driver.unsupported("mpich", "all_reduce", "bfloat16") is None
    assert driver.unsupported("mpich", "all_reduce", "bfloat16", "off")
    # A bfloat16 gather moves bytes: no type needed.
    assert driver.unsupported("openmpi", "all_gather", "bfloat16", "off") is None
    assert driver.unsupported("smddp", "reduce_scatter", "bfloat16", "off") is None


def test_plan_covers_every_cell():
    s = driver.parse_args([])
    jobs, fixed = driver.plan(s)
    assert [(j.impl, j.world) for j in jobs[:5]] == [
        ("smddp", 2), ("gloo", 2), ("mpich", 2), ("openmpi", 2), ("deepspeed", 2),
    ]  # fmt: skip
    cells = 3 * 2 * 5  # ops x dtypes x sizes
    for j in jobs:
        if j.impl == "deepspeed":
            assert {p[0] for p in j.points} == {"all_reduce"} and len(j.points) == 2 * 5
        else:
            assert len(j.points) == cells
    # DeepSpeed's AllGather and ReduceScatter: n/a, once per cell.
    assert len(fixed) == 3 * 2 * 2 * 5
    assert {r["status"] for r in fixed} == {"n/a"}
    assert sum(len(j.points) for j in jobs) + len(fixed) == 5 * 3 * cells


def test_plan_drops_sizes_below_one_element():
    s = driver.parse_args(
        ["--sizes", "8,4K", "--ranks", "4", "--impls", "smddp", "--dtypes", "float32"]
    )
    jobs, _ = driver.plan(s)
    sizes = {(p[0], p[2]) for p in jobs[0].points}
    # 8 B over 4 ranks is less than a float32 each for AllGather, but an AllReduce of 2.
    assert ("all_gather", 8) not in sizes and ("all_reduce", 8) in sizes


# -- the worker loop ------------------------------------------------------------------


class FakeCase:
    def __init__(self, seconds, broken=False):
        self.seconds, self.broken = seconds, broken

    def run(self):
        import time

        time.sleep(self.seconds)

    def restore(self):
        pass

    def poison(self):
        pass

    def wrong(self):
        return 7 if self.broken else 0


def test_run_points_progress_and_give_up(tmp_path):
    progress = tmp_path / "progress"
    how = timing.Timing(timing.BARRIER_EACH, 1, 0, None, 0.001, 1, 2, 1, 0.01)
    spec = {
        "impl": "gloo",
        "world": 1,
        "timing": dataclasses.asdict(how),
        "progress": str(progress),
        "points": [
            # Sizes a factor 2 apart: the linear guess from a fast first point
            # must stay under the cap even when sleep(0) takes a loaded host's 1 ms.
            {"op": "all_reduce", "dtype": "float32", "bytes": 512 * K},
            {"op": "all_reduce", "dtype": "float32", "bytes": M},
            {"op": "all_reduce", "dtype": "float32", "bytes": 16 * M},
            {"op": "all_gather", "dtype": "float32", "bytes": M},
        ],
    }
    slow = {512 * K: 0.0, M: 0.02, 16 * M: 0.0}
    make = lambda op, dtype, n: FakeCase(slow[n] if op == "all_reduce" else 0, op != "all_reduce")  # noqa: E731
    worker.run_points(spec, timing.LocalComm(), make, {"v": 1})
    reader = driver.ProgressReader(str(progress))
    events = reader.read()
    kinds = [e["event"] for e in events]
    assert kinds == ["info", "begin", "point", "begin", "point", "point", "begin", "point", "done"]
    recs = [e["record"] for e in events if e["event"] == "point"]
    assert [r["status"] for r in recs] == ["ok", "slow", "skipped", "ok"]
    assert recs[1]["iters"] == 1 and "exceeded --point-cap" in recs[1]["note"]
    assert recs[3]["wrong"] == 7 and recs[3]["backend"] == "gloo"
    assert reader.read() == []


def test_progress_reader_partial_line(tmp_path):
    path = tmp_path / "p"
    reader = driver.ProgressReader(str(path))
    assert reader.read() == []
    path.write_text('{"event": "info"}\n{"event": "be')
    assert reader.read() == [{"event": "info"}]
    with open(path, "a") as f:
        f.write('gin"}\n')
    assert reader.read() == [{"event": "begin"}]


# -- MPI's cases --------------------------------------------------------------------------


def test_bf16_helpers_match_torch():
    import torch

    x = np.array([0.0, 1.0, -3.0, 1.00390625, 1.01171875, 3.14159, -1e-3, 65504.0], np.float32)
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(mpi.bf16_bits(x), want)
    back = mpi.bf16_to_f32(want)
    assert np.array_equal(back, torch.from_numpy(x).to(torch.bfloat16).float().numpy())
    a = mpi.bf16_bits(np.arange(-8, 8, dtype=np.float32))
    b = mpi.bf16_bits(np.full(16, 24.0, np.float32))
    mpi.bf16_sum(a.tobytes(), b, None)
    assert np.array_equal(mpi.bf16_to_f32(b), np.arange(16, 32, dtype=np.float32))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_reduce"])
def test_mpi_case_on_a_simulated_collective(op, dtype):
    """The MPI case's buffers, filled by a collective simulated in numpy, pass
    the check; a poisoned output does not."""
    world, nbytes = 3, 3 * 4 * 1021 * 1024 + 12
    mpi_ns = type("MPI", (), {"UINT16_T": "u16", "FLOAT": "f32", "SUM": "sum"})
    comms = [type("C", (), {"rank": r, "world": world, "comm": None})() for r in range(world)]
    cases = [mpi.MpiCase(op, dtype, nbytes, c, mpi_ns, "bf16sum") for c in comms]
    assert cases[0].flags == ("u" if dtype == "bfloat16" and op != "all_gather" else "")
    f32 = [mpi.bf16_to_f32(c.send) if c.bf16 else c.send for c in cases]
    total = np.sum(f32, axis=0)
    c = cases[0].geom.count
    for r, case in enumerate(cases):
        out = {"all_gather": np.concatenate(f32), "all_reduce": total,
               "reduce_scatter": total[r * c : (r + 1) * c]}[op]  # fmt: skip
        case.recv[:] = mpi.bf16_bits(out) if case.bf16 else out
        assert case.wrong() == 0
        case.poison()
        assert case.wrong() == case.recv.size


# -- table, record, plot ------------------------------------------------------------------


def _rec(impl, op, dtype, nbytes, world, busbw=None, status="ok", wrong=0, flags=""):
    redop = "sum" if ops.OPS[op].reduces else "none"
    if busbw is None:
        return record.point(impl, op, dtype, redop, world, nbytes, status=status, note="why")
    size = ops.geometry(op, nbytes, ops.DTYPES[dtype][0], world).size
    t = size / (busbw / ops.bus_factor(op, world) * 1e9)
    res = timing.Result(status=status, samples=[t], warm=[t], iters=1, wrong=wrong)
    rec = record.point(impl, op, dtype, redop, world, nbytes, res)
    return rec | ({"flags": flags} if flags else {})


def _fake_records():
    return [
        _rec("smddp", "all_gather", "float32", M, 2, 6.0),
        _rec("gloo", "all_gather", "float32", M, 2, 1.0),
        _rec("mpich", "all_gather", "float32", M, 2, 5.0, status="few"),
        _rec("openmpi", "all_gather", "float32", M, 2, 8.0),
        _rec("deepspeed", "all_gather", "float32", M, 2, status="n/a"),
        _rec("smddp", "all_reduce", "bfloat16", 4 * K, 4, 0.5),
        _rec("gloo", "all_reduce", "bfloat16", 4 * K, 4, status="timeout"),
        _rec("mpich", "all_reduce", "bfloat16", 4 * K, 4, 0.1, flags="u"),
        # Fastest, but wrong: never the best.
        _rec("openmpi", "all_reduce", "bfloat16", 4 * K, 4, 9.0, wrong=3, flags="u"),
        _rec("deepspeed", "all_reduce", "bfloat16", 4 * K, 4, 0.25, status="slow"),
        _rec("smddp", "reduce_scatter", "float32", 16 * M, 8, status="error"),
        _rec("gloo", "reduce_scatter", "float32", 16 * M, 8, 2.0),
    ]


def _rows(impls=driver.IMPLS):
    return views.peer_rows(_fake_records(), impls, driver.OPS, driver.DTYPES)


def test_busbw_follows_nccl_tests():
    # 2 ranks, AllGather of 1 MiB at 7.6 GB/s busbw is 69 us.
    rec = _rec("openmpi", "all_gather", "float32", M, 2, 7.6)
    assert rec["busbw_gbs"] == pytest.approx(7.6) and rec["algbw_gbs"] == pytest.approx(15.2)
    assert rec["time_us"] == pytest.approx(69.0, abs=0.1)
    assert rec["size_bytes"] == M and rec["count"] == M // 4 // 2


def test_rows_best_and_ratio():
    rows = _rows()
    assert [(r["op"], r["world"]) for r in rows] == [
        ("all_gather", 2), ("reduce_scatter", 8), ("all_reduce", 4),
    ]  # fmt: skip
    ag, rs, ar = rows
    assert ag["best_peer"] == "openmpi" and ag["smddp_over_best"] == pytest.approx(0.75)
    assert ar["best_peer"] == "deepspeed" and ar["smddp_over_best"] == pytest.approx(2.0)
    assert rs["best_peer"] == "gloo" and rs["smddp_over_best"] is None
    # Only the implementations asked for compete.
    rows = _rows(("smddp", "gloo", "mpich"))
    assert rows[0]["best_peer"] == "mpich" and rows[0]["smddp_over_best"] == pytest.approx(1.2)


def test_cells():
    recs = {(r["backend"], r["op"]): r for r in _fake_records()}
    assert views.peer_cell(recs["smddp", "all_gather"]) == "6.000"
    assert views.peer_cell(recs["mpich", "all_gather"]) == "5.000*"
    assert views.peer_cell(recs["deepspeed", "all_gather"]) == "n/a"
    assert views.peer_cell(recs["gloo", "all_reduce"]) == "timeout"
    assert views.peer_cell(recs["mpich", "all_reduce"]) == "0.100u"
    assert views.peer_cell(recs["openmpi", "all_reduce"]) == "9.000u!"
    assert views.peer_cell(recs["deepspeed", "all_reduce"]) == "0.250~"
    assert views.peer_cell(recs["smddp", "reduce_scatter"]) == "error"
    assert views.peer_cell(None) == ""


def _record(tmp_path):
    s = driver.parse_args(["--out", str(tmp_path / "peers")])
    return driver.build_record(s, _fake_records(), {"mpich": {"version": "x"}}, 1.0)


def test_table_and_footer(tmp_path):
    rec = _record(tmp_path)
    text = views.peers_text(rec, "# header")
    lines = text.splitlines()
    assert lines[0] == "# header"
    head = next(ln for ln in lines if ln.startswith("# op"))
    assert head.split()[1:] == [
        "op", "type", "size", "ranks", "smddp", "gloo", "mpich", "openmpi", "deepspeed",
        "smddp/best", "best",
    ]  # fmt: skip
    ag = next(ln for ln in lines if ln.lstrip().startswith("AllGather"))
    assert ag.split() == [
        "AllGather", "float32", "1M", "2", "6.000", "1.000", "5.000*", "8.000", "n/a", "0.75",
        "openmpi",
    ]  # fmt: skip
    rs = next(ln for ln in lines if ln.lstrip().startswith("ReduceScatter"))
    assert rs.split()[-2:] == ["n/a", "gloo"]
    summary = rec["summary"]
    assert summary["wrong"] == {"smddp": 0, "gloo": 0, "mpich": 0, "openmpi": 3, "deepspeed": 0}
    assert [b["best_peer"] for b in summary["smddp_behind"]] == ["openmpi"]
    assert summary["geomean_smddp_over_best"]["all_gather float32"] == pytest.approx(0.75)
    assert "smddp 6.000 vs openmpi 8.000 GB/s (0.75x)" in text
    assert "#wrong: 3 FAILED (openmpi 3)" in text
    assert "gloo (timeout): why" in text and "smddp (error): why" in text
    assert "timing barrier-each" in text


def test_record_is_strict_json_renders_and_plots(tmp_path):
    rec = _record(tmp_path)
    back = json.loads(json.dumps(rec, allow_nan=False))
    assert back["schema"] == record.SCHEMA and back["kind"] == "peers"
    assert len(back["results"]) == 12 and back["settings"]["ranks"] == [2, 4, 8]
    assert back["versions"]["mpich"] == "x" and back["timing"]["policy"] == "barrier-each"
    md = views.markdown(back)
    assert "| AllGather | float32 | 1M | 2 | 6.000 | 1.000 | 5.000* | 8.000 | n/a | 0.75 | openmpi |" in md
    assert "`python -m bench.peers --out" in md
    png = tmp_path / "peers.png"
    assert driver.write_plot(rec, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- one real job --------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_smddp_and_gloo_job(tmp_path, capsys):
    out = tmp_path / "peers"
    argv = ["--impls", "smddp,gloo", "--ranks", "2", "--sizes", "4K,64K", "--dtypes", "float32",
            "--ops", "all_gather,all_reduce", "--time-per-point", "0.01", "--out", str(out),
            "--no-plot"]  # fmt: skip
    assert driver.main(argv) == 0
    rec = record.read(str(out) + ".json")
    assert {(r["backend"], r["status"]) for r in rec["results"]} == {("smddp", "ok"), ("gloo", "ok")}
    assert len(rec["results"]) == 2 * 2 * 2 and rec["summary"]["wrong"] == {"smddp": 0, "gloo": 0}
    assert rec["implementations"]["smddp"]["ranks_report"]["2"]["config"]
    assert "smddp/best" in capsys.readouterr().out
