"""The cost model against numbers worked out by hand from the formulas of
bench/README.md ("Cost model"), with round constants:

    intra-node bandwidth B_nv = 100 GB/s, alpha_intra = 1 us
    network: 1 NIC of 80 Gb/s, efficiency 1 -> B_net = 10 GB/s per node,
             alpha_inter = 10 us
    smddp pipeline chunk 1,000,000 bytes; size S = 8,000,000 bytes
    the CUDA schedule: staging buffer Z = 1,000,000 bytes, a copy inside a
             GPU B_copy = 200 GB/s, sync = 5 us per exchange
"""

from __future__ import annotations

import math

import pytest

from smddp.bench import model, record, views
from smddp.bench.model import Machine, estimate, fit_alpha_beta, hierarchical_time, ring_time

US = 1e-6
S = 8_000_000


def machine(gpus_per_node: int, **kw) -> Machine:
    base = dict(
        name="test",
        gpus_per_node=gpus_per_node,
        nvlink_gbs=100.0,
        nics=1,
        nic_gbps=80.0,
        net_efficiency=1.0,
        alpha_intra_us=1.0,
        alpha_inter_us=10.0,
        chunk_bytes=1_000_000,
    )
    base.update(kw)
    return Machine(**base)


def cuda(gpus_per_node: int, **kw) -> Machine:
    base = dict(schedule="cuda", staging_bytes=1_000_000, copy_gbs=200.0, sync_us=5.0)
    base.update(kw)
    return machine(gpus_per_node, **base)


def test_one_node_is_a_ring_over_nvswitch():
    # G=2, N=1: one step of S/2 = 4e6 B at 100 GB/s = 40 us, plus 1 us.
    m = machine(2)
    for op in ("all_gather", "reduce_scatter"):
        assert ring_time(op, S, 1, m) == pytest.approx(41 * US)
        assert hierarchical_time(op, S, 1, m) == pytest.approx(41 * US)
    assert ring_time("all_reduce", S, 1, m) == pytest.approx(82 * US)
    e = estimate("all_gather", S, 1, m)
    # busbw = S / t * (P-1)/P = 8e6 / 41e-6 / 1e9 * 1/2 = 97.56 GB/s
    assert e.ring_busbw_gbs == pytest.approx(97.5609756, rel=1e-6)
    assert e.ratio == pytest.approx(1.0)


def test_one_rank_per_node_is_a_ring_over_the_network():
    # G=1, N=2: the GPU owns the whole NIC (10 GB/s): 10 us + 4e6 B / 10 GB/s = 410 us.
    m = machine(1)
    assert ring_time("all_gather", S, 2, m) == pytest.approx(410 * US)
    assert hierarchical_time("all_gather", S, 2, m) == pytest.approx(410 * US)
    assert hierarchical_time("all_reduce", S, 2, m) == pytest.approx(820 * US)


def test_cuda_one_gpu_per_node_is_nccls_ring():
    # The rail is the group: no node stage, no staging copies.
    for schedule in ("cuda", "cuda-pipelined"):
        assert hierarchical_time("all_gather", S, 2, cuda(1, schedule=schedule)) == pytest.approx(410 * US)
        assert hierarchical_time("all_reduce", S, 2, cuda(1, schedule=schedule)) == pytest.approx(820 * US)
        assert estimate("reduce_scatter", S, 4, cuda(1, schedule=schedule)).ratio == pytest.approx(1.0)


def test_two_nodes_of_two():
    m = machine(2)
    # Flat ring, P=4: latency 2 intra steps + 1 inter step = 12 us; 3 steps of
    # 2e6 B at min(100, 2 rings x 5 GB/s share) = 10 GB/s = 600 us -> 612 us.
    assert ring_time("all_gather", S, 2, m) == pytest.approx(612 * US)
    # smddp: rail 10 + 2e6/5e9 = 410 us; node 1 + 4e6/100e9 = 41 us;
    # k = ceil(4e6 / 1e6) = 4 chunks; 410 + 1 + 40/4 = 421 us.
    assert hierarchical_time("all_gather", S, 2, m) == pytest.approx(421 * US)
    assert hierarchical_time("reduce_scatter", S, 2, m) == pytest.approx(421 * US)
    assert ring_time("all_reduce", S, 2, m) == pytest.approx(1224 * US)
    assert hierarchical_time("all_reduce", S, 2, m) == pytest.approx(842 * US)
    e = estimate("all_gather", S, 2, m)
    assert e.gpus == 4
    assert e.ratio == pytest.approx(612 / 421)
    # busbw = 8e6 / 421e-6 / 1e9 * 3/4 = 14.2518 GB/s; ring 8e6/612e-6/1e9*3/4 = 9.8039
    assert e.hier_busbw_gbs == pytest.approx(14.2517815, rel=1e-6)
    assert e.ring_busbw_gbs == pytest.approx(9.8039216, rel=1e-6)
    e = estimate("all_reduce", S, 2, m)  # busbw factor 2*3/4
    assert e.hier_busbw_gbs == pytest.approx(8e6 / 842e-6 / 1e9 * 1.5)


