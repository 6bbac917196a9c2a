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

from smddp.bench import views

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


class LinksView(views.SweepView):
    """The sweep's text tables with the links' limit; every row's limit and
    fractions also go to ``facts["limits"]``, for the record."""

    limited = True

    def __init__(self, facts: dict[str, Any]):
        self.facts = facts
        facts.setdefault("limits", [])

    def limit_s(self, first: dict[str, Any]) -> float | None:
        return point_limit_s(self.facts, first)

    def sweep_row(self, recs: list[dict], backends: Sequence[str]) -> str:
        point, first = {r["backend"]: r for r in recs}, recs[0]
        limit = self.limit_s(first)
        self.facts["limits"].append({
            "op": first["op"], "dtype": first["dtype"], "size_bytes": first["size_bytes"],
            "limit_us": None if limit is None else limit * 1e6,
            "fraction": {b: views.fraction(limit, point.get(b)) for b in backends},
        })  # fmt: skip
        return super().sweep_row(recs, backends)


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
    note = (f"{describe_cluster(facts)} (`smddp-cluster`, one torchrun per host); each rank's NIC: "
            f"{rank_nics(facts)}; {RULE}; of limit = limit / time; busbw in GB/s (nccl-tests' "
            f"definitions, GB = 1e9); ratios of busbw; #wrong {rec['summary']['wrong']}")  # fmt: skip
    return views.sweep_table(rec, lambda first: point_limit_s(facts, first)), note


def markdown_view(rec: dict[str, Any]) -> Callable[[dict[str, Any]], tuple[str, str]] | None:
    """The table and sentence of the records this module knows, for
    ``views.markdown`` (smddp-bench render); None for the others."""
    if rec.get("kind") == "sweep" and rec.get("topology", {}).get("launcher") == "smddp-cluster":
        return sweep_markdown
    if rec.get("kind") == "cluster-model":
        from smddp.bench import cluster_model

        return cluster_model.markdown
    return None
