"""The benchmarks on a cluster of namespaces, without one: the links' limit
and the fraction of it, the tables that print them as the sweep measures and
the markdown the docs render from a record, the cost model's rows beside the
measured ones, the options of ``--cluster`` and how a spawned rank enters
its host. Torch-free; the real run on a cluster is in test_cluster.py."""

from __future__ import annotations

import dataclasses
import json

import pytest

from smddp.bench import cli, cluster_model, cluster_run, links, render, step, views
from smddp.bench import model as _model

M = 1 << 20
RATE = 125_000_000  # 1gbit


def _facts(hosts: int = 2, per_host: int = 2, nics: int = 2, rate: int | None = RATE) -> dict:
    return {
        "cluster": "smddp", "hosts": hosts, "ranks_per_host": per_host, "nics": nics,
        "rate": "1gbit" if rate else None, "rate_bytes_per_s": rate, "mtu": 9000,
        "host_nics": [{"host": f"h{h}", "hostname": f"smddp-h{h}",
                       "nics": [{"name": f"nic{k}", "address": f"198.18.{k}.{h + 1}"} for k in range(nics)]}
                      for h in range(hosts)],
        "rank_nics": [{"rank": r, "host": f"h{r // per_host}", "nic": f"nic{r % per_host * nics // per_host}",
                       "address": f"198.18.{r % per_host * nics // per_host}.{r // per_host + 1}"}
                      for r in range(hosts * per_host)],
    }  # fmt: skip


def test_the_limit_is_what_each_host_must_receive_over_its_nics():
    # 2 hosts of 2 NICs at 125 MB/s: AllGather of 16M, each host receives 8M.
    assert links.limit_s("all_gather", 16 * M, 2, 2, RATE) == pytest.approx(8 * M / (2 * RATE))
    assert links.limit_s("reduce_scatter", 16 * M, 2, 2, RATE) == pytest.approx(8 * M / (2 * RATE))
    assert links.limit_s("all_reduce", 16 * M, 2, 2, RATE) == pytest.approx(16 * M / (2 * RATE))
    assert links.limit_s("broadcast", 16 * M, 2, 2, RATE) == pytest.approx(16 * M / (2 * RATE))
    # 3 hosts: two thirds of the data comes from the others.
    assert links.limit_s("all_gather", 12 * M, 3, 2, RATE) == pytest.approx(8 * M / (2 * RATE))
    # Nothing to say for one host or unshaped links.
    assert links.limit_s("all_gather", 16 * M, 1, 2, RATE) is None
    assert links.limit_s("all_gather", 16 * M, 2, 2, None) is None


def _rec(backend: str, op: str, size: int, time_us: float | None) -> dict:
    rec = {"backend": backend, "op": op, "dtype": "float32", "redop": "none" if op == "all_gather" else "sum",
           "world": 4, "requested_bytes": size, "size_bytes": size, "count": size // 16,
           "status": "ok" if time_us else "error", "note": "" if time_us else "failed"}  # fmt: skip
    if time_us:
        rec.update(time_us=time_us, algbw_gbs=size / time_us / 1e3, busbw_gbs=0.75 * size / time_us / 1e3,
                   wrong=0, iters=5, samples_us=[time_us])  # fmt: skip
    return rec


def test_the_tables_put_the_limit_beside_each_schedule():
    facts = _facts()
    view = links.LinksView(facts)
    backends = ("smddp:hierarchical", "smddp:ring", "gloo")
    head = view.sweep_header("all_gather", "float32", "none", backends, "4 ranks = 2 nodes x 2", "cpu")
    assert "limit" in head and head.count("%limit") == 3
    limit_us = 16 * M / 2 / (2 * RATE) * 1e6
    row = view.sweep_row([_rec("smddp:hierarchical", "all_gather", 16 * M, limit_us / 0.9),
                          _rec("smddp:ring", "all_gather", 16 * M, limit_us * 3),
                          _rec("gloo", "all_gather", 16 * M, None)], backends)  # fmt: skip
    assert f"{limit_us:.1f}" in row and "90%" in row and "33%" in row and "n/a" in row
    # The row's limit and fractions are kept for the record.
    kept = facts["limits"][0]
    assert kept["limit_us"] == pytest.approx(limit_us)
    assert kept["fraction"]["smddp:hierarchical"] == pytest.approx(0.9)
    assert kept["fraction"]["gloo"] is None


def _sweep_record(facts: dict) -> dict:
    limit_us = 4 * M / 2 / (2 * RATE) * 1e6
    results = [_rec("smddp:hierarchical", "all_gather", 4 * M, limit_us / 0.95),
               _rec("smddp:ring", "all_gather", 4 * M, limit_us / 0.33)]  # fmt: skip
    machine = {"cpu_model": "cpu", "cpu_cores": 2, "cpu_cores_available": 2, "memory_gb": 1, "kernel": "k",
               "python": "3", "torch": "t", "smddp": "s", "device": "cpu", "load_average": {}}  # fmt: skip
    return {"schema": "smddp-bench/2", "kind": "sweep", "created": "2026-01-01T00:00:00+00:00",
            "command": ["smddp-bench", "--cluster", "2x2", "--json", "x.json"], "machine": machine,
            "settings": {"backends": ["smddp:hierarchical", "smddp:ring"]},
            "topology": {"launcher": "smddp-cluster", "facts": facts}, "results": results,
            "summary": {"wrong": 0}}  # fmt: skip


