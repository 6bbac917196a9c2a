"""What smddp-bench shows and keeps: nccl-tests-style tables, the JSON record
and the plot. Plain functions of the result rows, so they can be reused on a
saved JSON file."""

from __future__ import annotations

import datetime
import math
import os
import platform
import socket
import statistics
import sys
from typing import Any

from smddp.bench import ops as _ops
from smddp.bench.units import format_size

SCHEMA = "smddp-bench/1"

_LEFT = (12, 12, 9, 6)  # size, count, type, redop
_COLS = (10, 8, 8, 7)  # time, algbw, busbw, #wrong
_BLOCK = sum(_COLS) + len(_COLS) - 1
_RATIO = 11


def rivals(backends: tuple[str, ...] | list[str]) -> list[tuple[str, str]]:
    """The (numerator, denominator) pairs of the ratio columns: the first
    backend against each of the others."""
    return [(backends[0], b) for b in backends[1:]]


def _left(size: Any, count: Any, dtype: Any, redop: Any) -> str:
    w = _LEFT
    return f"{size:>{w[0]}} {count:>{w[1]}} {dtype:>{w[2]}} {redop:>{w[3]}}"


def _block(time: Any, algbw: Any, busbw: Any, wrong: Any) -> str:
    w = _COLS
    return f"  {time:>{w[0]}} {algbw:>{w[1]}} {busbw:>{w[2]}} {wrong:>{w[3]}}"


def table_header(
    op: str,
    dtype: str,
    redop: str,
    backends: tuple[str, ...],
    topology: Any,
    device: str,
    inplace: bool = False,
) -> str:
    left_width = len(_left("", "", "", ""))
    title = _ops.OPS[op].title
    place = "  in place" if inplace and op in ("all_gather", "reduce_scatter") else ""
    lines = [
        "#",
        f"# {title} ({op}){place}  type {dtype}  redop {redop}  |  {topology.label()}  |  {device}",
        "#",
        "#" + " " * (left_width - 1) + "".join("  " + b.center(_BLOCK) for b in backends),
        "#"
        + _left("size", "count", "type", "redop")[1:]
        + "".join(_block("time", "algbw", "busbw", "#wrong") for _ in backends)
        + "".join(f" {'ratio':>{_RATIO}}" for _ in rivals(backends)),
        "#"
        + _left("(B)", "(elements)", "", "")[1:]
        + "".join(_block("(us)", "(GB/s)", "(GB/s)", "") for _ in backends)
        + "".join(f" {a + '/' + b:>{_RATIO}}" for a, b in rivals(backends)),
    ]
    return "\n".join(lines)


def _ok(rec: dict[str, Any] | None) -> bool:
    return bool(rec) and not rec.get("error") and "busbw_gbs" in rec


def point_ratio(row: dict[str, Any], num: str, den: str) -> float | None:
    """smddp busbw / rival busbw at one point (None if either did not run)."""
    a, b = row["backends"].get(num), row["backends"].get(den)
    if not (_ok(a) and _ok(b)) or b["busbw_gbs"] <= 0:
        return None
    return a["busbw_gbs"] / b["busbw_gbs"] if a["busbw_gbs"] > 0 else None


def table_row(row: dict[str, Any], backends: tuple[str, ...]) -> str:
    out = _left(row["size_bytes"], row["count"], row["dtype"], row["redop"])
    for b in backends:
        rec = row["backends"].get(b)
        if _ok(rec):
            out += _block(
                f"{rec['time_us']:.1f}",
                f"{rec['algbw_gbs']:.3f}",
                f"{rec['busbw_gbs']:.3f}",
                rec["wrong"],
            )
        else:
            out += _block("n/a", "", "", "")
    for num, den in rivals(backends):
        ratio = point_ratio(row, num, den)
        out += f" {('%.2f' % ratio) if ratio is not None else 'n/a':>{_RATIO}}"
    return out


