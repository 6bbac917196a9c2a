"""The links' limit on a cluster of shaped NICs, and the tables that show it.

On ``smddp-cluster up --hosts H --nics K --rate R`` a host receives at most
K x R bytes per second. A collective whose result every host needs must
bring each host the part of the data that other hosts hold, whatever the
schedule, so its time is at least

    limit = bytes each host must receive / (K x R)
          = (H-1)/H x size    AllGather, ReduceScatter (a host's share of
                              the reduction needs the other hosts' partials)
          = 2(H-1)/H x size   AllReduce (a ReduceScatter and an AllGather)
          = size              Broadcast (every host but the root's)

with ``size`` the nccl-tests size. The rate counts what the links carry
(Ethernet, IP and TCP headers included), so a schedule that keeps every link
busy reaches about 99 % of the limit at a 9000-byte MTU. The sweep's tables
on a cluster (``smddp-bench --cluster``) put the limit beside the sizes and
each backend's fraction of it beside its busbw. Torch-free.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from smddp.bench import table, views
from smddp.bench.ops import OPS
from smddp.bench.record import measured
from smddp.bench.table import Column
from smddp.bench.units import format_size

RULE = ("limit = bytes each host must receive / (NICs x rate): (H-1)/H x size for AllGather "
        "and ReduceScatter, 2(H-1)/H x size for AllReduce, size for Broadcast")  # fmt: skip


def received_bytes(op: str, size: int, hosts: int) -> float:
    """Bytes each host must receive for ``op`` on ``size`` bytes (nccl-tests size)."""
    if hosts < 2:
        return 0.0
    share = (hosts - 1) / hosts
    return {"all_gather": share, "reduce_scatter": share, "all_reduce": 2 * share,
            "broadcast": 1.0}[op] * size  # fmt: skip


def limit_s(op: str, size: int, hosts: int, nics: int, rate_bytes_per_s: float | None) -> float | None:
    """The least time the links allow (seconds); None for unshaped links or one host."""
    if not rate_bytes_per_s or hosts < 2 or nics < 1:
        return None
    return received_bytes(op, size, hosts) / (nics * rate_bytes_per_s)


def point_limit_s(facts: dict[str, Any], rec: dict[str, Any]) -> float | None:
    """The limit of a point record on the cluster ``facts`` describe."""
    size = rec.get("size_bytes")
    if not size:
        return None
    return limit_s(rec["op"], size, facts["hosts"], facts["nics"], facts.get("rate_bytes_per_s"))


def fraction(limit: float | None, rec: dict[str, Any] | None) -> float | None:
    """limit / measured time: the share of the links' capacity a backend used."""
    if limit is None or not measured(rec) or rec["time_us"] <= 0:
        return None
    return limit / (rec["time_us"] * 1e-6)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


# -- the text tables, printed as the sweep measures ---------------------------------

_LEFT = [Column("size", "(B)", width=12), Column("count", "(elements)", width=12),
         Column("type", width=9), Column("redop", width=6), Column("limit", "(us)", "{:.1f}", 10)]  # fmt: skip
_BLOCK = [Column("time", "(us)", "{:.1f}", 10), Column("algbw", "(GB/s)", "{:.3f}", 8),
          Column("busbw", "(GB/s)", "{:.3f}", 8), Column("%limit", width=6),
          Column("#wrong", width=7)]  # fmt: skip


def _columns(backends: Sequence[str]) -> tuple[list[Column], list[tuple[str, int]]]:
    ratios = [Column("ratio", f"{a}/{b}", "{:.2f}", max(11, len(a + b) + 1))
              for a, b in views.rivals(backends)]  # fmt: skip
    return table.grouped(("", _LEFT), *((b, _BLOCK) for b in backends), ("", ratios))