def test_one_ring_is_limited_by_one_nic_share():
    # A single ring crosses each node boundary through one GPU's share (5 GB/s):
    # 12 us + 3 * 2e6 / 5e9 = 1212 us.
    assert ring_time("all_gather", S, 2, machine(2, ring_channels=1)) == pytest.approx(1212 * US)


def test_slow_node_stage_dominates_the_pipeline():
    # B_nv = 1 GB/s: node stage 1 + 4e6/1e9 = 4001 us is the slower stage; the
    # rail stage adds its latency and one chunk: 4001 + 10 + 400/4 = 4111 us.
    m = machine(2, nvlink_gbs=1.0)
    assert hierarchical_time("all_gather", S, 2, m) == pytest.approx(4111 * US)
    # Flat ring: every step at min(1, 10) GB/s: 12 + 3 * 2000 = 6012 us.
    assert ring_time("all_gather", S, 2, m) == pytest.approx(6012 * US)


def test_presets():
    p4d = model.PRESETS["p4d"]
    assert p4d.node_net_gbps == pytest.approx(340.0)  # 4 x 100 Gb/s x 0.85
    assert p4d.nic_share_gbs == pytest.approx(5.3125)
    assert p4d.nvlink_gbs == 300.0 and p4d.gpus_per_node == 8 and p4d.channels == 8
    p5 = model.PRESETS["p5"]
    assert p5.nvlink_gbs == 450.0 and p5.nics == 32
    # p4d, AllGather of 64 MiB on 16 nodes (P=128, block 524288 B):
    # ring = 112*3.4 + 15*14 + 127*524288/42.5e9 s = 590.8 + 1566.7 us
    t = ring_time("all_gather", 64 << 20, 16, p4d)
    assert t == pytest.approx((590.8 + 127 * 524288 / 42.5e9 / US) * US)
    # smddp, the CUDA rails schedule: the own block copied into the output,
    # the rail's send/recv (15 steps of a block over the NIC share), then the
    # node stage: 32 MiB of staging / 16 nodes = 2 MiB per block, one chunk:
    # one exchange, the 16 rail blocks into the stage, 7 peers' 16 blocks
    # over NVSwitch.
    assert p4d.schedule == "cuda" and p4d.staging_bytes == 32 << 20
    assert p4d.copy_gbs == 777.5 and p4d.sync_us == 20.0
    b = 524288
    rail = 15 * 14 * US + 15 * b / 5.3125e9
    node = 20 * US + 16 * b / 777.5e9 + 7 * 16 * b / 300e9
    assert hierarchical_time("all_gather", 64 << 20, 16, p4d) == pytest.approx(b / 777.5e9 + rail + node)


def test_cuda_all_gather_is_the_rail_stage_then_the_node_stage():
    # N=2, G=2, block b = 2e6 B. Own block into the output: 2e6/200e9 = 10 us.
    # Rail (grouped send/recv, N-1 = 1 step): 10 + 2e6/5e9 = 410 us.
    # Node: Z/N = 500,000 B of each block per chunk -> 4 chunks, 4 x 5 us;
    # the rail's 2 blocks into the stage 4e6/200e9 = 20 us; the peer's 2
    # blocks over NVSwitch 4e6/100e9 = 40 us. 10 + 410 + 20 + 20 + 40 = 500 us.
    m = cuda(2)
    assert hierarchical_time("all_gather", S, 2, m) == pytest.approx(500 * US)
    # Nothing overlaps: faster links shorten the sum, never hide a stage.
    assert hierarchical_time("all_gather", S, 2, cuda(2, nvlink_gbs=1e9)) == pytest.approx(460 * US, rel=1e-6)