def table_summary(rows: list[dict[str, Any]], backends: tuple[str, ...]) -> dict[str, Any]:
    """Average busbw per backend (nccl-tests' footer), the ratios, #wrong."""
    avg: dict[str, float | None] = {}
    wrong: dict[str, int] = {}
    errors: dict[str, str] = {}
    for b in backends:
        recs = [r["backends"][b] for r in rows if b in r["backends"]]
        good = [r for r in recs if _ok(r)]
        avg[b] = statistics.fmean(r["busbw_gbs"] for r in good) if good else None
        wrong[b] = sum(r["wrong"] for r in good)
        bad = [r["error"] for r in recs if r.get("error")]
        if bad:
            errors[b] = bad[0]
    ratio_of_avg: dict[str, float | None] = {}
    geomean: dict[str, float | None] = {}
    for num, den in rivals(backends):
        key = f"{num}/{den}"
        common = [r for r in rows if point_ratio(r, num, den) is not None]
        if common:
            a = statistics.fmean(r["backends"][num]["busbw_gbs"] for r in common)
            d = statistics.fmean(r["backends"][den]["busbw_gbs"] for r in common)
            ratio_of_avg[key] = a / d if d > 0 else None
            geomean[key] = math.exp(
                statistics.fmean(math.log(point_ratio(r, num, den)) for r in common)
            )
        else:
            ratio_of_avg[key] = geomean[key] = None
    return {
        "avg_busbw_gbs": avg,
        "ratio_of_avg_busbw": ratio_of_avg,
        "geomean_ratio": geomean,
        "wrong": wrong,
        "errors": errors,
    }


def _num(x: float | None, fmt: str = "%.3f") -> str:
    return "n/a" if x is None else fmt % x


def table_footer(rows: list[dict[str, Any]], backends: tuple[str, ...]) -> str:
    s = table_summary(rows, backends)
    lines = [
        "# avg busbw (GB/s): " + "  ".join(f"{b} {_num(s['avg_busbw_gbs'][b])}" for b in backends)
    ]
    for key in s["ratio_of_avg_busbw"]:
        lines.append(
            f"# {key}: {_num(s['ratio_of_avg_busbw'][key], '%.2f')} (ratio of the averages), "
            f"{_num(s['geomean_ratio'][key], '%.2f')} (geometric mean of the per-size ratios)"
        )
    total = sum(s["wrong"].values())
    detail = ", ".join(f"{b} {n}" for b, n in s["wrong"].items() if n)
    lines.append(f"# #wrong: {total} " + ("OK" if total == 0 else f"FAILED ({detail})"))
    for b, why in s["errors"].items():
        lines.append(f"# {b}: not measured: {why}")
    return "\n".join(lines)


def run_footer(record: dict[str, Any]) -> str:
    points = len({(r["op"], r["dtype"], r["size_bytes"]) for r in record["results"]})
    wrong = record["summary"]["wrong"]
    text = (
        "#\n"
        f"# smddp-bench: {points} points x {len(record['settings']['backends'])} backends "
        f"({', '.join(record['settings']['backends'])}) in {record['elapsed_s']:.1f} s; "
        f"#wrong {wrong} {'OK' if wrong == 0 else 'FAILED'}"
    )
    machine = record["machine"]
    loads = [x[0] for x in (machine["load_average"]["start"], machine["load_average"]["end"]) if x]
    cores = machine.get("cpu_cores_available") or machine.get("cpu_cores") or 1
    # The ranks themselves keep up to world-size cores busy.
    if loads and max(loads) > max(cores, record["topology"]["world"]) + 1:
        text += (
            f"\n# note: load average up to {max(loads):.1f} on {cores} cores: other processes "
            "competed with the ranks, so the timings are noisy"
        )
    return text


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gb() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) * 1024 / 1e9, 1)
    except (OSError, ValueError):
        pass
    return None


