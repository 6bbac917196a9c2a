"""Training end to end: the example's GPT trained with DDP, FSDP2 (1-D and
HSDP), FSDP1 and torch.distributed.checkpoint on smddp, against gloo.

Each case trains a tiny model for a few steps in every rank and returns the
per-rank losses and a digest of the unsharded parameters. smddp must match
gloo's losses, give bitwise-identical parameters on a second run, and resume
from a checkpoint with exactly the loss of an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys

import pytest
import torch
import torch.distributed as dist

_EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
if _EXAMPLES not in sys.path:
    sys.path.insert(0, _EXAMPLES)

import train_fsdp  # noqa: E402

STEPS = 5
RTOL = 1e-4
# Small enough that a run takes a fraction of a second on an idle core, yet
# with several FSDP units and DDP buckets, so that the overlap paths run.
TINY = [
    "--layers", "2", "--width", "32", "--heads", "2", "--seq-len", "16",
    "--vocab", "64", "--batch", "2", "--ddp-bucket-mb", "0.02",
]  # fmt: skip

# name -> flags; run on 2 ranks (one node).
ONE_NODE = {
    "ddp": ["--strategy", "ddp"],
    "ddp-bf16": ["--strategy", "ddp", "--mixed-precision", "bf16", "--reduce-dtype", "bf16"],
    "fsdp2": ["--strategy", "fsdp2"],
    "fsdp2-bf16": ["--strategy", "fsdp2", "--mixed-precision", "bf16"],
    "fsdp2-bf16-reduce": ["--strategy", "fsdp2", "--mixed-precision", "bf16",
                          "--reduce-dtype", "bf16"],
    "fsdp2-premul": ["--strategy", "fsdp2", "--reduce-divide-factor", "3"],
    "fsdp1-full": ["--strategy", "fsdp1", "--fsdp1-sharding", "FULL_SHARD"],
    "fsdp1-grad-op": ["--strategy", "fsdp1", "--fsdp1-sharding", "SHARD_GRAD_OP"],
}  # fmt: skip

# name -> flags; run on 4 ranks, on one node and on 2 emulated nodes x 2:
# four contributions per reduction, so the order of summation matters.
FOUR_RANKS = {
    "ddp": ["--strategy", "ddp"],
    "fsdp2": ["--strategy", "fsdp2"],
    "fsdp1-full": ["--strategy", "fsdp1", "--fsdp1-sharding", "FULL_SHARD"],
}

# name -> flags; run on 4 ranks as 2 emulated nodes x 2 ranks. smddp finds
# the replicate size (its node count) itself; gloo is told.
TWO_NODES = {
    **FOUR_RANKS,
    "hsdp": ["--strategy", "hsdp"],
    "hsdp-premul-bf16": ["--strategy", "hsdp", "--reduce-divide-factor", "4",
                         "--mixed-precision", "bf16"],
    "fsdp1-hybrid": ["--strategy", "fsdp1", "--fsdp1-sharding", "HYBRID_SHARD"],
}  # fmt: skip
EMULATED_2X2 = {"SMDDP_RANKS_PER_NODE": "2"}


def _digest(params: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(params[name].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _trainer(flags: list[str]) -> train_fsdp.Trainer:
    # Ranks share the host's cores: one intra-op thread each.
    torch.set_num_threads(1)
    return train_fsdp.Trainer(train_fsdp.parse_args(TINY + flags))


def case_train(runs: dict[str, list[str]], repeat: int) -> dict[str, dict]:
    """Trains each configuration ``repeat`` times from scratch."""
    out = {}
    for name, flags in runs.items():
        losses, digests = [], []
        for _ in range(repeat):
            trainer = _trainer(flags)
            losses.append([trainer.step(s).loss for s in range(1, STEPS + 1)])
            digests.append(_digest(trainer.full_parameters()))
            del trainer
        out[name] = {"losses": losses, "digests": digests}
    return out


def case_resume(runs: dict[str, list[str]], root: str, k: int) -> dict[str, dict]:
    """Trains to step k, saves, trains on; then a second trainer, first
    moved away from that state by a step on other data, loads the checkpoint
    and trains the same steps."""
    out = {}
    for name, flags in runs.items():
        path = os.path.join(root, name)
        first = _trainer(flags)
        for s in range(1, k + 1):
            first.step(s)
        first.save(path)
        straight = [first.step(s).loss for s in range(k + 1, STEPS + 1)]
        straight_digest = _digest(first.full_parameters())
        del first
        second = _trainer(flags)
        second.step(1000)  # parameters and optimizer state that must be overwritten
        second.load(path)
        resumed = [second.step(s).loss for s in range(k + 1, STEPS + 1)]
        out[name] = {
            "straight": straight,
            "resumed": resumed,
            "digests": [straight_digest, _digest(second.full_parameters())],
        }
    return out


def case_hsdp_layout() -> dict:
    """The process groups of the HSDP mesh, as torch and as smddp see them."""
    cpu = torch.device("cpu")
    trainer = _trainer(["--strategy", "hsdp"])
    mesh = trainer.mesh
    shard, replicate = mesh.get_group("shard"), mesh.get_group("replicate")
    fsdp1 = _trainer(["--strategy", "fsdp1", "--fsdp1-sharding", "HYBRID_SHARD"])
    return {
        "mesh": mesh.mesh.tolist(),
        "dim_names": list(mesh.mesh_dim_names),
        "shard": dist.get_process_group_ranks(shard),
        "replicate": dist.get_process_group_ranks(replicate),
        "backends": [type(g._get_backend(cpu)).__name__ for g in (shard, replicate)],
        "shard_topology": shard._get_backend(cpu).topology(),
        "replicate_topology": replicate._get_backend(cpu).topology(),
        "world_topology": dist.group.WORLD._get_backend(cpu).topology(),
        "report": train_fsdp.mesh_report(mesh),
        "fsdp1_shard": dist.get_process_group_ranks(fsdp1.model.process_group),
        "fsdp1_mesh": fsdp1.mesh.mesh.tolist(),
    }


def _assert_close(smddp: list[float], gloo: list[float], what: str) -> None:
    assert len(smddp) == len(gloo) >= 5, what
    for step, (a, b) in enumerate(zip(smddp, gloo), start=1):
        assert math.isfinite(a), f"{what}: step {step}: loss {a}"
        assert abs(a - b) <= RTOL * abs(b), f"{what}: step {step}: smddp {a!r} vs gloo {b!r}"


def _check_parity(smddp: list[dict], gloo: list[dict], names) -> None:
    for name in names:
        for rank, (mine, ref) in enumerate(zip(smddp, gloo)):
            run1, run2 = mine[name]["losses"]
            _assert_close(run1, ref[name]["losses"][0], f"{name}, rank {rank}")
            assert run1 == run2, f"{name}, rank {rank}: two smddp runs differ: {run1} vs {run2}"
            d1, d2 = mine[name]["digests"]
            assert d1 == d2, f"{name}, rank {rank}: two smddp runs end with different parameters"
        # Unsharded parameters are the same everywhere.
        assert len({r[name]["digests"][0] for r in smddp}) == 1, name


@pytest.mark.timeout(600)
def test_one_node_parity_with_gloo(pools):
    smddp = pools(2).run(case_train, ONE_NODE, 2, timeout=300)
    gloo = pools(2, backend="gloo").run(case_train, ONE_NODE, 1, timeout=300)
    _check_parity(smddp, gloo, ONE_NODE)


@pytest.fixture(scope="module")
def gloo_four_ranks(pools):
    """gloo's losses on 4 ranks for every 4-rank configuration, computed once
    (gloo knows nothing of emulated nodes: it is told the replicate size)."""
    runs = {name: flags + ["--replicate-size", "2"] for name, flags in TWO_NODES.items()}
    return pools(4, backend="gloo").run(case_train, runs, 1, timeout=400)


@pytest.mark.timeout(600)
def test_four_rank_parity_with_gloo(pools, gloo_four_ranks):
    smddp = pools(4).run(case_train, FOUR_RANKS, 2, timeout=400)
    _check_parity(smddp, gloo_four_ranks, FOUR_RANKS)


@pytest.mark.timeout(600)
def test_two_node_parity_with_gloo(pools, gloo_four_ranks):
    smddp = pools(4, **EMULATED_2X2).run(case_train, TWO_NODES, 2, timeout=400)
    _check_parity(smddp, gloo_four_ranks, TWO_NODES)


# PowerSGD's future callbacks issue all-reduces and wait for them; several
# buckets' callbacks and the backward pass's own all-reduces interleave. gloo
# cannot run it on CPU (its two worker threads deadlock when the callbacks
# nest three deep), so the reference is plain DDP for the steps before
# compression starts, and the invariants of DDP after.
POWERSGD = {
    "ddp": ["--strategy", "ddp"],
    "ddp-powersgd": ["--strategy", "ddp", "--ddp-powersgd-rank", "2"],
}
POWERSGD_START = 2  # examples/train_fsdp.py: start_powerSGD_iter


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shape", ["1x2", "2x2"])
def test_ddp_powersgd(pools, shape):
    pool = pools(2) if shape == "1x2" else pools(4, **EMULATED_2X2)
    results = pool.run(case_train, POWERSGD, 2, timeout=200)
    for rank, r in enumerate(results):
        plain, compressed = r["ddp"]["losses"][0], r["ddp-powersgd"]["losses"]
        assert compressed[0] == compressed[1], f"rank {rank}: two PowerSGD runs differ: {compressed}"
        assert all(math.isfinite(x) for x in compressed[0]), compressed[0]
        assert compressed[0][:POWERSGD_START] == plain[:POWERSGD_START], (
            f"rank {rank}: before compression starts, PowerSGD {compressed[0]} differs from DDP {plain}"
        )
        assert compressed[0][POWERSGD_START:] != plain[POWERSGD_START:], "compression never changed a step"
        d1, d2 = r["ddp-powersgd"]["digests"]
        assert d1 == d2, f"rank {rank}: two PowerSGD runs end with different parameters"
    # The replicas stay identical.
    assert len({r["ddp-powersgd"]["digests"][0] for r in results}) == 1, "the ranks' parameters differ"


@pytest.mark.timeout(200)
def test_hsdp_shards_inside_nodes_and_replicates_across(pools):
    layouts = pools(4, **EMULATED_2X2).run(case_hsdp_layout, timeout=160)
    for rank, got in enumerate(layouts):
        node, local = divmod(rank, 2)
        assert got["mesh"] == [[0, 1], [2, 3]], got["mesh"]
        assert got["dim_names"] == ["replicate", "shard"]
        assert got["shard"] == [2 * node, 2 * node + 1], (rank, got["shard"])
        assert got["replicate"] == [local, local + 2], (rank, got["replicate"])
        assert got["backends"] == ["ProcessGroupSMDDP"] * 2, got["backends"]
        world = got["world_topology"]
        assert (world["nodes"], world["local_size"]) == (2, 2), world
        shard = got["shard_topology"]
        assert (shard["nodes"], shard["local_size"]) == (1, 2), (rank, shard)
        replicate = got["replicate_topology"]
        assert (replicate["nodes"], replicate["local_size"]) == (2, 1), (rank, replicate)
        assert got["report"]["shard"]["ranks"] == got["shard"]
        assert got["report"]["replicate"]["topology"]["nodes"] == 2
        assert got["fsdp1_mesh"] == [[0, 1], [2, 3]]
        assert got["fsdp1_shard"] == got["shard"], (rank, got["fsdp1_shard"])


def _check_resume(results: list[dict]) -> None:
    for rank, per_rank in enumerate(results):
        for name, r in per_rank.items():
            assert r["resumed"] == r["straight"], (
                f"{name}, rank {rank}: resumed {r['resumed']} vs uninterrupted {r['straight']}"
            )
            assert r["digests"][0] == r["digests"][1], f"{name}, rank {rank}: parameters differ"


@pytest.mark.timeout(200)
def test_checkpoint_resumes_exactly(pools, tmp_path):
    runs = {
        "fsdp2": ["--strategy", "fsdp2"],
        "fsdp2-bf16": ["--strategy", "fsdp2", "--mixed-precision", "bf16"],
        "fsdp1": ["--strategy", "fsdp1"],
        "ddp": ["--strategy", "ddp"],
    }
    _check_resume(pools(2).run(case_resume, runs, str(tmp_path), 3, timeout=160))


@pytest.mark.timeout(200)
def test_checkpoint_resumes_exactly_hsdp(pools, tmp_path):
    runs = {"hsdp": ["--strategy", "hsdp"]}
    _check_resume(pools(4, **EMULATED_2X2).run(case_resume, runs, str(tmp_path), 3, timeout=160))


def test_help_documents_every_flag():
    parser = train_fsdp.build_parser()
    text = parser.format_help()
    for action in parser._actions:
        for flag in action.option_strings:
            assert flag in text, flag
        assert action.help, action.option_strings
    assert "communication wait is measured" in text and "schedstat" in text


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_step_benchmark(tmp_path):
    from smddp.bench import step

    out = tmp_path / "step.json"
    code = step.main([
        "--preset", "tiny", "--warmup", "1", "--steps", "2", "--threads", "1",
        "--timeout", "120", "--json", str(out),
    ])  # fmt: skip
    assert code == 0
    results = json.loads(out.read_text())["results"]
    assert sorted(results) == ["fake", "gloo", "smddp"]
    for r in results.values():
        assert len(r["step_s"]) == 2 and r["median_s"] > 0
    # The same model, seed and data: smddp and gloo train alike.
    a, b = results["smddp"]["final_loss"], results["gloo"]["final_loss"]
    assert abs(a - b) <= RTOL * abs(b), (a, b)
    assert results["fake"]["overhead_vs_fake"] is None