def test_cuda_reduce_scatter_is_the_node_stage_then_the_rail_stage():
    # Node: Z/(N*G) = 250,000 B of each of the 4 blocks per chunk -> 8 chunks,
    # 8 x 5 us; the input into the stage 8e6/200e9 = 40 us; the kernel reads
    # the peer's 2 blocks (N blocks of b) over NVSwitch: 4e6/100e9 = 40 us.
    # Rail (NCCL's ring on N ranks): 10 + 2e6/5e9 = 410 us. 530 us.
    assert hierarchical_time("reduce_scatter", S, 2, cuda(2)) == pytest.approx(530 * US)


def test_cuda_all_reduce_runs_the_rail_once_over_every_chunk():
    # Chunks of Z/2 = 500,000 B -> 16. Each: two exchanges (10 us) -> 160 us.
    # The rail AllReduce once, over every chunk's slot: 2(N-1) = 2 steps
    # (20 us) and its bytes 2 x 2e6 / 5e9 = 800 us. Copies: the input into
    # the stage 40 us, the own result slice into its slot's stage and back,
    # 2 x 8e6/2/200e9 = 40 us; over NVSwitch the peer's half read by the
    # kernel and its result slice copied: 2 x 4e6/100e9 = 80 us. 160 + 20 +
    # 800 + 40 + 40 + 80 = 1140 us.
    assert hierarchical_time("all_reduce", S, 2, cuda(2)) == pytest.approx(1140 * US)


def test_cuda_one_node_is_the_node_schedule():
    # G=2, b = 4e6: own block 20 us; Z = 1e6 -> 4 chunks, 20 us of sync;
    # into the stage 20 us; the peer's stage over NVSwitch 40 us: 100 us.
    assert hierarchical_time("all_gather", S, 1, cuda(2)) == pytest.approx(100 * US)
    # ReduceScatter: 8 chunks of Z/G per block; 40 + 40 (the input staged)
    # + 4e6/100e9 (the peer's half of my block) = 120 us.
    assert hierarchical_time("reduce_scatter", S, 1, cuda(2)) == pytest.approx(120 * US)


def test_cuda_sync_is_paid_once_per_exchange():
    # A larger per-exchange latency adds chunks x exchanges x the difference.
    for op, exchanges in (("all_gather", 4), ("reduce_scatter", 8), ("all_reduce", 32)):
        low = hierarchical_time(op, S, 2, cuda(2))
        high = hierarchical_time(op, S, 2, cuda(2, sync_us=105.0))
        assert high - low == pytest.approx(exchanges * 100 * US), op
    # A staging buffer twice as large halves the exchanges.
    low = hierarchical_time("reduce_scatter", S, 2, cuda(2, staging_bytes=2_000_000))
    assert hierarchical_time("reduce_scatter", S, 2, cuda(2)) - low == pytest.approx(4 * 5 * US)


def test_cuda_pipelined_is_the_slower_stage_plus_one_chunk_of_the_other():
    # SMDDP_CUDA_PIPELINE: the rail stage chunk by chunk on a stream of its own.
    m = cuda(2, schedule="cuda-pipelined")
    # AllGather: 4 chunks (as above). The rail sends per chunk: 4 x 10 us of
    # latency + 2e6/5e9 = 440 us; the node stage 20 + 20 + 40 = 80 us. Own
    # block 10 us + 440 + 80/4 = 470 us (500 us unpipelined).
    assert hierarchical_time("all_gather", S, 2, m) == pytest.approx(470 * US)
    # ReduceScatter: 8 chunks; node 40 + 40 + 40 = 120 us; rail 8 x 10 + 400
    # = 480 us; 480 + 120/8 = 495 us (530 us unpipelined).
    assert hierarchical_time("reduce_scatter", S, 2, m) == pytest.approx(495 * US)
    # AllReduce: 16 chunks; node 16 x 10 + 40 + 40 + 80 = 320 us; the rail
    # per chunk 16 x 20 + 800 = 1120 us; 1120 + 320/16 = 1140 us: as
    # unpipelined, the latency of 15 more rail calls eats the overlap. With
    # 1 us across nodes: rail 16 x 2 + 800 = 832 us, 832 + 20 = 852 us
    # against 320 + 2 + 800 = 1122 us unpipelined.
    assert hierarchical_time("all_reduce", S, 2, m) == pytest.approx(1140 * US)
    fast = dict(alpha_inter_us=1.0)
    assert hierarchical_time("all_reduce", S, 2, cuda(2, schedule="cuda-pipelined", **fast)) == pytest.approx(852 * US)
    assert hierarchical_time("all_reduce", S, 2, cuda(2, **fast)) == pytest.approx(1122 * US)
    # One node has no rail: the node schedule, as unpipelined.
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        assert hierarchical_time(op, S, 1, m) == pytest.approx(hierarchical_time(op, S, 1, cuda(2))), op
    # A slow node stage is what the rail hides behind instead.
    slow = cuda(2, schedule="cuda-pipelined", nvlink_gbs=1.0)
    # AllGather node: 20 + 20 + 4e6/1e9 = 4040 us; rail 440: 10 + 4040 + 110 = 4160 us.
    assert hierarchical_time("all_gather", S, 2, slow) == pytest.approx(4160 * US)


