"""What the benchmarks print and what the docs show, from their records:
column specs for smddp.bench.table, summaries and footers, one set per kind
of record (sweep, peers, model, calibration, step). The same functions print
a run's tables and render the docs from the JSON kept in the repository
(``smddp-bench render``). Torch-free.
"""

from __future__ import annotations

import math
import shlex
import statistics
from typing import Any, Callable, Sequence

from smddp.bench import table
from smddp.bench.ops import OPS
from smddp.bench.record import measured
from smddp.bench.table import Column
from smddp.bench.units import format_size


def rivals(backends: Sequence[str]) -> list[tuple[str, str]]:
    """The (numerator, denominator) pairs of the ratio columns: the first
    backend against each of the others."""
    return [(backends[0], b) for b in backends[1:]]


def by_point(results: list[dict], keys: Sequence[str] = ("op", "dtype", "requested_bytes")) -> list[dict[str, dict]]:
    """The point records grouped by point, in order: each {backend: record}."""
    points: dict[tuple, dict[str, dict]] = {}
    for r in results:
        points.setdefault(tuple(r[k] for k in keys), {})[r["backend"]] = r
    return list(points.values())


def ratio(point: dict[str, dict], num: str, den: str) -> float | None:
    """num's busbw / den's at one point (None unless both were measured)."""
    a, b = point.get(num), point.get(den)
    if not (measured(a) and measured(b)) or b["busbw_gbs"] <= 0 or a["busbw_gbs"] <= 0:
        return None
    return a["busbw_gbs"] / b["busbw_gbs"]


def _geomean(values: list[float]) -> float | None:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else None


