"""``smddp-bench model --preset cluster``: the cost model of a cluster of
shaped NICs, beside smddp measured on it.

    smddp-bench model --preset cluster --cluster 2x2 --nics 2 --rate 1gbit --sizes 4M,16M,64M

The machine of the model (smddp.bench.model) is the cluster ``smddp-cluster
up`` makes: a "GPU" is a rank, a node a host of R ranks with K NICs of the
given rate, and NCCL's rings are smddp's one flat ring, whose crossings
leave through one NIC (R/K rings side by side in the model's terms). A short
calibration on the cluster itself gives the rest: an AllGather between two
ranks of one host (shared memory: alpha and beta inside a node) and between
two ranks of different hosts on the same NIC index (one shaped link: alpha
across nodes, and the links' efficiency, beta / rate). Then smddp's flat
ring and its hierarchical schedule are measured on the whole cluster,
interleaved, every call after a barrier, and the table puts each measured
time beside the model's, with the links' limit (smddp.bench.links).

Runs on the cluster as every benchmark here does (smddp.bench.cluster_run):
one torchrun per host, every rank running this same command.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import asdict
from typing import Any

from smddp.bench import cluster_run, launch, links, record, table, timing, views
from smddp.bench import model as _model
from smddp.bench import ops as _ops
from smddp.bench.table import Column
from smddp.bench.units import SizeOptions, format_size, parse_size_list

SCHEDULES = ("ring", "hierarchical")
# The sizes of the measured points, unless --sizes or -b/-e/-f/-i say otherwise.
SIZES = SizeOptions(sizes="4M,16M,64M", minbytes="4M", maxbytes="64M", factor=4.0)
# The pair AllGathers of the calibration (nccl-tests sizes: one step of half).
CALIBRATION_SIZES = "1M,4M,16M,32M"


def machine(facts: dict[str, Any], fits: dict[str, dict], chunk_bytes: int) -> _model.Machine:
    """The model's constants: the shape and the rate from the cluster, alpha and
    beta inside a host and the links' efficiency from the calibration."""
    rate = facts["rate_bytes_per_s"]
    shm, net = fits["shm"], fits["net"]
    per_host, nics = facts["ranks_per_host"], facts["nics"]
    return _model.Machine(
        name=(f"smddp-cluster: {links.describe_cluster(facts)}; a rank stands for a GPU, "
              "calibrated on the cluster"),  # fmt: skip
        gpus_per_node=per_host, nvlink_gbs=(shm["beta_bytes_per_s"] or 1e15) / 1e9, nics=nics,
        nic_gbps=rate * 8 / 1e9,
        net_efficiency=min(1.0, (net["beta_bytes_per_s"] or math.inf) / rate),
        alpha_intra_us=shm["alpha_s"] * 1e6, alpha_inter_us=net["alpha_s"] * 1e6,
        ring_channels=max(1, per_host // nics), chunk_bytes=chunk_bytes, schedule="cpu-pipelined",
    )  # fmt: skip


def rows(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """Each measured point with the model's times and the links' limit."""
    m = _model.Machine(**rec["constants"])
    facts = rec["topology"]["facts"]
    out = []
    for r in rec["results"]:
        e = _model.estimate(r["op"], r["size_bytes"], facts["hosts"], m)
        model = {"ring": e.ring_s, "hierarchical": e.hier_s}
        out.append({**r, "limit_s": links.point_limit_s(facts, r), "model_s": model,
                    "error": {k: (model[k] - r["measured_s"][k]) / r["measured_s"][k]
                              for k in SCHEDULES if r["measured_s"].get(k)}})  # fmt: skip
    return out


def _cols() -> tuple[list[Column], list[tuple[str, int]]]:
    block = [Column("measured", "(µs)", "{:.1f}"), Column("model", "(µs)", "{:.1f}"),
             Column("error", "(%)", "{:+.0f}")]  # fmt: skip
    return table.grouped(
        ("", [Column("op", left=True), Column("size", "(B)"), Column("limit", "(µs)", "{:.1f}")]),
        ("flat ring", block), ("hierarchical", block),
        ("ring / hierarchical", [Column("measured", "", "{:.2f}"), Column("model", "", "{:.2f}")]),
    )  # fmt: skip


def _values(r: dict[str, Any]) -> list[Any]:
    meas, model = r["measured_s"], r["model_s"]
    out: list[Any] = [_ops.OPS[r["op"]].title, format_size(r["size_bytes"]),
                      None if r["limit_s"] is None else r["limit_s"] * 1e6]  # fmt: skip
    for k in SCHEDULES:
        out += [meas[k] * 1e6, model[k] * 1e6, r["error"][k] * 100]
    return out + [meas["ring"] / meas["hierarchical"], model["ring"] / model["hierarchical"]]


def text(rec: dict[str, Any]) -> str:
    cols, groups = _cols()
    return (views.fit_table(rec["fits"], "calibration") + "\n#\n"
            + table.text(cols, [_values(r) for r in rows(rec)], groups)
            + "\n# error = (model - measured) / measured; " + links.RULE)  # fmt: skip


def markdown(rec: dict[str, Any]) -> tuple[str, str]:
    cols, groups = _cols()
    facts = rec["topology"]["facts"]
    c = rec["constants"]
    note = (f"{links.describe_cluster(facts)}; model: {c['gpus_per_node']} ranks per node, "
            f"{c['nics']} NICs of {c['nic_gbps']:.3g} Gb/s at efficiency {c['net_efficiency']:.3f}, "
            f"alpha {c['alpha_intra_us']:.1f} us inside a host and {c['alpha_inter_us']:.1f} us "
            f"across, {c['nvlink_gbs']:.2f} GB/s inside a host (fitted on the cluster: "
            f"{'; '.join(f['label'] for f in rec['fits'].values())}); error = (model - measured) / "
            f"measured; {links.RULE}")  # fmt: skip
    return table.markdown(cols, [_values(r) for r in rows(rec)], groups), note


# -- the command ---------------------------------------------------------------


def main(ns: argparse.Namespace, parser: argparse.ArgumentParser, argv: list[str], sizes: list[int]) -> int:
    """``smddp-bench model --preset cluster``: the launching side, or one rank."""
    ns.cluster = ns.cluster or "2x2"
    hosts, per_host = cluster_run.check_arguments(ns, parser, sweep=False)
    if hosts < 2 or per_host < 2:
        parser.error("--preset cluster: calibrating needs at least 2 hosts of 2 ranks (--cluster 2x2)")
    if launch.launched_externally():
        return _rank(ns, argv, sizes, ns.op)

    def measure(c: Any, facts: dict[str, Any]) -> int:
        if not facts["rate_bytes_per_s"]:
            print("smddp-bench model: --preset cluster models shaped links; bring the cluster up with "
                  "a --rate", file=sys.stderr)  # fmt: skip
            return 2
        print(f"# smddp-bench model --preset cluster: calibration on the cluster, then smddp's flat ring "
              f"and hierarchical schedule measured beside the model, sizes "
              f"{', '.join(format_size(s) for s in sizes)}", flush=True)  # fmt: skip
        return cluster_run.run_hosts(c, facts, ["-m", "smddp.bench", "model", *argv], ns.timeout,
                                     "smddp-bench model")  # fmt: skip

    return cluster_run.with_cluster(ns, hosts, per_host, "smddp-bench model", measure)


def _rank(ns: argparse.Namespace, argv: list[str], sizes: list[int], ops: tuple[str, ...]) -> int:
    import json

    import torch.distributed as dist

    from smddp.bench.calibrate import medians, pair_fits
    from smddp.bench.sweep import TorchComm, new_group, process_group

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    facts = json.loads(os.environ[cluster_run.CLUSTER_ENV])
    per_host = facts["ranks_per_host"]
    how = timing.Timing(timing.BARRIER_EACH, warmup=2, block_warmup=0, iters=ns.iters, rounds=2)
    chunk = int(os.environ.get("SMDDP_CHUNK_BYTES") or 0) or (1 << 20)
    rec = record.new("cluster-model", ["smddp-bench", "model", *argv],
                     {"sizes": sizes, "ops": list(ops), "iters": ns.iters,
                      "calibration_sizes": parse_size_list(CALIBRATION_SIZES)}, how)  # fmt: skip
    with process_group(rank, world, "env://", 120) as timeout:
        comm = TorchComm(dist.group.WORLD)
        pairs = {"shm": [0, 1], "net": [0, per_host]}
        pair_groups = {k: dist.new_group(v, backend="smddp", timeout=timeout) for k, v in pairs.items()}
        whole = {k: new_group(f"smddp:{k}", timeout) for k in SCHEDULES}
        labels = {"shm": "shared memory (ranks 0 and 1, one host)",
                  "net": f"one link (ranks 0 and {per_host}, two hosts, nic0 each)"}  # fmt: skip
        fits = pair_fits(comm, how, parse_size_list(CALIBRATION_SIZES), pairs, pair_groups, labels)
        results = []
        for op in ops:
            for size in sizes:
                nbytes, t = medians(comm, how, op, size, whole, list(range(world)))
                results.append({"op": op, "size_bytes": nbytes, "measured_s": t})
        if rank == 0:
            rec.update(topology={"launcher": cluster_run.LAUNCHER, "facts": facts},
                       constants=asdict(machine(facts, fits, chunk)), fits=fits, results=results)  # fmt: skip
            print(_model.describe(_model.Machine(**rec["constants"])), flush=True)
            print(text(rec), flush=True)
            if ns.json:
                record.write(rec, ns.json)
                print(f"# written: {ns.json}", flush=True)
        dist.barrier()
        return 0