def test_cuda_zero_copy_reads_the_peers_tensors_in_one_pass():
    # SMDDP_CUDA_ZERO_COPY: no staging copies, no chunks; the node's meetings
    # are the call's (open, then each mapped step's), 2 per exchange's sigma.
    m = cuda(2, schedule="cuda-zero-copy")
    # AllGather, b = 2e6: own block 10 us; the rail 10 + 400 = 410 us; three
    # meetings 7.5 us and the peer's rail blocks over NVSwitch 2 x 2e6/100e9
    # = 40 us: 467.5 us (500 us staged).
    assert hierarchical_time("all_gather", S, 2, m) == pytest.approx(467.5 * US)
    # ReduceScatter: two meetings 5 us, the kernel reading the peer's rail
    # blocks 40 us, the rail 410 us: 455 us (530 us staged).
    assert hierarchical_time("reduce_scatter", S, 2, m) == pytest.approx(455 * US)
    # AllReduce over the rails: the staged path's 16 chunks, slices and
    # slots in two mapped steps, 2 x 5 = 10 us; the own slice from its slot
    # into the output 4e6/200e9 = 20 us; the peer's half read and its slice
    # copied 2 x 4e6/100e9 = 80 us; the rail 2 x 10 + 800 = 820 us: 930 us
    # (1140 us staged).
    assert hierarchical_time("all_reduce", S, 2, m) == pytest.approx(930 * US)
    # One node, b = 4e6: AllGather 20 + 5 + 40 = 65 us (100 staged),
    # ReduceScatter 5 + 40 = 45 us (120 staged), AllReduce 10 + 80 = 90 us.
    assert hierarchical_time("all_gather", S, 1, m) == pytest.approx(65 * US)
    assert hierarchical_time("reduce_scatter", S, 1, m) == pytest.approx(45 * US)
    assert hierarchical_time("all_reduce", S, 1, m) == pytest.approx(90 * US)
    # With one GPU per node there is no node stage to map: NCCL's ring.
    assert hierarchical_time("all_gather", S, 2, cuda(1, schedule="cuda-zero-copy")) == pytest.approx(410 * US)
    assert "zero-copy" in model.describe_schedule(m)


def test_cuda_zero_copy_pipelined_overlaps_the_staged_chunks_with_the_rail():
    # SMDDP_CUDA_ZERO_COPY with SMDDP_CUDA_PIPELINE: the staged path's chunks,
    # a rail call each beside the zero-copy node stage.
    m = cuda(2, schedule="cuda-zero-copy-pipelined")
    # AllGather, 4 chunks: own block 10 us and the open 2.5 us; node 4 x 2
    # meetings 20 us + 40 us; rail 4 x 10 + 400 = 440 us: 12.5 + 440 + 60/4
    # = 467.5 us, as in one pass (the latency of 3 more rail calls eats the
    # overlap). With 1 us across nodes: 12.5 + 404 + 15 = 431.5 us against
    # 458.5 us in one pass.
    assert hierarchical_time("all_gather", S, 2, m) == pytest.approx(467.5 * US)
    fast = dict(alpha_inter_us=1.0)
    pipelined, one_pass = (cuda(2, schedule=f"cuda-zero-copy{p}", **fast) for p in ("-pipelined", ""))
    assert hierarchical_time("all_gather", S, 2, pipelined) == pytest.approx(431.5 * US)
    assert hierarchical_time("all_gather", S, 2, one_pass) == pytest.approx(458.5 * US)
    # ReduceScatter, 8 chunks: two meetings 5 us; node 40 us; rail 80 + 400
    # = 480 us: 5 + 480 + 5 = 490 us (455 in one pass); fast: 5 + 408 + 5 =
    # 418 us against 446 us.
    assert hierarchical_time("reduce_scatter", S, 2, m) == pytest.approx(490 * US)
    assert hierarchical_time("reduce_scatter", S, 2, pipelined) == pytest.approx(418 * US)
    assert hierarchical_time("reduce_scatter", S, 2, one_pass) == pytest.approx(446 * US)
    # AllReduce, 16 chunks of two mapped steps each: node 160 + 20 + 80 =
    # 260 us; rail 16 x 20 + 800 = 1120 us: 1120 + 260/16 = 1136.25 us;
    # fast: 832 + 16.25 = 848.25 us against 110 + 802 = 912 us in one pass.
    assert hierarchical_time("all_reduce", S, 2, m) == pytest.approx(1136.25 * US)
    assert hierarchical_time("all_reduce", S, 2, pipelined) == pytest.approx(848.25 * US)
    assert hierarchical_time("all_reduce", S, 2, one_pass) == pytest.approx(912 * US)
    # One node has no rail: the one pass.
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        assert hierarchical_time(op, S, 1, m) == pytest.approx(
            hierarchical_time(op, S, 1, cuda(2, schedule="cuda-zero-copy"))), op
    assert "SMDDP_CUDA_PIPELINE" in model.describe_schedule(m)