def test_a_cluster_records_markdown_names_the_cluster_the_nics_and_the_limit():
    rec = _sweep_record(_facts())
    assert links.markdown_view(rec) is links.sweep_markdown
    # Records of one host keep the sweep's own table.
    assert links.markdown_view({**rec, "topology": {"launcher": "spawn"}}) is None
    md = views.markdown(rec, links.markdown_view(rec))
    assert "| limit (µs) |" in md.splitlines()[0].replace("| op | type | size ", "| ")
    assert "95%" in md and "33%" in md
    assert "2 hosts x 2 ranks, 2 NICs per host at 1gbit" in md
    assert "rank 3 h1 nic1 (198.18.1.2)" in md
    assert "`smddp-bench --cluster 2x2 --json x.json`" in md


def test_render_uses_the_cluster_table(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(_sweep_record(_facts())))
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- smddp-bench:table r.json -->\n<!-- /smddp-bench:table -->\n")
    assert render.main([str(doc)]) == 0
    assert "of limit" in doc.read_text()
    assert render.main(["--check", str(doc)]) == 0


def test_the_cluster_model_stands_beside_the_measurement():
    facts = _facts()
    fits = {"shm": {"label": "shm", "alpha_s": 20e-6, "beta_bytes_per_s": 4e9, "worst_error": 0.01},
            "net": {"label": "net", "alpha_s": 200e-6, "beta_bytes_per_s": 0.99 * RATE, "worst_error": 0.01}}
    m = cluster_model.machine(facts, fits, 1 << 20)
    # The flat ring crosses each host boundary through one NIC; a rail has its own.
    assert m.gpus_per_node == 2 and m.nics == 2 and m.ring_channels == 1
    assert m.net_efficiency == pytest.approx(0.99) and m.nic_share_gbs == pytest.approx(0.99 * RATE / 1e9)
    ring = _model.ring_time("all_gather", 64 * M, 2, m)
    hier = _model.hierarchical_time("all_gather", 64 * M, 2, m)
    limit = links.limit_s("all_gather", 64 * M, 2, 2, RATE)
    assert hier == pytest.approx(limit / 0.99, rel=0.02) and ring / hier == pytest.approx(3, rel=0.02)
    rec = {"constants": dataclasses.asdict(m), "topology": {"facts": facts}, "fits": fits,
           "results": [{"op": "all_gather", "size_bytes": 64 * M,
                        "measured_s": {"ring": ring * 1.1, "hierarchical": hier * 0.95}}]}  # fmt: skip
    (row,) = cluster_model.rows(rec)
    assert row["error"]["ring"] == pytest.approx(1 / 1.1 - 1)
    assert row["error"]["hierarchical"] == pytest.approx(1 / 0.95 - 1)
    assert row["limit_s"] == pytest.approx(limit)
    assert "flat ring" in cluster_model.text(rec)


def test_cluster_options():
    assert cluster_run.parse_shape("2x2") == (2, 2)
    assert cluster_run.parse_shape(" 3X2 ") == (3, 2)
    for bad in ("2", "0x2", "2x", "axb", ""):
        with pytest.raises(ValueError):
            cluster_run.parse_shape(bad)
    parser = cli.build_parser()
    with pytest.raises(SystemExit):
        cluster_run.check_arguments(parser.parse_args(["--cluster", "2x2", "--nodes", "2"]), parser)
    with pytest.raises(SystemExit):
        cluster_run.check_arguments(parser.parse_args(["--cluster", "2x2", "--nproc", "8"]), parser)
    ns = parser.parse_args(["--cluster", "2x2", "--nproc", "4", "--nics", "2", "--rate", "1gbit"])
    assert cluster_run.check_arguments(ns, parser) == (2, 2)
    # The step benchmark takes its world and its replicas from the hosts.
    s = step.parse_settings(["--cluster", "3x2", "--strategy", "hsdp", "--preset", "tiny"])
    assert s.world == 6 and s.replicate_size == 3
    with pytest.raises(SystemExit):
        step.parse_settings(["--cluster", "2x2", "--ranks-per-node", "2"])


def test_the_rank_nic_of_a_step_follows_the_backends_rule():
    facts = _facts(hosts=2, per_host=4, nics=2)
    # 4 ranks on 2 NICs: local ranks 0-1 on nic0, 2-3 on nic1 (transport::nicIndex).
    assert [cluster_run._nic_of(facts, 1, l)["nic"] for l in range(4)] == ["nic0", "nic0", "nic1", "nic1"]
    assert cluster_run._nic_of(facts, 1, 3)["address"] == "198.18.1.2"


def test_a_rank_enters_its_host_only_single_threaded():
    import threading

    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        with pytest.raises(RuntimeError, match="threads running"):
            cluster_run.enter_host({"net": "/nonexistent", "uts": "/nonexistent", "mnt": "/nonexistent"})
    finally:
        stop.set()
        t.join()
    assert cluster_run.SPAWN_ENV["OPENBLAS_NUM_THREADS"] == "1"


def test_the_bench_parser_takes_the_cluster_options():
    ns = cli.build_parser().parse_args(["--cluster", "2x2", "--nics", "2", "--rate", "1gbit", "--keep-cluster"])
    assert (ns.cluster, ns.nics, ns.rate, ns.keep_cluster, ns.cluster_name) == ("2x2", 2, "1gbit", True, "smddp")
    ns = _model.build_parser().parse_args(["--preset", "cluster", "--cluster", "2x2", "--rate", "1gbit"])
    assert ns.preset == "cluster" and ns.rate == "1gbit"