def machine_info(device: str) -> dict[str, Any]:
    """The host and the software versions, for the JSON record."""
    import numpy
    import torch

    import smddp

    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:
        available = os.cpu_count()
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "cpu_cores_available": available,
        "memory_gb": _memory_gb(),
        "platform": platform.platform(),
        "device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "smddp": getattr(smddp, "__version__", "unknown"),
        "numpy": numpy.__version__,
        "gpus": [],
    }
    if device == "cuda":
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def smddp_config() -> dict[str, str]:
    """Every SMDDP_* knob as the ranks saw it (defaults included)."""
    from smddp import config

    values = config.current()
    for k, v in os.environ.items():
        if k.startswith("SMDDP_") and k not in values:
            values[k] = v
    return dict(sorted(values.items()))


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def build_record(
    settings: Any,
    topology: Any,
    device: str,
    rows: list[dict[str, Any]],
    started: float,
    elapsed: float,
    load_start: list[float] | None = None,
) -> dict[str, Any]:
    backends = tuple(settings.backends)
    results = []
    for row in rows:
        for b in backends:
            rec = dict(row["backends"][b])
            base = {
                k: row[k]
                for k in ("op", "dtype", "redop", "requested_bytes", "size_bytes", "count", "world")
            }
            results.append({**base, **rec})
    ratios = []
    for row in rows:
        for num, den in rivals(backends):
            ratios.append(
                {
                    "op": row["op"],
                    "dtype": row["dtype"],
                    "size_bytes": row["size_bytes"],
                    "numerator": num,
                    "denominator": den,
                    "busbw_ratio": point_ratio(row, num, den),
                }
            )
    tables = []
    for op in settings.ops:
        for dtype in settings.dtypes:
            sub = [r for r in rows if r["op"] == op and r["dtype"] == dtype]
            if sub:
                tables.append(
                    {
                        "op": op,
                        "dtype": dtype,
                        "redop": sub[0]["redop"],
                        **table_summary(sub, backends),
                    }
                )
    wrong = sum(r.get("wrong", 0) for r in results if not r.get("error"))
    return {
        "schema": SCHEMA,
        "created": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "command": list(settings.argv),
        "elapsed_s": elapsed,
        "machine": {
            **machine_info(device),
            "load_average": {"start": load_start, "end": load_average()},
        },
        "config": smddp_config(),
        "topology": {
            "world": topology.world,
            "nodes": topology.nodes,
            "ranks_per_node": topology.ranks_per_node,
            "emulated": topology.emulated,
            "hosts": topology.hosts,
            "launcher": settings.launcher,
            "label": topology.label(),
        },
        "settings": {
            k: (list(v) if isinstance(v, tuple) else v)
            for k, v in vars(settings).items()
            if k not in ("argv", "json_path", "plot_path", "progress", "launcher")
        },
        "results": results,
        "ratios": ratios,
        "summary": {"wrong": wrong, "tables": tables},
    }


def write_json(record: dict[str, Any], path: str) -> None:
    import json

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, allow_nan=False, default=str)
        f.write("\n")
    os.replace(tmp, path)


def write_plot(record: dict[str, Any], path: str) -> bool:
    """busbw against size, one panel per (op, dtype), one line per backend;
    False (and nothing written) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = record["settings"]["backends"]
    panels = [(t["op"], t["dtype"]) for t in record["summary"]["tables"]]
    if not panels:
        panels = [("none", "none")]
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.6 * ncols, 4.2 * nrows), squeeze=False)
    markers = "osD^v<>"
    for i, (op, dtype) in enumerate(panels):
        ax = axes[i // ncols][i % ncols]
        sizes: set[int] = set()
        for j, b in enumerate(backends):
            pts = sorted(
                (r["size_bytes"], r["busbw_gbs"])
                for r in record["results"]
                if r["op"] == op
                and r["dtype"] == dtype
                and r["backend"] == b
                and not r.get("error")
            )
            if pts:
                xs, ys = zip(*pts)
                sizes.update(xs)
                ax.plot(
                    xs, ys, marker=markers[j % len(markers)], linewidth=1.8, markersize=5, label=b
                )
        ax.set_xscale("log", base=2)
        ticks = sorted(sizes)
        if len(ticks) > 10:
            ticks = ticks[:: math.ceil(len(ticks) / 10)]
        ax.set_xticks(ticks)
        ax.set_xticklabels([format_size(t) for t in ticks], rotation=45 if len(ticks) > 6 else 0)
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.set_xlabel("size (bytes, nccl-tests definition)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        title = _ops.OPS[op].title if op in _ops.OPS else op
        ax.set_title(f"{title}, {dtype}")
        ax.grid(True, which="major", alpha=0.3)
        if ax.lines:
            ax.legend()
    for k in range(len(panels), nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    topo = record["topology"]["label"]
    machine = record["machine"]
    fig.suptitle(
        f"smddp-bench: {' vs '.join(backends)}, busbw (median)"
        f"{', AllGather/ReduceScatter in place' if record['settings'].get('inplace') else ''}\n"
        f"{topo}, {machine['device']}, {machine['hostname']}",
        fontsize=11,
    )
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def eprint(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)