class LinksView:
    """The sweep's text tables with the links' limit (smddp.bench.sweep calls
    ``sweep_header``, ``sweep_row`` and ``sweep_footer`` as it measures); every
    row's limit and fractions also go to ``facts["limits"]``, for the record."""

    def __init__(self, facts: dict[str, Any]):
        self.facts = facts
        facts.setdefault("limits", [])

    def sweep_header(self, op: str, dtype: str, redop: str, backends: Sequence[str], topology: str,
                     device: str, inplace: bool = False) -> str:  # fmt: skip
        place = "  in place" if inplace and op in ("all_gather", "reduce_scatter") else ""
        title = (f"# {OPS[op].title} ({op}){place}  type {dtype}  redop {redop}  |  {topology}  |  "
                 f"{device}")  # fmt: skip
        return "\n".join(["#", title, "#", table.header(*_columns(backends))])

    def sweep_row(self, recs: list[dict], backends: Sequence[str]) -> str:
        point = {r["backend"]: r for r in recs}
        first = recs[0]
        limit = point_limit_s(self.facts, first)
        fractions = {b: fraction(limit, point.get(b)) for b in backends}
        self.facts["limits"].append({
            "op": first["op"], "dtype": first["dtype"], "size_bytes": first["size_bytes"],
            "limit_us": None if limit is None else limit * 1e6, "fraction": fractions,
        })  # fmt: skip
        values: list[Any] = [first["size_bytes"], first["count"], first["dtype"], first["redop"],
                             None if limit is None else limit * 1e6]  # fmt: skip
        for b in backends:
            r = point.get(b)
            values += ([r["time_us"], r["algbw_gbs"], r["busbw_gbs"], _pct(fractions[b]), str(r["wrong"])]
                       if measured(r) else ["n/a", "", "", "", ""])  # fmt: skip
        values += [_ratio(point, a, b) for a, b in views.rivals(backends)]
        cols, groups = _columns(backends)
        return table.row(cols, values, groups)

    def sweep_footer(self, results: list[dict], backends: Sequence[str]) -> str:
        return views.sweep_footer(results, backends)


def _ratio(point: dict[str, dict], a: str, b: str) -> str:
    x = views.ratio(point, a, b)
    return "n/a" if x is None else f"{x:.2f}"


# -- the markdown of a cluster sweep's record ---------------------------------------


def describe_cluster(facts: dict[str, Any]) -> str:
    """"2 hosts x 2 ranks, 2 NICs per host at 1gbit (125 MB/s) per direction, MTU 9000, TCP cubic"."""
    rate = facts.get("rate")
    speed = (f"at {rate} ({facts['rate_bytes_per_s'] / 1e6:.0f} MB/s) per direction" if rate
             else "unshaped")  # fmt: skip
    tcp = f", TCP {facts['tcp']}" if facts.get("tcp") else ""
    return (f"{facts['hosts']} hosts x {facts['ranks_per_host']} ranks, {facts['nics']} NICs per "
            f"host {speed}, MTU {facts.get('mtu')}{tcp}")  # fmt: skip


def rank_nics(facts: dict[str, Any]) -> str:
    """"rank 0 h0 nic0 (198.18.0.1), rank 1 h0 nic1 (198.18.1.1), ..."."""
    nics = facts.get("rank_nics") or []
    return ", ".join(f"rank {n['rank']} {n['host']} " + (f"{n['nic']} ({n['address']})" if n.get("nic")
                     else "(no smddp group)") for n in nics)  # fmt: skip


def sweep_markdown(rec: dict[str, Any]) -> tuple[str, str]:
    facts = rec["topology"]["facts"]
    backends = rec["settings"]["backends"]
    pairs = views.rivals(backends)
    block = [Column("time", "µs", "{:.1f}"), Column("busbw", "GB/s", "{:.3f}"), Column("of limit")]
    cols, groups = table.grouped(
        ("", [Column("op", left=True), Column("type", left=True), Column("size"),
              Column("limit", "µs", "{:.1f}")]),
        *((b, block) for b in backends), ("busbw", [Column(f"{a}/{b}", fmt="{:.2f}")
                                                    for a, b in pairs]))  # fmt: skip
    rows = []
    for point in views.by_point(rec["results"]):
        first = next(iter(point.values()))
        limit = point_limit_s(facts, first)
        row: list[Any] = [OPS[first["op"]].title, first["dtype"], format_size(first["size_bytes"]),
                          "n/a" if limit is None else limit * 1e6]  # fmt: skip
        for b in backends:
            r = point.get(b)
            row += ([r["time_us"], r["busbw_gbs"], _pct(fraction(limit, r))] if measured(r)
                    else ["n/a", "n/a", "n/a"])  # fmt: skip
        rows.append(row + [_ratio(point, a, b) for a, b in pairs])
    note = (f"{describe_cluster(facts)} (`smddp-cluster`, one torchrun per host); each rank's NIC: "
            f"{rank_nics(facts)}; {RULE}; of limit = limit / time; busbw in GB/s (nccl-tests' "
            f"definitions, GB = 1e9); ratios of busbw; #wrong {rec['summary']['wrong']}")  # fmt: skip
    return table.markdown(cols, rows, groups), note


def markdown_view(rec: dict[str, Any]) -> Callable[[dict[str, Any]], tuple[str, str]] | None:
    """The table and sentence of the records this module knows, for
    ``views.markdown`` (smddp-bench render); None for the others."""
    if rec.get("kind") == "sweep" and rec.get("topology", {}).get("launcher") == "smddp-cluster":
        return sweep_markdown
    if rec.get("kind") == "cluster-model":
        from smddp.bench import cluster_model

        return cluster_model.markdown
    return None