def test_the_pipelined_cpu_schedule_is_chosen_by_name():
    assert machine(2).schedule == "cpu-pipelined"
    pipelined = hierarchical_time("all_gather", S, 2, machine(2))
    assert pipelined == pytest.approx(421 * US)
    assert hierarchical_time("all_gather", S, 2, cuda(2)) != pytest.approx(pipelined)


def test_errors():
    with pytest.raises(ValueError):
        ring_time("broadcast", S, 2, machine(2))
    with pytest.raises(ValueError):
        hierarchical_time("all_gather", S, 0, machine(2))
    with pytest.raises(ValueError, match="schedule"):
        hierarchical_time("all_gather", S, 2, machine(2, schedule="tree"))


def test_fit_recovers_alpha_and_beta():
    sizes = [4096 * 4**i for i in range(8)]
    alpha, beta = 25e-6, 3e9
    a, b = fit_alpha_beta(sizes, [alpha + s / beta for s in sizes])
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(beta, rel=1e-6)
    noisy = [(alpha + s / beta) * (1.05 if i % 2 else 0.95) for i, s in enumerate(sizes)]
    a, b = fit_alpha_beta(sizes, noisy)
    assert a == pytest.approx(alpha, rel=0.2) and b == pytest.approx(beta, rel=0.2)
    a, b = fit_alpha_beta([1, 2, 3], [1e-3, 1e-3, 1e-3])
    assert a == pytest.approx(1e-3) and math.isinf(b)


def test_command(capsys):
    assert model.main(["--preset", "p4d", "--nodes", "16,128", "--sizes", "64M,256M"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line and not line.startswith("#")]
    assert len(rows) == 3 * 2 * 2  # ops x nodes x sizes
    assert "2157.5" in out  # the p4d AllGather ring time of test_presets, in us
    assert (
        model.main(
            [
                "--preset",
                "p5",
                "--nodes",
                "2",
                "-b",
                "1M",
                "-e",
                "4M",
                "--op",
                "all_gather",
                "--alpha-inter-us",
                "20",
                "--ring-channels",
                "1",
                "--staging-bytes",
                "4M",
                "--sync-us",
                "50",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "20 us across nodes" in out and "1 rings" in out
    assert "staging buffer 4M" in out and "50 us per exchange" in out
    assert len([line for line in out.splitlines() if not line.startswith("#")]) == 3


def test_the_record_names_the_schedule(tmp_path, capsys):
    path = tmp_path / "model.json"
    argv = ["--preset", "p4d", "--nodes", "16", "--sizes", "64M", "--op", "all_gather", "--sync-us", "7"]
    assert model.main([*argv, "--json", str(path)]) == 0
    rec = record.read(str(path))
    assert rec["constants"]["schedule"] == "cuda" and rec["constants"]["sync_us"] == 7.0
    assert "stages one after the other" in rec["schedule"] and "7 us per exchange" in rec["schedule"]
    _, caption = views.model_markdown(rec)
    assert f"smddp: {rec['schedule']}" in caption
    (row,) = rec["results"]
    assert row["hier_s"] == pytest.approx(hierarchical_time("all_gather", 64 << 20, 16,
                                                            Machine(**rec["constants"])))


@pytest.mark.parametrize(
    "argv",
    [
        ["--preset", "p3"],
        ["--nodes", "0"],
        ["--sizes", "4Q"],
        ["--op", "broadcast"],
        ["--nvlink-gbs", "0"],
        ["--schedule", "tree"],
    ],
)
def test_command_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        model.main(argv)
    assert exc.value.code == 2
