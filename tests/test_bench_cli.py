"""smddp-bench: argument parsing, nccl-tests' arithmetic, the expected values,
and one tiny real sweep that writes the JSON record and the plot."""

from __future__ import annotations

import json
import math
import sys
import time
import types

import numpy as np
import pytest
import torch

from smddp import bench
from smddp.bench import cli, ops
from smddp.bench.units import format_size, parse_size, parse_size_list, size_range

K, M, G = 1 << 10, 1 << 20, 1 << 30


# -- sizes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,value",
    [
        ("4096", 4096),
        ("4K", 4 * K),
        ("4k", 4 * K),
        ("256M", 256 * M),
        ("1G", G),
        ("4KB", 4 * K),
        ("4KiB", 4 * K),
        ("1.5K", 1536),
        (" 8M ", 8 * M),
        ("2T", 2 << 40),
    ],
)
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["4Q", "", "K", "-1", "1.3", "4 K B", "0x10", "4MM"])
def test_parse_size_rejects_nonsense(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_size_lists_and_ranges():
    assert parse_size_list("1M,16M") == [M, 16 * M]
    assert parse_size_list("4K, 8K,") == [4 * K, 8 * K]
    with pytest.raises(ValueError):
        parse_size_list("1M,0")
    with pytest.raises(ValueError):
        parse_size_list(",")
    # nccl-tests: -b 4K -e 256M -f 4
    assert size_range(4 * K, 256 * M, 4) == [4 * K * 4**i for i in range(9)]
    assert size_range(1 * K, 4 * K, step=1 * K) == [K, 2 * K, 3 * K, 4 * K]
    assert size_range(8, 8, 2) == [8]
    with pytest.raises(ValueError, match="below the smallest"):
        size_range(4 * K, 1 * K, 2)
    with pytest.raises(ValueError, match="factor"):
        size_range(1, 8, 1)
    assert [format_size(s) for s in (4 * K, 256 * M, G, 1000)] == ["4K", "256M", "1G", "1000"]


# -- command line ----------------------------------------------------------------


def _parse(argv, monkeypatch):
    monkeypatch.delenv("SMDDP_RANKS_PER_NODE", raising=False)
    monkeypatch.setattr(cli, "_gpu_count", lambda: 0)
    return cli.parse_run_args(argv)


def test_defaults_without_gpu(monkeypatch):
    s, world, rpn = _parse([], monkeypatch)
    assert (world, rpn) == (4, 2)  # 2 emulated nodes x 2 ranks
    assert s.ops == ("all_gather", "reduce_scatter", "all_reduce")
    assert s.backends == ("smddp", "gloo") and s.device == "cpu"
    assert s.sizes == tuple(4 * K * 4**i for i in range(8))  # 4K .. 64M
    assert s.json.endswith("bench.json") and s.plot.endswith("bench.png")
    assert s.timing.iters is None and s.timing.time_per_point > 0
    assert s.timing.policy == "back-to-back"


def test_ranges_lists_and_choices(monkeypatch):
    s, _, _ = _parse(["-b", "4K", "-e", "64K", "-f", "2"], monkeypatch)
    assert s.sizes == (4 * K, 8 * K, 16 * K, 32 * K, 64 * K)
    s, _, _ = _parse(
        ["--sizes", "1M,16M", "--op", "all", "--dtype", "float32,bf16", "--redop", "max"],
        monkeypatch,
    )
    assert s.sizes == (M, 16 * M)
    assert s.ops == ("all_gather", "reduce_scatter", "all_reduce", "broadcast")
    assert s.dtypes == ("float32", "bfloat16") and s.redop == "max"
    s, world, rpn = _parse(
        ["--nproc", "6", "--nodes", "3", "-n", "7", "-w", "0", "--no-save"], monkeypatch
    )
    assert (world, rpn, s.timing.iters, s.timing.warmup) == (6, 2, 7, 0)
    assert s.timing.block_warmup == 3
    assert _parse(["--block-warmup", "0"], monkeypatch)[0].timing.block_warmup == 0
    assert _parse(["--timing", "barrier-each"], monkeypatch)[0].timing.policy == "barrier-each"
    assert s.json is None and s.plot is None
    s, _, _ = _parse(["--op", "allgather,rs", "--time-per-point", "0.5"], monkeypatch)
    assert s.ops == ("all_gather", "reduce_scatter") and s.timing.time_per_point == 0.5


@pytest.mark.parametrize(
    "argv,message",
    [
        (["-b", "4Q"], "not a size"),
        (["-b", "1M", "-e", "4K"], "below the smallest"),
        (["-f", "1"], "factor"),
        (["--op", "alltoall"], "unknown op"),
        (["--backends", "smddp,foo"], "unknown backend"),
        (["--backends", "smddp,smddp"], "twice"),
        (["--backends", "smddp,nccl"], "CUDA"),
        (["--dtype", "complex64"], "unknown dtype"),
        (["--sizes", "1M", "-b", "4K"], "not both"),
        (["-n", "3", "--time-per-point", "1"], "not allowed with"),
        (["--nproc", "4", "--nodes", "3"], "does not divide"),
        (["--redop", "xor"], "invalid choice"),
        (["--root", "9"], "not a rank"),
        (["--block-warmup", "-1"], "argument --block-warmup: must be at least 0, got -1"),
        (["--nproc", "0"], "argument --nproc: must be at least 1"),
        (["--time-per-point", "0"], "argument --time-per-point: must be positive"),
        (["--min-iters", "9", "--max-iters", "3"], "--min-iters is above --max-iters"),
        (["--timing", "sometimes"], "invalid choice"),
    ],
)
def test_errors_name_the_problem(argv, message, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exc:
        _parse(argv, monkeypatch)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_a_block_times_its_calls_after_the_untimed_ones():
    from smddp.bench import timing

    calls = []

    def fn():
        calls.append("call")
        if len(calls) <= 2:
            time.sleep(0.2)  # the cold calls: must not count

    # In-place ops: the timed calls start from restored inputs.
    restore = lambda: calls.append("restore")  # noqa: E731
    times, wall = timing.time_calls(fn, timing.LocalComm(), 4, timing.BACK_TO_BACK, restore, 2)
    assert calls == ["call"] * 2 + ["restore"] + ["call"] * 4
    assert len(times) == 1 and times[0] < 0.05, f"untimed calls were timed: {times}"
    assert wall >= 0.4, "the untimed calls did not run before the timed ones"


def test_step_is_dispatched_lazily(monkeypatch, capsys):
    seen = []
    fake = types.ModuleType("smddp.bench.step")
    fake.main = lambda argv: seen.append(argv) or 0
    monkeypatch.setitem(sys.modules, "smddp.bench.step", fake)
    monkeypatch.setattr(bench, "step", fake, raising=False)
    assert cli.main(["step", "--model", "tiny"]) == 0
    assert seen == [["--model", "tiny"]]

    monkeypatch.setitem(sys.modules, "smddp.bench.step", None)
    monkeypatch.delattr(bench, "step")
    assert cli.main(["step"]) == 2
    assert "smddp.bench.step is missing" in capsys.readouterr().err


# -- nccl-tests' arithmetic --------------------------------------------------------


def test_busbw_matches_nccl_tests_definitions():
    # AllReduce, 8 ranks, 128 MiB in 1500 us: algbw = 134217728 B / 1.5 ms
    # = 89.478 GB/s; busbw = algbw * 2*7/8 = 156.587 GB/s.
    assert ops.algbw_gbs(134217728, 1500e-6) == pytest.approx(89.478485, rel=1e-6)
    assert ops.busbw_gbs("all_reduce", 134217728, 1500e-6, 8) == pytest.approx(156.587349, rel=1e-6)
    # AllGather and ReduceScatter, 4 ranks, 4 MiB in 1 ms: 4.194304 GB/s, busbw * 3/4.
    for op in ("all_gather", "reduce_scatter"):
        assert ops.busbw_gbs(op, 4194304, 1e-3, 4) == pytest.approx(3.145728)
    # Broadcast: busbw = algbw; 1 GB in 0.1 s on 16 ranks = 10 GB/s.
    assert ops.busbw_gbs("broadcast", 10**9, 0.1, 16) == pytest.approx(10.0)
    assert ops.bus_factor("all_reduce", 2) == 1.0 and ops.bus_factor("all_gather", 1) == 0.0


def test_sizes_follow_nccl_tests():
    # -b 1000 on 3 ranks, float32: 83 elements per rank, size = 3*83*4 = 996 B.
    g = ops.geometry("all_gather", 1000, 4, 3)
    assert (g.count, g.size, g.in_numel, g.out_numel) == (83, 996, 83, 249)
    g = ops.geometry("reduce_scatter", 1000, 4, 3)
    assert (g.count, g.size, g.in_numel, g.out_numel) == (83, 996, 249, 83)
    g = ops.geometry("all_reduce", 1001, 2, 3)
    assert (g.count, g.size, g.in_numel, g.out_numel) == (500, 1000, 500, 500)
    g = ops.geometry("broadcast", 4096, 8, 5)
    assert (g.count, g.size) == (512, 4096)
    assert ops.geometry("all_gather", 8, 4, 4) is None


@pytest.mark.parametrize("dtype", ["float32", "int32", "uint8"])
@pytest.mark.parametrize("redop", ["sum", "prod", "min", "max", "avg"])
@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_reduce", "broadcast"])
def test_the_oracle_accepts_a_simulated_collective_and_nothing_else(op, redop, dtype):
    if redop == "avg" and dtype != "float32":
        return
    world, root, offset = 3, 1, 11
    geom = ops.geometry(op, 64 * 3 * 4, 4, world)
    inputs = [ops.rank_input(op, redop, r, geom, root, dtype, offset) for r in range(world)]
    assert inputs[0] is None if op == "broadcast" else inputs[0] is not None
    if dtype == "uint8":
        assert all(x is None or x.min() >= 0 for x in inputs)
    r = redop if ops.OPS[op].reduces else "sum"
    stack = np.stack([ops.input_values(q, offset, geom.in_numel, r, dtype) for q in range(world)])
    combined = {"sum": stack.sum(0), "avg": stack.mean(0), "prod": stack.prod(0),
                "min": stack.min(0), "max": stack.max(0)}[redop]  # fmt: skip
    if dtype == "uint8":
        combined = combined % 256
    for rank in range(world):
        c = geom.count
        if op == "all_gather":
            out = np.concatenate(inputs)
        elif op == "broadcast":
            out = inputs[root]
        elif op == "reduce_scatter":
            out = combined[rank * c : (rank + 1) * c]
        else:
            out = combined
        check = lambda o: ops.count_wrong(  # noqa: E731
            op, redop, dtype, rank, world, geom, root, lambda a, b: o[a:b], offset)
        assert check(out) == 0
        bad = out.astype(np.float64).copy()
        bad[[0, -1]] += 1
        assert check(bad) == 2
        bad[1] = np.nan
        assert check(bad) == 3
        # The same values one element off, or from another call, are wrong.
        assert check(np.roll(out, 1)) > 0
        assert ops.count_wrong(op, redop, dtype, rank, world, geom, root,
                               lambda a, b: out[a:b], offset + 1) > 0  # fmt: skip
    assert len({tuple(ops.input_values(q, 0, 8, redop)) for q in range(world)}) == world


def test_the_oracle_compares_large_outputs_block_by_block():
    world, rank = 2, 1
    geom = ops.geometry("reduce_scatter", 2 * 4 * (3 * ops.PERIOD * 1024 + 5), 4, world)
    stack = [ops.input_values(q, 0, geom.in_numel, "sum") for q in range(world)]
    out = np.sum(stack, axis=0)[rank * geom.count : (rank + 1) * geom.count].astype(np.float32)
    seen = []

    def get(a, b):
        seen.append(b - a)
        return out[a:b]

    assert ops.count_wrong("reduce_scatter", "sum", "float32", rank, world, geom, 0, get) == 0
    assert max(seen) == ops.PERIOD * 1024 and sum(seen) == geom.count


# -- one real sweep ---------------------------------------------------------------


def _check_record(record):
    assert record["schema"] == "smddp-bench/2" and record["kind"] == "sweep"
    for key in (
        "timing",
        "created",
        "command",
        "elapsed_s",
        "machine",
        "config",
        "topology",
        "settings",
        "results",
        "summary",
    ):
        assert key in record, key
    m = record["machine"]
    for key in ("hostname", "cpu_model", "cpu_cores", "kernel", "python", "torch", "smddp",
                "device"):
        assert m[key], key
    assert (
        all(k.startswith("SMDDP_") for k in record["config"]) and "SMDDP_ALGO" in record["config"]
    )
    t = record["topology"]
    assert (t["world"], t["nodes"], t["ranks_per_node"], t["launcher"]) == (2, 1, 2, "spawn")
    assert record["settings"]["backends"] == ["smddp", "gloo"]
    results = record["results"]
    ops_run = record["settings"]["ops"]
    assert len(results) == len(ops_run) * 2 * 2  # ops x sizes x backends
    for r in results:
        assert r["status"] == "ok" and not r["note"], r
        assert r["backend"] in ("smddp", "gloo") and r["op"] in ops_run
        # Back to back: one sample per block, the calls of every block in iters.
        assert len(r["samples_us"]) == record["timing"]["rounds"]
        assert r["iters"] == record["timing"]["iters"]
        assert all(isinstance(x, float) and x > 0 for x in r["samples_us"])
        assert r["time_us"] == pytest.approx(float(np.median(r["samples_us"])))
        assert r["algbw_gbs"] == pytest.approx(r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9)
        factor = ops.bus_factor(r["op"], r["world"])
        assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * factor)
        assert r["wrong"] == 0
    assert {r["size_bytes"] for r in results} == {4 * K, 64 * K}
    assert record["summary"]["wrong"] == 0
    for t in record["summary"]["tables"]:
        assert t["ratio_of_avg_busbw"]["smddp/gloo"] > 0 and t["geomean_ratio"]["smddp/gloo"] > 0
    assert len(record["summary"]["tables"]) == len(ops_run)


def test_tiny_sweep_writes_json_and_plot(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv("SMDDP_RANKS_PER_NODE", raising=False)
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    out_json, out_png = tmp_path / "r" / "bench.json", tmp_path / "r" / "bench.png"
    code = cli.main(
        [
            "--nproc",
            "2",
            "--nodes",
            "1",
            "--backends",
            "smddp,gloo",
            "--sizes",
            "4K,64K",
            "-n",
            "2",
            "-w",
            "1",
            "--rounds",
            "2",
            "--json",
            str(out_json),
            "--plot",
            str(out_png),
            "--no-progress",
            "--timeout",
            "240",
        ]
    )
    printed = capfd.readouterr().out
    assert code == 0, printed
    assert "#wrong" in printed and "smddp/gloo" in printed and "avg busbw" in printed
    assert "1 warm-up calls, then 2 timed calls in 2 blocks" in printed
    assert "each after 3 untimed calls" in printed
    assert printed.count("timing back-to-back") == 2  # the header and the footer
    assert printed.count("# AllGather") == 1 and "#wrong: 0 OK" in printed
    record = json.loads(out_json.read_text())
    _check_record(record)
    png = out_png.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(png) > 10_000
    assert not math.isnan(record["elapsed_s"])


def test_backends_with_a_schedule() -> None:
    from smddp.bench.cli import parse_backends

    assert parse_backends("smddp:hierarchical,smddp:ring,gloo", "cpu") == (
        "smddp:hierarchical",
        "smddp:ring",
        "gloo",
    )
    with pytest.raises(ValueError, match="smddp:ring, smddp:hierarchical"):
        parse_backends("smddp:tree", "cpu")
    with pytest.raises(ValueError, match="smddp:ring, smddp:hierarchical"):
        parse_backends("gloo:ring", "cpu")
    with pytest.raises(ValueError, match="listed twice"):
        parse_backends("smddp:ring,smddp:ring", "cpu")
    # The CUDA paths, compared the same way (bench/gpu_collectives.py).
    assert parse_backends("smddp:staged,smddp:zero-copy", "cpu") == ("smddp:staged", "smddp:zero-copy")
    from smddp.bench.sweep import SMDDP_VARIANTS

    assert SMDDP_VARIANTS["zero-copy"] == {"SMDDP_CUDA_ZERO_COPY": "1"}
    assert SMDDP_VARIANTS["staged"] == {"SMDDP_CUDA_ZERO_COPY": "0"}


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_inplace_buffers_alias_and_a_silent_backend_is_caught(op):
    from smddp.bench.sweep import Buffers

    world, rank = 3, 1
    geom = ops.geometry(op, 96 * K, 4, world)
    point = Buffers(op, "float32", geom, "sum", 0, rank, world, torch.device("cpu"), inplace=True)
    block = geom.in_numel if op == "all_gather" else geom.out_numel
    big, small = (point.out, point.inp) if op == "all_gather" else (point.inp, point.out)
    # The rank's block of the larger buffer, as nccl-tests' in-place columns.
    assert small.data_ptr() == big.data_ptr() + rank * block * 4
    # The sweep's check: poison, restore, call. A call that writes nothing
    # leaves the other blocks poisoned (AllGather) or the rank's own input
    # (ReduceScatter): either way the point is wrong.
    point.poison()
    point.restore()
    assert torch.equal(point.inp, point.pristine)
    assert point.wrong() > 0


def test_inplace_sweep(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv("SMDDP_RANKS_PER_NODE", raising=False)
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    out_json = tmp_path / "bench.json"
    argv = ["--nproc", "2", "--nodes", "1", "--inplace", "--op", "all_gather,reduce_scatter"]
    argv += ["--sizes", "4K,64K", "-n", "3", "-w", "1", "--rounds", "2", "--json", str(out_json)]
    argv += ["--plot", str(tmp_path / "bench.png"), "--no-progress", "--timeout", "240"]
    code = cli.main(argv)
    printed = capfd.readouterr().out
    assert code == 0, printed
    assert "# AllGather (all_gather)  in place" in printed
    assert "# ReduceScatter (reduce_scatter)  in place" in printed
    record = json.loads(out_json.read_text())
    assert record["settings"]["inplace"] is True
    _check_record(record)


def test_progress_bar_and_plot_are_optional(tmp_path, monkeypatch, capsys):
    """Without tqdm the tables print plainly; without matplotlib the plot is
    skipped (write_plot says so), and nothing else changes."""
    from smddp.bench import plot, sweep

    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert sweep._tqdm() is None
    s = sweep.Sweep.__new__(sweep.Sweep)
    s.rank = 0
    s.print("# a table line")
    assert capsys.readouterr().out == "# a table line\n"
    png = tmp_path / "bench.png"
    rec = {"status": "ok", "backend": "smddp", "op": "all_gather", "size_bytes": 4096,
           "busbw_gbs": 1.0}
    assert plot.busbw([rec], ("op",), str, str(png), "title") is False
    assert not png.exists()