def _num(x: float | None, fmt: str = "{:.3f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _wrong_line(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    detail = ", ".join(f"{k} {n}" for k, n in counts.items() if n)
    return f"# #wrong: {total} " + ("OK" if total == 0 else f"FAILED ({detail})")


# -- the sweep ---------------------------------------------------------------------

_LEFT = [Column("size", "(B)", width=12), Column("count", "(elements)", width=12), Column("type", width=9),
         Column("redop", width=6)]  # fmt: skip
_BLOCK = [Column("time", "(µs)", "{:.1f}", 10), Column("algbw", "(GB/s)", "{:.3f}", 8),
          Column("busbw", "(GB/s)", "{:.3f}", 8), Column("#wrong", width=7)]  # fmt: skip
# On a cluster: the links' limit of each point, and each backend's fraction of it.
_LIMIT, _OF_LIMIT = Column("limit", "(µs)", "{:.1f}", 10), Column("%limit", width=6)


def fraction(limit: float | None, rec: dict[str, Any] | None) -> float | None:
    """limit / measured time: the share of the links' capacity a backend used."""
    if limit is None or not measured(rec) or rec["time_us"] <= 0:
        return None
    return limit / (rec["time_us"] * 1e-6)


class SweepView:
    """The sweep's text tables, printed as it measures (smddp.bench.sweep calls
    ``sweep_header``, ``sweep_row`` and ``sweep_footer``). A view that is
    ``limited`` (smddp.bench.links.LinksView, on a cluster) adds the links'
    limit of each point, ``limit_s``, and each backend's fraction of it."""

    limited = False

    def limit_s(self, first: dict[str, Any]) -> float | None:
        return None

    def columns(self, backends: Sequence[str]) -> tuple[list[Column], list[tuple[str, int]]]:
        ratios = [Column("ratio", f"{a}/{b}", "{:.2f}", max(11, len(a + b) + 1)) for a, b in rivals(backends)]
        left, block = (_LEFT + [_LIMIT], _BLOCK[:3] + [_OF_LIMIT, _BLOCK[3]]) if self.limited else (_LEFT, _BLOCK)
        return table.grouped(("", left), *((b, block) for b in backends), ("", ratios))

    def sweep_header(self, op: str, dtype: str, redop: str, backends: Sequence[str], topology: str,
                     device: str, inplace: bool = False) -> str:  # fmt: skip
        place = "  in place" if inplace and op in ("all_gather", "reduce_scatter") else ""
        title = f"# {OPS[op].title} ({op}){place}  type {dtype}  redop {redop}  |  {topology}  |  {device}"
        return "\n".join(["#", title, "#", table.header(*self.columns(backends))])

    def sweep_row(self, recs: list[dict], backends: Sequence[str]) -> str:
        point, first = {r["backend"]: r for r in recs}, recs[0]
        limit = self.limit_s(first)
        values: list[Any] = [first["size_bytes"], first["count"], first["dtype"], first["redop"]]
        values += [None if limit is None else limit * 1e6] if self.limited else []
        for r in (point.get(b) for b in backends):
            cells = ([r["time_us"], r["algbw_gbs"], r["busbw_gbs"], _num(fraction(limit, r), "{:.0%}"), r["wrong"]]
                     if measured(r) else ["n/a", "", "", "", ""])  # fmt: skip
            values += cells if self.limited else cells[:3] + cells[4:]  # no %limit cell
        values += [_num(ratio(point, a, b), "{:.2f}") for a, b in rivals(backends)]
        cols, groups = self.columns(backends)
        return table.row(cols, values, groups)

    def sweep_footer(self, results: list[dict], backends: Sequence[str]) -> str:
        return sweep_footer(results, backends)


def _table_summary(results: list[dict], backends: Sequence[str]) -> dict[str, Any]:
    """Average busbw per backend (nccl-tests' footer), the ratios, #wrong."""
    points = by_point(results)
    out: dict[str, Any] = {k: {} for k in ("avg_busbw_gbs", "ratio_of_avg_busbw", "geomean_ratio", "wrong", "errors")}
    for b in backends:
        good = [p[b] for p in points if measured(p.get(b))]
        out["avg_busbw_gbs"][b] = statistics.fmean(r["busbw_gbs"] for r in good) if good else None
        out["wrong"][b] = sum(r["wrong"] for r in good)
        bad = [p[b]["note"] for p in points if b in p and not measured(p[b])]
        if bad:
            out["errors"][b] = bad[0]
    for a, b in rivals(backends):
        common = [p for p in points if ratio(p, a, b) is not None]
        avg = [statistics.fmean(p[x]["busbw_gbs"] for p in common) for x in (a, b)] if common else 0
        out["ratio_of_avg_busbw"][f"{a}/{b}"] = avg[0] / avg[1] if common else None
        out["geomean_ratio"][f"{a}/{b}"] = _geomean([ratio(p, a, b) for p in common])
    return out


def sweep_summary(results: list[dict], backends: Sequence[str]) -> dict[str, Any]:
    tables = []
    for key in dict.fromkeys((r["op"], r["dtype"], r["redop"]) for r in results):
        sub = [r for r in results if (r["op"], r["dtype"], r["redop"]) == key]
        tables.append(dict(zip(("op", "dtype", "redop"), key), **_table_summary(sub, backends)))
    wrong = sum(r["wrong"] for r in results if measured(r))
    return {"wrong": wrong, "tables": tables}


def sweep_footer(results: list[dict], backends: Sequence[str]) -> str:
    s = _table_summary(results, backends)
    lines = ["# avg busbw (GB/s): " + "  ".join(f"{b} {_num(s['avg_busbw_gbs'][b])}" for b in backends)]
    for key in s["ratio_of_avg_busbw"]:
        lines.append(f"# {key}: {_num(s['ratio_of_avg_busbw'][key], '{:.2f}')} (ratio of the averages), "
                     f"{_num(s['geomean_ratio'][key], '{:.2f}')} (geometric mean of the per-size ratios)")
    lines.append(_wrong_line(s["wrong"]))
    lines += [f"# {b}: not measured: {why}" for b, why in s["errors"].items()]
    return "\n".join(lines)


def run_footer(rec: dict[str, Any]) -> str:
    backends = rec["settings"]["backends"]
    points = len(by_point(rec["results"]))
    wrong = rec["summary"]["wrong"]
    lines = ["#", f"# smddp-bench: {points} points x {len(backends)} backends ({', '.join(backends)}) in "
             f"{rec['elapsed_s']:.1f} s; #wrong {wrong} {'OK' if wrong == 0 else 'FAILED'}",
             f"# {rec['timing']['description']}"]
    m = rec["machine"]
    loads = [x[0] for x in (m["load_average"]["start"], m["load_average"].get("end")) if x]
    cores = m.get("cpu_cores_available") or m.get("cpu_cores") or 1
    # The ranks themselves keep up to world-size cores busy.
    if loads and max(loads) > max(cores, rec["topology"]["world"]) + 1:
        lines.append(f"# note: load average up to {max(loads):.1f} on {cores} cores: other "
                     "processes competed with the ranks, so the timings are noisy")  # fmt: skip
    return "\n".join(lines)


def size_text(actual: int | None, asked: int | None) -> str:
    """A point's size as the tables show it: the bytes moved, in whole units
    where they are, else as bytes with the size asked for (a size is rounded
    down to a multiple of the ranks' elements)."""
    if actual is None:
        return format_size(asked or 0)
    text = format_size(actual)
    if asked and actual != asked and text == str(actual):
        return f"{text} (of {format_size(asked)})"
    return text


def sweep_table(rec: dict[str, Any], limit_s: Callable[[dict], float | None] | None = None) -> str:
    """A sweep's markdown table; with ``limit_s`` (on a cluster,
    smddp.bench.links) the links' limit of each point and each backend's
    fraction of it."""
    backends, limited = rec["settings"]["backends"], limit_s is not None
    pairs = rivals(backends)
    left = [Column("op", left=True), Column("type", left=True), Column("size")]
    block = [Column("time", "µs", "{:.1f}"), Column("busbw", "GB/s", "{:.3f}")]
    if limited:
        left, block = left + [Column("limit", "µs", "{:.1f}")], block + [Column("of limit")]
    cols, groups = table.grouped(("", left), *((b, block) for b in backends),
                                 ("busbw", [Column(f"{a}/{b}", fmt="{:.2f}") for a, b in pairs]))  # fmt: skip
    rows = []
    for point in by_point(rec["results"]):
        first = next(iter(point.values()))
        limit = limit_s(first) if limited else None
        row: list[Any] = [OPS[first["op"]].title, first["dtype"], size_text(first["size_bytes"], first["requested_bytes"])]
        row += ["n/a" if limit is None else limit * 1e6] if limited else []
        for r in (point.get(b) for b in backends):
            cells = [r["time_us"], r["busbw_gbs"], _num(fraction(limit, r), "{:.0%}")] if measured(r) else ["n/a"] * 3
            row += cells if limited else cells[:2]  # no "of limit" cell
        rows.append(row + [_num(ratio(point, a, b), "{:.2f}") for a, b in pairs])
    return table.markdown(cols, rows, groups)


def _blank(x: Any) -> Any:
    return "" if x is None else x


def floor_table(floor: list[dict], backends: Sequence[str]) -> str:
    """The floor of each point (the same copies done by one process) and
    each backend's time as a multiple of it."""
    cols = [Column("op", left=True), Column("size", "(B)"), Column("floor", "(µs)", "{:.1f}")]
    cols += [Column(f"{b} / floor", fmt="{:.2f}") for b in backends]
    rows = [[f["op"], format_size(f["size_bytes"]), f["floor_us"],
             *[_blank(f["time_over_floor"].get(b)) for b in backends]] for f in floor]  # fmt: skip
    return table.markdown(cols, rows)


def sweep_markdown(rec: dict[str, Any]) -> tuple[str, str]:
    place = "; AllGather/ReduceScatter in place" if rec["settings"].get("inplace") else ""
    text = sweep_table(rec)
    floor = ""
    if rec.get("floor"):
        text += "\n\n" + floor_table(rec["floor"], rec["settings"]["backends"])
        floor = ("; floor: the same bytes copied by one process on the same device (what the ranks' contexts "
                 "taking turns on one GPU cost shows as the multiple over it)")
    return text, (
        f"{rec['topology']['label']}, {rec['machine']['device']}{place}; busbw in GB/s (nccl-tests' definitions, "
        f"GB = 1e9); ratios of busbw; #wrong {rec['summary']['wrong']}{floor}")


# -- the GPU benchmarks (bench/gpu_kernels.py, bench/gpu_latency.py) ---------------------


def gpu_kernels_markdown(rec: dict[str, Any]) -> tuple[str, str]:
    """One row per dtype, size and offset: the copy's bandwidth, then the
    kernel's share of it at each block count."""
    results = rec["results"]
    blocks = sorted({r["blocks"] for r in results})
    rows: dict[tuple, list] = {}
    for r in results:
        key = (r["dtype"], r["bytes"], r["offset"])
        row = rows.setdefault(key, [r["dtype"], format_size(r["bytes"]), r["offset"], r["copy_gbps"]] + [""] * len(blocks))
        row[4 + blocks.index(r["blocks"])] = f"{r['reduce_gbps']:.0f} ({100 * r['ratio']:.0f} %)"
    cols = [Column("dtype", left=True), Column("size", "(B)"), Column("offset"), Column("copy", "(GB/s)", "{:.0f}")]
    cols += [Column(f"{b} blocks", "(GB/s)") for b in blocks]
    return table.markdown(cols, list(rows.values())), (
        f"{rec['device']}: smddp's reduction of two sources into a third (reads 2n, writes n) against torch's "
        "device-to-device copy of n (reads n, writes n), as bytes moved per second, and the share of the copy's "
        "rate (SMDDP_CUDA_REDUCE_BLOCKS is the block count; offset 1: every buffer one element off 16-byte "
        "alignment, as AllReduce slices of an odd count per rank are)")


def _latency_checked(r: dict[str, Any]) -> str:
    """A latency row's verdict: its result checked, wrong, or no result."""
    return "ok" if r["ok"] else f"failed: {r['error']}" if r.get("error") else "WRONG"


def gpu_latency_markdown(rec: dict[str, Any]) -> tuple[str, str]:
    s = rec["settings"]
    # Records before the host's time was measured have no such column.
    host = all("host_us" in r for r in rec["results"])
    batch = any("batch" in r["mode"].split("+") for r in rec["results"])
    cols = [Column("synchronization", left=True), Column("latency", "(µs)", "{:.1f}")]
    cols += [Column("host in the call", "(µs)", "{:.1f}")] if host else []
    rows = [[r["mode"], r["latency_us"]] + ([r["host_us"]] if host else []) + [_latency_checked(r)]
            for r in rec["results"]]  # fmt: skip
    legend = (
        f"{rec['device']}: a native {s['bytes']} AllReduce of {s['nproc']} ranks sharing the GPU; host: the ranks' "
        "host threads meet between steps; device: kernels await flags (SMDDP_CUDA_SYNC=device); memops: the "
        "streams' own memory operations await them (SMDDP_CUDA_SYNC=memops); ")
    if batch:
        legend += "batch: each step's memory operations in one driver call (SMDDP_CUDA_BATCH_MEMOPS); "
    legend += "graph: replayed from a CUDA graph of 10 calls; oneshot: one step (SMDDP_CUDA_ONESHOT_BYTES)"
    if host:
        legend += "; host in the call: until the call returned on the host (the work enqueued, the host rounds met)"
    legend += ". The ranks' contexts take turns on the one GPU, so these include its time slicing, not NVLink"
    return table.markdown(cols + [Column("checked", left=True)], rows), legend


# -- the peer comparison -----------------------------------------------------------

PEERS_LEGEND = (
    "busbw in GB/s (1e9 B/s), nccl-tests' definition; flags: * fewer than --min-iters calls (--point-cap); ~ one "
    "call only (it exceeded --point-cap); u MPI bfloat16 reduction through a user-defined MPI_Op (numpy); ! wrong "
    "results; n/a: not offered; skip: a smaller size of the same table was too slow or failed; absent: not installed"
)
_CELL_STATUS = {"n/a": "n/a", "skipped": "skip", "timeout": "timeout", "absent": "absent"}


def peer_cell(rec: dict[str, Any] | None) -> str:
    """One implementation's busbw at one point, with its flags (PEERS_LEGEND)."""
    if rec is None:
        return ""
    if not measured(rec):
        return _CELL_STATUS.get(rec["status"], "error")
    flags = rec.get("flags", "") + {"ok": "", "few": "*", "slow": "~"}[rec["status"]]
    return f"{rec['busbw_gbs']:.3f}{flags}{'!' if rec.get('wrong') else ''}"


def _usable(rec: dict[str, Any] | None) -> bool:
    return measured(rec) and not rec.get("wrong")


def peer_rows(results: list[dict], impls: Sequence[str], ops: Sequence[str], dtypes: Sequence[str]) -> list[dict]:
    """One row per (op, dtype, ranks, size): every implementation's record, the
    best peer and smddp's ratio to it."""
    order = lambda r: (ops.index(r["op"]), dtypes.index(r["dtype"]), r["world"], r["requested_bytes"])  # noqa: E731
    rows = []
    for point in by_point(sorted(results, key=order), ("op", "dtype", "world", "requested_bytes")):
        first = next(iter(point.values()))
        peers = [(r["busbw_gbs"], n) for n, r in point.items() if n != "smddp" and n in impls and _usable(r)]
        best = max(peers) if peers else (None, None)
        mine = point.get("smddp")
        rows.append({k: first[k] for k in ("op", "dtype", "world", "requested_bytes", "size_bytes")}
                    | {"impls": point, "best_peer": best[1], "best_peer_busbw_gbs": best[0],
                       "smddp_busbw_gbs": mine["busbw_gbs"] if _usable(mine) else None,
                       "smddp_over_best": mine["busbw_gbs"] / best[0] if best[0] and _usable(mine) else None})
    return rows


def _peer_table(rec: dict[str, Any]) -> tuple[list[Column], list]:
    s = rec["settings"]
    impls, with_ratio = s["impls"], "smddp" in s["impls"] and len(s["impls"]) > 1
    cols = [Column("op", width=14, left=True), Column("type", width=9, left=True), Column("size", width=5),
            Column("ranks", width=5)]  # fmt: skip
    cols += [Column(n, width=10) for n in impls]
    cols += [Column("smddp/best", fmt="{:.2f}", width=10), Column("best", width=9, left=True)] if with_ratio else []
    out: list[Any] = []
    last = None
    for row in peer_rows(rec["results"], impls, s["ops"], s["dtypes"]):
        if out and (row["op"], row["dtype"], row["world"]) != last:
            out.append(None)  # a blank line between the (op, dtype, ranks) blocks
        last = (row["op"], row["dtype"], row["world"])
        size = size_text(row["size_bytes"], row["requested_bytes"])
        values = [OPS[row["op"]].title, row["dtype"], size, row["world"]]
        values += [peer_cell(row["impls"].get(n)) for n in impls]
        if with_ratio:
            values += [_num(row["smddp_over_best"], "{:.2f}"), row["best_peer"] or ""]
        out.append(values)
    return cols, out


def peer_summary(rows: list[dict], results: list[dict]) -> dict[str, Any]:
    """Per table the geometric mean of smddp/best; the cells where a peer wins;
    #wrong and failures per implementation."""
    tables: dict[str, list[float]] = {}
    for row in rows:
        if row["smddp_over_best"] is not None:
            tables.setdefault(f"{row['op']} {row['dtype']}", []).append(row["smddp_over_best"])
    keys = ("op", "dtype", "world", "size_bytes", "smddp_busbw_gbs", "best_peer", "best_peer_busbw_gbs")
    behind = [{k: r[k] for k in keys} | {"ratio": r["smddp_over_best"]} for r in rows
              if r["smddp_over_best"] is not None and r["smddp_over_best"] < 1.0]  # fmt: skip
    wrong: dict[str, int] = {}
    failures = []
    for rec in results:
        if measured(rec):
            wrong[rec["backend"]] = wrong.get(rec["backend"], 0) + int(rec.get("wrong") or 0)
        elif rec["status"] in ("timeout", "error", "absent"):
            keys = ("backend", "world", "op", "dtype", "requested_bytes", "status", "note")
            failures.append({k: rec.get(k) for k in keys})
    return {"geomean_smddp_over_best": {k: _geomean(v) for k, v in tables.items()},
            "smddp_behind": behind, "wrong": wrong, "failures": failures}  # fmt: skip


def peers_text(rec: dict[str, Any], header: str = "") -> str:
    lines = [header.rstrip()] if header else []
    lines += ["# " + PEERS_LEGEND, "#", table.text(*_peer_table(rec)), "#"]
    summary = rec["summary"]
    for key, g in summary["geomean_smddp_over_best"].items():
        op, dtype = key.split()
        lines.append(f"# {OPS[op].title} {dtype}: smddp/best, geometric mean over the cells: {g:.2f}")
    if summary["smddp_behind"]:
        lines.append(f"# smddp behind the best peer in {len(summary['smddp_behind'])} cells:")
    for b in summary["smddp_behind"]:
        lines.append(f"#   {OPS[b['op']].title} {b['dtype']} {format_size(b['size_bytes'])} {b['world']} ranks: "
                     f"smddp {b['smddp_busbw_gbs']:.3f} vs {b['best_peer']} {b['best_peer_busbw_gbs']:.3f} GB/s "
                     f"({b['ratio']:.2f}x)")
    lines.append(_wrong_line(summary["wrong"]))
    failures = {(f["backend"], f["status"], f["note"]): None for f in summary["failures"]}
    lines += [f"# {backend} ({status}): {note}" for backend, status, note in failures]
    lines.append(f"# {rec['timing']['description']}")
    return "\n".join(lines)


def peers_markdown(rec: dict[str, Any]) -> tuple[str, str]:
    versions = "; ".join(f"{n} {' '.join(str(v).split())}" for n, v in rec["versions"].items())
    return table.markdown(*_peer_table(rec)), f"{PEERS_LEGEND}; {versions}"


# -- the cost model, the calibration, the step --------------------------------------


_MODEL_RATIO = "ratio = flat-ring time / smddp time (= smddp busbw / flat-ring busbw)"


def model_table(estimates: list[dict], markdown: bool = False) -> str:
    block = [Column("time", "(µs)", "{:.1f}", 11), Column("busbw", "(GB/s)", "{:.2f}", 8)]
    left = [Column("op", width=15, left=True), Column("nodes", width=6), Column("GPUs", width=6),
            Column("size", "(B)", width=7)]  # fmt: skip
    cols, groups = table.grouped(("", left), ("flat ring", block), ("smddp", block),
                                 ("", [Column("ratio", fmt="{:.2f}", width=6)]))  # fmt: skip
    rows = [[e["op"], e["nodes"], e["gpus"], format_size(e["size_bytes"]), e["ring_s"] * 1e6, e["ring_busbw_gbs"],
             e["hier_s"] * 1e6, e["hier_busbw_gbs"], e["ratio"]] for e in estimates]  # fmt: skip
    if markdown:
        return table.markdown(cols, rows, groups)
    return f"{table.text(cols, rows, groups)}\n# {_MODEL_RATIO}"


def model_markdown(rec: dict[str, Any]) -> tuple[str, str]:
    smddp = f"; smddp: {rec['schedule']}" if rec.get("schedule") else ""
    caption = f"cost model, preset {rec['preset']}: {rec['constants']['name']}{smddp}; {_MODEL_RATIO}"
    return model_table(rec["results"], markdown=True), caption


def fit_table(fits: dict[str, dict], what: str, markdown: bool = False) -> str:
    """The alpha-beta fits of a calibration, one row per transport."""
    rows = [[f["label"], f["alpha_s"] * 1e6, (f["beta_bytes_per_s"] or math.inf) / 1e9, f["worst_error"] * 100]
            for f in fits.values()]  # fmt: skip
    cols = [Column(what, left=True), Column("alpha", "(µs)", "{:.1f}"), Column("beta", "(GB/s)", "{:.3f}"),
            Column("worst fit error", "(%)", "{:.0f}")]  # fmt: skip
    return (table.markdown if markdown else table.text)(cols, rows)


def calibration_tables(rec: dict[str, Any], markdown: bool = False) -> str:
    render = table.markdown if markdown else table.text
    cols = [Column("op", left=True), Column("size", "(B)"), Column("measured", "(µs)", "{:.1f}"),
            Column("smddp model", "(µs)", "{:.1f}"), Column("error", "(%)", "{:+.0f}"),
            Column("flat ring model", "(µs)", "{:.1f}")]  # fmt: skip
    rows = [[r["op"], format_size(r["size_bytes"]), r["measured_s"] * 1e6, r["model_smddp_s"] * 1e6,
             (r["model_smddp_s"] / r["measured_s"] - 1) * 100, r["model_ring_s"] * 1e6] for r in rec["results"]]
    return fit_table(rec["fits"], "transport", markdown) + "\n\n" + render(cols, rows)


def calibration_markdown(rec: dict[str, Any]) -> tuple[str, str]:
    return calibration_tables(rec, markdown=True), (
        "fit of time = alpha + bytes/beta of an AllGather between two ranks (one step of size/2 bytes); error = "
        "(model - measured) / measured")


def step_table(rec: dict[str, Any], markdown: bool = False) -> str:
    res = rec["results"]
    fake, ref = res.get("fake"), res.get("smddp")
    cols = [Column("backend", width=8, left=True), Column("step", "(s)", "{:.3f}", 9),
            Column("min", "(s)", "{:.3f}", 8), Column("comm wait", "(s)", "{:.3f}", 10),
            Column("preempted", "(s)", "{:.3f}", 10), Column("vs fake", width=8), Column("x smddp", width=8),
            Column("final loss", width=11)]  # fmt: skip
    rows = []
    for b, r in res.items():
        over = f"{r['overhead_vs_fake']:+.1%}" if r["overhead_vs_fake"] is not None else "-"
        loss = f"{r['final_loss']:.6f}" if r["final_loss"] is not None and b != "fake" else "-"
        rows.append([b, r["median_s"], min(r["step_s"]), r["median_comm_wait_s"], r["median_preempted_s"], over,
                     f"{r['median_s'] / ref['median_s']:.2f}" if ref else "-", loss])  # fmt: skip
    out = table.markdown(cols, rows) if markdown else table.text(cols, rows)
    if ref and fake and "gloo" in res and not markdown:
        g = res["gloo"]
        out += (f"\n# communication cost per step: smddp {ref['median_s'] - fake['median_s']:+.3f} s, gloo "
                f"{g['median_s'] - fake['median_s']:+.3f} s; smddp is {g['median_s'] / ref['median_s']:.2f}x as fast "
                "as gloo")
    return out


def step_markdown(rec: dict[str, Any]) -> tuple[str, str]:
    s = rec["settings"]
    return step_table(rec, markdown=True), (
        f"{s['strategy']} step, {s['world']} ranks, {s['preset']} ({s['num_params'] / 1e6:.2f} M parameters), "
        f"{s['tokens']} tokens per rank; median of {s['steps']} interleaved steps after warm-up; step = slowest "
        "rank; vs fake = the step's overhead over torch's fake backend, whose collectives do nothing")


# -- the docs: a record's table and its footer ---------------------------------------

# kind -> the markdown table of a record and the sentence that says what it shows.
MARKDOWN: dict[str, Callable[[dict[str, Any]], tuple[str, str]]] = {
    "sweep": sweep_markdown, "peers": peers_markdown, "model": model_markdown,
    "calibration": calibration_markdown, "step": step_markdown,
    "gpu-kernels": gpu_kernels_markdown, "gpu-latency": gpu_latency_markdown,
}  # fmt: skip


def markdown(rec: dict[str, Any],
             view: Callable[[dict[str, Any]], tuple[str, str]] | None = None) -> str:  # fmt: skip
    """A record's table for the docs, with what it shows, how the calls were
    timed, the machine and the command that produced the record; ``view``:
    the table and sentence of a record another module knows (the cluster's,
    smddp.bench.links.markdown_view), instead of its kind's."""
    view = view or MARKDOWN.get(rec["kind"])
    if view is None:
        raise ValueError(f"no table for records of kind {rec['kind']!r}")
    text, what = view(rec)
    m = rec["machine"]
    load = m.get("load_average", {})
    gpus = f", {' + '.join(m['gpus'])}" if m.get("gpus") else ""
    machine = (f"{m['cpu_model']}, {m['cpu_cores']} cores ({m['cpu_cores_available']} available), {m['memory_gb']} "
               f"GB, {m['kernel']}{gpus}, Python {m['python']}, torch {m['torch']}, smddp {m['smddp']}; load average "
               f"{load.get('start')} at the start, {load.get('end')} at the end; {rec['created']}")
    lines = [text, "", f"- {what}"]
    if "timing" in rec:
        lines.append(f"- {rec['timing']['description']}")
    lines += [f"- machine: {machine}", f"- command: `{shlex.join(rec['command'])}`"]
    return "\n".join(lines)
