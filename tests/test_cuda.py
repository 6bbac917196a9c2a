"""The CUDA path, on whatever GPUs the machine has: ranks share GPU 0 when
there is one (SMDDP_CUDA_RANKS_PER_GPU), 2 and 4 ranks, one node (CUDA IPC)
and 2 emulated nodes (host staging). Skipped without a GPU.

Every result is compared with a reference computed by torch on the same
deterministic inputs (float64 on the GPU, rounded to the dtype).
"""

from __future__ import annotations

import gc
import glob
import time

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.gpu

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM"]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _device() -> torch.device:
    d = torch.device("cuda", dist.get_rank() % torch.cuda.device_count())
    torch.cuda.set_device(d)
    return d


def _input(rank: int, n: int, dtype: torch.dtype, device, salt: int = 0) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(1000 * rank + salt)
    # PRODUCT stays finite with values near 1.
    return (0.5 + torch.rand(n, generator=g, dtype=torch.float64)).to(dtype).to(device)


def _reduce_op(name: str, factor: float):
    if name == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(factor)
    return getattr(dist.ReduceOp, name)


def _reference(inputs: list[torch.Tensor], name: str, factor: float) -> torch.Tensor:
    x = torch.stack([t.double() for t in inputs])
    if name == "SUM":
        return x.sum(0)
    if name == "AVG":
        return x.mean(0)
    if name == "PRODUCT":
        return x.prod(0)
    if name == "MIN":
        return x.min(0).values
    if name == "MAX":
        return x.max(0).values
    return (x * factor).sum(0)


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    tol = TOL[dtype]
    err = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    scale = want.double().abs().max().item() if want.numel() else 1.0
    assert err <= tol * max(1.0, scale), f"{what}: max error {err} (scale {scale})"


def case_collectives(sizes: list[int]):
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = _device()
    failures = []
    for dname, dtype in DTYPES.items():
        for n in sizes:
            all_in = [_input(r, n, dtype, dev) for r in range(world)]
            mine = all_in[rank].clone()
            # AllGather
            out = torch.full((n * world,), float("nan"), dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, mine)
            if not torch.equal(out, torch.cat(all_in)):
                failures.append(f"all_gather {dname} n={n}")
            # In place, as FSDP2 gathers: the input is the rank's block of the output.
            out = torch.full((n * world,), float("nan"), dtype=dtype, device=dev)
            out[rank * n:(rank + 1) * n] = mine
            dist.all_gather_into_tensor(out, out[rank * n:(rank + 1) * n])
            if not torch.equal(out, torch.cat(all_in)):
                failures.append(f"all_gather in place {dname} n={n}")
            # Broadcast from every root
            for root in range(world):
                t = all_in[rank].clone()
                dist.broadcast(t, src=root)
                if not torch.equal(t, all_in[root]):
                    failures.append(f"broadcast {dname} n={n} root={root}")
            for name in OPS:
                factor = 0.25
                # AllReduce
                t = mine.clone()
                dist.all_reduce(t, op=_reduce_op(name, factor))
                try:
                    _close(t, _reference(all_in, name, factor).to(dtype), dtype, f"all_reduce {name} {dname} n={n}")
                except AssertionError as e:
                    failures.append(str(e))
                # ReduceScatter
                big = [_input(r, n * world, dtype, dev, salt=7) for r in range(world)]
                o = torch.full((n,), float("nan"), dtype=dtype, device=dev)
                dist.reduce_scatter_tensor(o, big[rank].clone(), op=_reduce_op(name, factor))
                want = _reference(big, name, factor)[rank * n:(rank + 1) * n].to(dtype)
                try:
                    _close(o, want, dtype, f"reduce_scatter {name} {dname} n={n}")
                except AssertionError as e:
                    failures.append(str(e))
                # In place: the output is the rank's block of the input.
                inp = big[rank].clone()
                dist.reduce_scatter_tensor(inp[rank * n:(rank + 1) * n], inp, op=_reduce_op(name, factor))
                try:
                    _close(inp[rank * n:(rank + 1) * n], want, dtype, f"reduce_scatter in place {name} {dname} n={n}")
                except AssertionError as e:
                    failures.append(str(e))
    torch.cuda.synchronize()
    return failures


def case_streams_overlap_and_lifetime():
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = _device()
    failures = []
    # A non-default stream: the collective follows what is queued on it.
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t = torch.full((1 << 20,), float(rank + 1), device=dev)
        t.mul_(2)
        dist.all_reduce(t)
    s.synchronize()
    want = 2.0 * world * (world + 1) / 2
    if not torch.all(t == want):
        failures.append("non-default stream: wrong result")
    # Async with a matmul in flight.
    a = torch.randn(2048, 2048, device=dev)
    x = torch.full((1 << 22,), float(rank), device=dev)
    work = dist.all_reduce(x, async_op=True)
    c = a @ a
    work.wait()
    torch.cuda.synchronize()
    if not torch.all(x == world * (world - 1) / 2):
        failures.append("async all_reduce with a matmul: wrong result")
    if not torch.isfinite(c).all():
        failures.append("matmul beside the collective went wrong")
    # The input is freed right after the call: the allocator must not hand
    # its memory out before the collective has read it.
    inp = torch.full((1 << 22,), float(rank + 1), device=dev)
    out = torch.empty((1 << 22) * world, device=dev)
    dist.all_gather_into_tensor(out, inp, async_op=False)
    del inp
    junk = [torch.full((1 << 22,), -7.0, device=dev) for _ in range(4)]
    torch.cuda.synchronize()
    for r in range(world):
        if not torch.all(out[r << 22:(r + 1) << 22] == r + 1):
            failures.append(f"all_gather after freeing the input: block {r} overwritten")
    del junk
    # The future of a CUDA work (DDP chains on it).
    y = torch.ones(1024, device=dev)
    fut = dist.all_reduce(y, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    if not torch.all(fut.wait() == 2 * world):
        failures.append("get_future().then: wrong value")
    # The profiler shows the host's part of a CUDA call as smddp's span.
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        dist.all_reduce(torch.ones(333, device=dev))
    spans = [list(map(list, e.input_shapes)) for e in prof.events() if e.name == "smddp:allreduce"]
    if spans != [[[333]]]:
        failures.append(f"profiler: spans smddp:allreduce {spans}, want one of shape [333]")
    return failures


@pytest.mark.timeout(140)
@pytest.mark.parametrize("world", [2, 4])
def test_cuda_collectives_one_node(pools, world):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    per_gpu = max(1, world // torch.cuda.device_count())
    pool = pools(world, SMDDP_CUDA_RANKS_PER_GPU=str(per_gpu), SMDDP_CUDA_STAGING_BYTES="1M")
    sizes = [0, 1, 7, 4099, (1 << 20) + 3]
    for failures in pool.run(case_collectives, sizes, timeout=120):
        assert failures == []
    for failures in pool.run(case_streams_overlap_and_lifetime, timeout=120):
        assert failures == []


@pytest.mark.timeout(140)
def test_cuda_collectives_emulated_nodes(pools):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    pool = pools(4, SMDDP_CUDA_RANKS_PER_GPU="4", SMDDP_RANKS_PER_NODE="2")
    for failures in pool.run(case_collectives, [0, 5, 4099], timeout=120):
        assert failures == []


@pytest.mark.timeout(450)
def test_cuda_rails(pools):
    """2 emulated nodes x 2 ranks with a GPU each: the rails mode (NCCL between
    the nodes, device_setup's plan), with the rail stage pipelined on a
    stream of its own (SMDDP_CUDA_PIPELINE=1) and without, the rail
    AllGather as send/recv and as ncclAllGather (SMDDP_CUDA_RAIL_ALLGATHER),
    sizes that span several chunks of a 1M staging buffer."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 4:
        pytest.skip("needs 4 GPUs (a GPU per rank, so that the nodes meet through NCCL rails)")
    for pipeline, rail_allgather in (("0", "sendrecv"), ("1", "sendrecv"), ("0", "nccl"), ("1", "nccl")):
        pool = pools(4, SMDDP_RANKS_PER_NODE="2", SMDDP_CUDA_STAGING_BYTES="1M", SMDDP_CUDA_PIPELINE=pipeline,
                     SMDDP_CUDA_RAIL_ALLGATHER=rail_allgather)
        for failures in pool.run(case_collectives, [0, 7, 4099, (1 << 20) + 3], timeout=200):
            assert failures == [], f"SMDDP_CUDA_PIPELINE={pipeline} SMDDP_CUDA_RAIL_ALLGATHER={rail_allgather}"


@pytest.mark.timeout(250)
def test_cuda_one_rank_per_node(pools):
    """2 emulated nodes x 1 rank with a GPU each (a DeviceMesh's replicate
    dimension): the rails mode's collectives straight on NCCL, PREMUL_SUM
    through the node stage, in place and not (case_collectives), sizes
    around a 1M staging buffer."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (a GPU per rank, so that the nodes meet through NCCL rails)")
    pool = pools(2, SMDDP_RANKS_PER_NODE="1", SMDDP_CUDA_STAGING_BYTES="1M")
    for failures in pool.run(case_collectives, [0, 7, 4099, (1 << 20) + 3], timeout=200):
        assert failures == []
    for text in pool.run(case_describe, timeout=60):
        assert "one rank per node" in text, text


def case_describe() -> str:
    return dist.group.WORLD._get_backend(_device()).describe()


def case_zero_copy_buffers(n: int) -> list[str]:
    """The mapped tensors changing under the cache: tensors carved at several
    offsets of one segment, segments freed (empty_cache: the peers must close
    their mappings first) and their addresses handed to new allocations, and
    the in-place forms FSDP uses (the input a view of the AllGather's output,
    AllReduce in place)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = _device()
    failures = []
    for round_ in range(4):
        salt = 100 * round_
        big = torch.empty(4 * n + 64, device=dev)
        for k in range(3):
            part = big[k * (n + 16):k * (n + 16) + n]
            part.copy_(_input(rank, n, torch.float32, dev, salt=salt + k))
            out = torch.full((n * world,), float("nan"), device=dev)
            dist.all_gather_into_tensor(out, part)
            want = torch.cat([_input(r, n, torch.float32, dev, salt=salt + k) for r in range(world)])
            if not torch.equal(out, want):
                failures.append(f"round {round_}: all_gather from offset {k * (n + 16)} of a segment")
        # In place: this rank's input is its block of the output.
        out = torch.full((n * world,), float("nan"), device=dev)
        out[rank * n:(rank + 1) * n].copy_(_input(rank, n, torch.float32, dev, salt=salt))
        dist.all_gather_into_tensor(out, out[rank * n:(rank + 1) * n])
        if not torch.equal(out, torch.cat([_input(r, n, torch.float32, dev, salt=salt) for r in range(world)])):
            failures.append(f"round {round_}: in-place all_gather")
        t = _input(rank, n, torch.float32, dev, salt=salt + 1)
        dist.all_reduce(t)
        _want = _reference([_input(r, n, torch.float32, dev, salt=salt + 1) for r in range(world)], "SUM", 1.0)
        try:
            _close(t, _want.float(), torch.float32, f"round {round_}: in-place all_reduce")
        except AssertionError as e:
            failures.append(str(e))
        inp = _input(rank, n * world, torch.float32, dev, salt=salt + 2)
        o = torch.empty(n, device=dev)
        dist.reduce_scatter_tensor(o, inp)
        _want = _reference([_input(r, n * world, torch.float32, dev, salt=salt + 2) for r in range(world)], "SUM", 1.0)
        try:
            _close(o, _want[rank * n:(rank + 1) * n].float(), torch.float32, f"round {round_}: reduce_scatter")
        except AssertionError as e:
            failures.append(str(e))
        # Free the segments: the peers' mappings are revoked first, and the
        # next round's tensors get the same addresses in new allocations.
        del big, part, out, t, inp, o
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return failures


def case_zero_copy_counts() -> tuple[int, int, int]:
    """The calls this rank's CUDA communicator mapped and staged so far, and
    the segments of its own it revoked."""
    import re

    text = dist.group.WORLD._get_backend(_device()).describe()
    m = re.search(r"zero-copy: (\d+) calls mapped, (\d+) staged, (\d+) segments revoked", text)
    assert m, text
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def case_zero_copy_revocation() -> list[str]:
    """A tensor in a segment of its own (16 MiB: above the allocator's split
    bound) published, then freed by empty_cache: this rank revokes the
    peers' mappings of it first; new tensors at its addresses work."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = _device()
    n = 4 << 20
    failures = []
    revoked = case_zero_copy_counts()[2]
    for round_ in range(2):
        x = torch.full((n,), float(rank + 10 * round_), device=dev)
        out = torch.empty(n * world, device=dev)
        dist.all_gather_into_tensor(out, x)
        want = torch.cat([torch.full((n,), float(r + 10 * round_), device=dev) for r in range(world)])
        if not torch.equal(out, want):
            failures.append(f"round {round_}: all_gather of a 16 MiB tensor")
        del x, out, want
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        now = case_zero_copy_counts()[2]
        if now <= revoked:
            failures.append(f"round {round_}: empty_cache freed a published segment without revoking it")
        revoked = now
    return failures


@pytest.mark.timeout(300)
def test_cuda_zero_copy(pools):
    """SMDDP_CUDA_ZERO_COPY=1: the same references as the staged path, the same
    AllReduce bits, tensors whose segments are freed and reused between calls;
    with torch's expandable segments (no legacy IPC) and under graph capture
    the calls go through the staging buffers and stay right."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    per_gpu = max(1, 4 // torch.cuda.device_count())
    common = {"SMDDP_CUDA_RANKS_PER_GPU": str(per_gpu), "SMDDP_CUDA_STAGING_BYTES": "1M"}
    zero = pools(4, SMDDP_CUDA_ZERO_COPY="1", **common)
    for failures in zero.run(case_collectives, [0, 7, 4099, (1 << 20) + 3], timeout=150):
        assert failures == []
    for failures in zero.run(case_zero_copy_buffers, (1 << 18) + 5, timeout=150):
        assert failures == []
    # The ranks' tensors are the caching allocator's ordinary segments: at
    # least every call of case_zero_copy_buffers was mapped (24), at most the
    # size-0 AllGathers and ReduceScatters of case_collectives were staged
    # (each in two forms, the ReduceScatters for every op, in every dtype).
    empty_calls = len(DTYPES) * 2 * (1 + len(OPS))
    for mapped, staged, _ in zero.run(case_zero_copy_counts, timeout=60):
        assert mapped >= 24 and staged <= empty_calls, (mapped, staged, empty_calls)
    for failures in zero.run(case_zero_copy_revocation, timeout=120):
        assert failures == []
    sizes = [4099, (1 << 20) + 3]
    assert zero.run(case_allreduce_bits, sizes, timeout=120) == pools(4, **common).run(
        case_allreduce_bits, sizes, timeout=120), "zero-copy AllReduce gives other bits than the staged one"
    expandable = pools(2, SMDDP_CUDA_ZERO_COPY="1", PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True",
                       SMDDP_CUDA_RANKS_PER_GPU=str(max(1, 2 // torch.cuda.device_count())))
    for failures in expandable.run(case_collectives, [7, (1 << 20) + 3], timeout=150):
        assert failures == []
    for mapped, staged, _ in expandable.run(case_zero_copy_counts, timeout=60):
        assert mapped == 0 and staged > 0, (mapped, staged)
    per_gpu = max(1, 2 // torch.cuda.device_count())
    graph = pools(2, SMDDP_CUDA_RANKS_PER_GPU=str(per_gpu), SMDDP_CUDA_SYNC="device", SMDDP_CUDA_ZERO_COPY="1")
    for failures in graph.run(case_zero_copy_buffers, 4099, timeout=150):
        assert failures == []
    before = graph.run(case_zero_copy_counts, timeout=60)
    for failures in graph.run(case_graph_capture, timeout=120):
        assert failures == []
    # The AllReduce made before the capture is mapped, the captured one staged.
    for (m0, s0, _), (m1, s1, _) in zip(before, graph.run(case_zero_copy_counts, timeout=60)):
        assert m1 == m0 + 1 and s1 == s0 + 1, (m0, s0, m1, s1)


# ---------------------------------------------------------------- lifecycle and failures


def case_groups_created_and_destroyed(rounds: int) -> list[str]:
    """Groups made, used on the GPU and destroyed, one after the other: the
    teardown (IPC mappings closed before their owners free them) and the
    keys of each new group."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = _device()
    failures = []
    for i in range(rounds):
        g = dist.new_group(backend="smddp")
        t = torch.full((1 << 16,), float(rank + i), device=dev)
        dist.all_reduce(t, group=g)
        out = torch.empty((1 << 16) * world, device=dev)
        dist.all_gather_into_tensor(out, torch.full((1 << 16,), float(rank), device=dev), group=g)
        torch.cuda.synchronize()
        if not torch.all(t == sum(r + i for r in range(world))):
            failures.append(f"round {i}: all_reduce wrong")
        if not torch.equal(out.view(world, -1)[:, 0].cpu(), torch.arange(world, dtype=torch.float32)):
            failures.append(f"round {i}: all_gather wrong")
        # The teardown leaves the caller's current device alone (a process
        # driving several GPUs may have another one current then).
        other = (dev.index + 1) % torch.cuda.device_count()
        torch.cuda.set_device(other)
        dist.destroy_process_group(g)
        del g
        gc.collect()
        if torch.cuda.current_device() != other:
            failures.append(f"round {i}: the teardown made cuda:{torch.cuda.current_device()} current, not cuda:{other}")
        torch.cuda.set_device(dev)
    return failures


def case_barrier_waits_for_device_work() -> list[str]:
    """barrier() returns only once the device collectives enqueued before it
    have finished (as with nccl)."""
    dev = _device()
    t = torch.ones(1 << 20, device=dev)
    # Half a second of GPU time ahead of the collective on the caller's stream.
    torch.cuda._sleep(int(0.5 * 2e9))
    work = dist.all_reduce(t, async_op=True)
    dist.barrier()
    return [] if work.is_completed() else ["the all_reduce was still running on the GPU after barrier()"]


def case_reduce_scatter_beyond_the_largest_pitch() -> list[str]:
    """A reduce_scatter_tensor whose blocks exceed what one 2D copy's pitch
    takes (about 2 GiB; ZeRO's flat gradients): copied row by row instead."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = _device()
    n = (1 << 29) + 8  # elements per rank: 2 GiB + 32 bytes of float32
    inp = torch.full((n * world,), float(rank + 1), device=dev)
    out = torch.empty(n, device=dev)
    dist.reduce_scatter_tensor(out, inp)
    torch.cuda.synchronize()
    want = world * (world + 1) / 2
    ok = bool(torch.all(out == want))
    del inp, out
    torch.cuda.empty_cache()
    return [] if ok else ["reduce_scatter_tensor with blocks beyond the largest pitch: wrong values"]


def _outcome(work, bound_s: float = 30.0) -> tuple[str, str]:
    """(the exception's type name, its message) of an async work once it has
    completed (polled, at most `bound_s`), or ("no error", "")."""
    t0 = time.time()
    while not work.is_completed() and time.time() - t0 < bound_s:
        time.sleep(0.05)
    try:
        work.wait()
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, str(e)
    return "no error", ""


def case_stalled_device_work(dump_prefix: str) -> dict:
    """The caller's stream is busy past the group's timeout when the
    collective is enqueued: the watchdog fails it, the group becomes
    unusable, and the flight recorder is dumped. The group's CUDA path is set
    up first: setting it up loads smddp's kernels, which waits on the calling
    thread for the device to finish what is queued on it."""
    dev = _device()
    t = torch.ones(1 << 16, device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(12 * 2e9))  # past the 5 s timeout
    out: dict = {"first": _outcome(dist.all_reduce(t, async_op=True))}
    try:
        dist.all_reduce(torch.ones(4))
        out["next"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["next"] = str(e)
    out["dumps"] = sorted(glob.glob(dump_prefix + ".*.json"))
    return out


@pytest.mark.timeout(200)
def test_cuda_groups_created_and_destroyed(pools):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    pool = pools(2, SMDDP_CUDA_RANKS_PER_GPU=str(max(1, 2 // torch.cuda.device_count())))
    for failures in pool.run(case_groups_created_and_destroyed, 3, timeout=180):
        assert failures == []


@pytest.mark.timeout(120)
def test_cuda_barrier_waits_for_device_work(pools):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    pool = pools(2, SMDDP_CUDA_RANKS_PER_GPU=str(max(1, 2 // torch.cuda.device_count())))
    for failures in pool.run(case_barrier_waits_for_device_work, timeout=100):
        assert failures == []


@pytest.mark.timeout(300)
def test_cuda_reduce_scatter_beyond_the_largest_pitch(pools):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    free, _ = torch.cuda.mem_get_info()
    if free < 28 << 30:
        pytest.skip("needs 28 GiB of GPU memory")
    pool = pools(2, SMDDP_CUDA_RANKS_PER_GPU=str(max(1, 2 // torch.cuda.device_count())))
    for failures in pool.run(case_reduce_scatter_beyond_the_largest_pitch, timeout=280):
        assert failures == []


@pytest.mark.timeout(150)
def test_cuda_ipc_off_stages_through_the_host(pools):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    pool = pools(2, SMDDP_CUDA_RANKS_PER_GPU="2", SMDDP_CUDA_IPC="0")
    for failures in pool.run(case_collectives, [0, 7, 4099], timeout=120):
        assert failures == []


@pytest.mark.timeout(150)
def test_cuda_stalled_collective_fails_within_the_timeout(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    from dist_harness import RankPool

    prefix = str(tmp_path / "dump")
    pool = RankPool(2, env={"SMDDP_CUDA_RANKS_PER_GPU": "2", "SMDDP_DEBUG_DUMP": prefix}, pg_timeout=5.0)
    try:
        results = pool.run(case_stalled_device_work, prefix, timeout=120)
    finally:
        pool.kill()
    for rank, r in enumerate(results):
        kind, msg = r["first"]
        assert kind == "DistBackendError", (rank, r)
        assert "did not finish within the group's timeout" in msg and "allreduce #" in msg, (rank, msg)
        # What it waits on, and where the ranks' last collectives are.
        assert "it waits on rank" in msg and "dumped to" in msg, (rank, msg)
        assert f"rank {rank}" in msg, (rank, msg)
        assert "unusable" in r["next"], (rank, r["next"])
        assert any(p.endswith(f".{rank}.json") for p in r["dumps"]), (rank, r["dumps"])


@pytest.mark.timeout(150)
def test_cuda_batched_copies(pools):
    """SMDDP_CUDA_BATCH_COPIES=1 (one cudaMemcpyBatchAsync to or from every
    peer) against the same reference as the copies one after another."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    per_gpu = max(1, 4 // torch.cuda.device_count())
    pool = pools(4, SMDDP_CUDA_RANKS_PER_GPU=str(per_gpu), SMDDP_CUDA_STAGING_BYTES="1M",
                 SMDDP_CUDA_BATCH_COPIES="1")
    for failures in pool.run(case_collectives, [0, 7, 4099, (1 << 20) + 3], timeout=120):
        assert failures == []


def _captured_allreduce(n: int, mode: str = "thread_local") -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """A native AllReduce of n floats captured in a CUDA graph (the
    communicator made by an eager call first, outside the capture)."""
    x = torch.zeros(n, device=_device())
    dist.all_reduce(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode=mode):
        dist.all_reduce(x)
    return graph, x


def _replay_failures(graph: torch.cuda.CUDAGraph, x: torch.Tensor, rounds: int, also=lambda i: None) -> list[str]:
    """Replays of a captured AllReduce with new inputs, each checked; `also(i)`
    may name another failure after replay i."""
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []
    for i in range(rounds):
        x.fill_(float(rank + 10 * i))
        graph.replay()
        torch.cuda.synchronize()
        want = float(sum(r + 10 * i for r in range(world)))
        if not torch.all(x == want):
            failures.append(f"replay {i}: {x[:2].tolist()}, expected {want}")
        failures += [f for f in [also(i)] if f]
    return failures


def case_graph_capture(modes: tuple[str, ...] = ("thread_local",)) -> list[str]:
    """A native AllReduce captured in a CUDA graph and replayed: the ranks
    meet through device flags, so each replay synchronizes them anew. In
    torch's default (global) capture mode, the backend's own threads'
    allocations and event queries must not break the capture."""
    failures = []
    for mode in modes:
        try:
            failures += [f"{mode}: {f}" for f in _replay_failures(*_captured_allreduce(1024, mode), rounds=4)]  # 4 KiB
        except Exception as e:  # a capture the mode breaks: named, and the modes before it still count
            failures.append(f"{mode}: {type(e).__name__}: {e}")
            break
    return failures


@pytest.mark.timeout(200)
def test_cuda_device_sync(pools):
    """SMDDP_CUDA_SYNC=device: the node's ranks meet through flags on the
    GPU; the same references and stream semantics as host synchronization."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    per_gpu = max(1, 2 // torch.cuda.device_count())
    pool = pools(2, SMDDP_CUDA_RANKS_PER_GPU=str(per_gpu), SMDDP_CUDA_STAGING_BYTES="1M", SMDDP_CUDA_SYNC="device")
    for failures in pool.run(case_collectives, [0, 7, 4099, (1 << 20) + 3], timeout=150):
        assert failures == []
    for failures in pool.run(case_streams_overlap_and_lifetime, timeout=120):
        assert failures == []


@pytest.mark.timeout(250)
@pytest.mark.parametrize("batch", ["0", "1"])
def test_cuda_memops_sync(pools, batch):
    """SMDDP_CUDA_SYNC=memops: the node's ranks meet through the streams' own
    memory operations; the same references and stream semantics as host
    synchronization, captured and replayed in both capture modes, and with
    zero-copy and one-shot calls mixed with staged ones (the flags return to
    rest after every exchange, which is what lets a graph replay them).
    SMDDP_CUDA_BATCH_MEMOPS=1: each step in one driver call."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    per_gpu = max(1, 2 // torch.cuda.device_count())
    common = {"SMDDP_CUDA_RANKS_PER_GPU": str(per_gpu), "SMDDP_CUDA_STAGING_BYTES": "1M", "SMDDP_CUDA_SYNC": "memops",
              "SMDDP_CUDA_BATCH_MEMOPS": batch}
    pool = pools(2, **common)
    for failures in pool.run(case_collectives, [0, 7, 4099, (1 << 20) + 3], timeout=150):
        assert failures == []
    for text in pool.run(case_describe, timeout=30):
        assert ("batched memops sync" in text) == (batch == "1"), text
    for failures in pool.run(case_streams_overlap_and_lifetime, timeout=120):
        assert failures == []
    for failures in pool.run(case_graph_capture, ("thread_local", "global"), timeout=120):
        assert failures == []
    mixed = pools(2, SMDDP_CUDA_ZERO_COPY="1", SMDDP_CUDA_ONESHOT_BYTES="64K", **common)
    for failures in mixed.run(case_collectives, [0, 7, 4099, (1 << 20) + 3], timeout=150):
        assert failures == []
    for failures in mixed.run(case_zero_copy_buffers, 4099, timeout=150):
        assert failures == []
    for failures in mixed.run(case_graph_capture, timeout=120):
        assert failures == []
    for mapped, _, _ in mixed.run(case_zero_copy_counts, timeout=60):
        assert mapped > 0, mapped


def case_stalled_peer(stall_s: float) -> dict:
    """Rank 1's stream is busy for `stall_s`, past the group's timeout, when
    the collective is enqueued; rank 0's stream waits for rank 1's flags on
    the GPU. Rank 0's watchdog fails the call, and the abort must end rank
    0's waits on the device: its stream drains long before rank 1's stall."""
    dev, rank = _device(), dist.get_rank()
    t = torch.ones(1 << 10, device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    if rank == 1:
        torch.cuda._sleep(int(stall_s * 2e9))
    t0 = time.time()
    out: dict = {"first": _outcome(dist.all_reduce(t, async_op=True)), "failed_after_s": time.time() - t0}
    t1 = time.time()
    torch.cuda.synchronize()
    out["drained_s"] = time.time() - t1
    return out


@pytest.mark.timeout(150)
@pytest.mark.parametrize("sync", ["device", "memops", "memops+batch"])
def test_cuda_waits_on_a_stalled_peer_end_at_the_abort(tmp_path, sync):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    from dist_harness import RankPool

    per_gpu = max(1, 2 // torch.cuda.device_count())
    env = {"SMDDP_CUDA_RANKS_PER_GPU": str(per_gpu), "SMDDP_CUDA_SYNC": sync.split("+")[0],
           "SMDDP_CUDA_BATCH_MEMOPS": "1" if sync.endswith("+batch") else "0"}
    pool = RankPool(2, env=env, pg_timeout=5.0)
    try:
        results = pool.run(case_stalled_peer, 15.0, timeout=120)
    finally:
        pool.kill()
    r = results[0]
    kind, msg = r["first"]
    assert kind == "DistBackendError" and "did not finish within the group's timeout" in msg, r
    assert r["failed_after_s"] < 12, r
    # Released at the abort, not when rank 1's stall ends (15 s after the call).
    assert r["failed_after_s"] + r["drained_s"] < 12, r


def case_allreduce_bits(sizes: list[int]) -> dict[str, str]:
    """Every rank's AllReduce results, as digests of their bytes, for inputs
    whose sums round (so that the order of the additions shows)."""
    import hashlib

    rank, dev = dist.get_rank(), _device()
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            for n in sizes:
                g = torch.Generator().manual_seed(1000 * rank + n)
                x = (torch.randn(n, generator=g) * 10 ** (rank % 3)).to(dtype).to(dev)
                dist.all_reduce(x, op=op)
                key = f"{dtype} {op} {n}"
                out[key] = hashlib.sha256(x.cpu().view(torch.uint8).numpy().tobytes()).hexdigest()
    return out


@pytest.mark.timeout(250)
def test_cuda_one_shot_allreduce(pools):
    """SMDDP_CUDA_ONESHOT_BYTES: small AllReduces in one step, the same
    references and the same bits as the two-step path; with device flags it
    can be captured in a CUDA graph."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    per_gpu = max(1, 4 // torch.cuda.device_count())
    sizes = [1, 7, 4099, 16381]  # up to 64 KiB of float32: one shot
    common = {"SMDDP_CUDA_RANKS_PER_GPU": str(per_gpu), "SMDDP_CUDA_STAGING_BYTES": "1M"}
    one = pools(4, SMDDP_CUDA_ONESHOT_BYTES="64K", **common)
    for failures in one.run(case_collectives, [0, 7, 4099, (1 << 20) + 3], timeout=120):
        assert failures == []
    bits = one.run(case_allreduce_bits, sizes, timeout=120)
    two = pools(4, **common).run(case_allreduce_bits, sizes, timeout=120)
    assert bits == two, "the one-shot AllReduce gives other bits than the two-step one"
    per_gpu = max(1, 2 // torch.cuda.device_count())
    graph = pools(2, SMDDP_CUDA_RANKS_PER_GPU=str(per_gpu), SMDDP_CUDA_SYNC="device", SMDDP_CUDA_ONESHOT_BYTES="64K")
    for failures in graph.run(case_graph_capture, timeout=120):
        assert failures == []


@pytest.mark.timeout(150)
@pytest.mark.parametrize("batch", ["0", "1"])
def test_cuda_graph_capture(pools, batch):
    """Capture with device flags; with SMDDP_CUDA_BATCH_COPIES=1 the copies
    of a captured call go one after another (a graph has no batch node)."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    per_gpu = max(1, 2 // torch.cuda.device_count())
    pool = pools(2, SMDDP_CUDA_RANKS_PER_GPU=str(per_gpu), SMDDP_CUDA_SYNC="device", SMDDP_CUDA_BATCH_COPIES=batch)
    for failures in pool.run(case_graph_capture, ("thread_local", "global"), timeout=120):
        assert failures == []


def case_capture_refused() -> list[str]:
    """A capture of a collective whose node meets in host rounds: refused on
    every rank with what to set, before anything joins the capture; the
    group goes on."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.ones(1024, device=_device())
    dist.all_reduce(x)
    torch.cuda.synchronize()
    failures, messages = [], []
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            dist.all_reduce(x)
    except Exception as e:  # the refusal, or a capture error chained to it
        while e is not None:
            messages.append(str(e))
            e = e.__context__
    text = " | ".join(messages)
    if "captured into a CUDA graph" not in text or "SMDDP_CUDA_SYNC=device" not in text or f"rank {rank}" not in text:
        failures.append(f"no refusal naming the rank and SMDDP_CUDA_SYNC=device: {text or 'the capture succeeded'}")
    x.fill_(float(rank))
    dist.all_reduce(x)
    torch.cuda.synchronize()
    want = float(sum(range(world)))
    if not torch.all(x == want):
        failures.append(f"after the refusal: {x[:2].tolist()}, expected {want}")
    return failures


@pytest.mark.timeout(100)
def test_cuda_capture_needs_device_sync(pools):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    per_gpu = max(1, 2 // torch.cuda.device_count())
    pool = pools(2, SMDDP_CUDA_RANKS_PER_GPU=str(per_gpu))
    for failures in pool.run(case_capture_refused, timeout=90):
        assert failures == []


def case_zero_copy_mixed_nodes(sizes: list[int]) -> list[str]:
    """Node 0 maps its tensors while node 1 stages every call (its tensors
    come through DLPack, memory whose free torch does not announce): the
    nodes decide apart, so their rails must still meet the same NCCL calls,
    and AllReduce's slices must hold the same elements on both. Sizes with
    empty slices and sizes of several chunks; SUM and AVG; float32 and
    bfloat16."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = _device()
    staging_node = rank >= world // 2

    def own(t: torch.Tensor) -> torch.Tensor:
        return torch.from_dlpack(t) if staging_node else t

    mapped0, staged0, _ = case_zero_copy_counts()
    failures = []
    calls = 0
    for n in sizes:
        for dtype in (torch.float32, torch.bfloat16):
            for name, op in (("SUM", dist.ReduceOp.SUM), ("AVG", dist.ReduceOp.AVG)):
                what = f"n={n} {dtype} {name}"
                salt = n % 97
                x = own(_input(rank, n, dtype, dev, salt=salt))
                out = own(torch.zeros(n * world, dtype=dtype, device=dev))
                dist.all_gather_into_tensor(out, x)
                if not torch.equal(out, torch.cat([_input(r, n, dtype, dev, salt=salt) for r in range(world)])):
                    failures.append(f"all_gather {what}")
                factor = 1.0 / world if name == "AVG" else 1.0
                inp = own(_input(rank, n * world, dtype, dev, salt=salt + 10))
                o = own(torch.empty(n, dtype=dtype, device=dev))
                dist.reduce_scatter_tensor(o, inp, op=op)
                want = _reference([_input(r, n * world, dtype, dev, salt=salt + 10) for r in range(world)], name, factor)
                t = own(_input(rank, n, dtype, dev, salt=salt + 20))
                dist.all_reduce(t, op=op)
                want_ar = _reference([_input(r, n, dtype, dev, salt=salt + 20) for r in range(world)], name, factor)
                calls += 3
                try:
                    _close(o, want[rank * n:(rank + 1) * n], dtype, f"reduce_scatter {what}")
                    _close(t, want_ar, dtype, f"all_reduce {what}")
                except AssertionError as e:
                    failures.append(str(e))
    mapped, staged, _ = case_zero_copy_counts()
    # Every call (none is empty) mapped on node 0 and staged on node 1.
    if staging_node and staged - staged0 < calls:
        failures.append(f"rank {rank}: {staged - staged0} of {calls} calls staged on the staging node")
    if not staging_node and mapped - mapped0 < calls:
        failures.append(f"rank {rank}: {mapped - mapped0} of {calls} calls mapped on the mapping node")
    return failures


# ---- the rails schedules with ranks sharing one GPU: each process its own
# host to NCCL (SMDDP_CUDA_INTER_NODE=nccl with SMDDP_CUDA_RANKS_PER_GPU), the
# rails over NCCL's network transport. Last in the file: on the GPU check's
# one GPU they take what time the other tests leave.


def _one_gpu_rails(world: int) -> dict[str, str]:
    return {"SMDDP_CUDA_RANKS_PER_GPU": str(world), "SMDDP_CUDA_INTER_NODE": "nccl",
            "SMDDP_CUDA_STAGING_BYTES": "1M"}  # fmt: skip


@pytest.mark.timeout(300)
def test_cuda_rails_on_one_gpu(pools):
    """2 emulated nodes x 2 ranks on one GPU through the rails schedule: NCCL
    rails between the nodes, CUDA IPC inside them, unpipelined with the rail
    AllGather as send/recv, pipelined with it as ncclAllGather."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    for pipeline, rail_allgather in (("0", "sendrecv"), ("1", "nccl")):
        pool = pools(4, SMDDP_RANKS_PER_NODE="2", SMDDP_CUDA_PIPELINE=pipeline,
                     SMDDP_CUDA_RAIL_ALLGATHER=rail_allgather, **_one_gpu_rails(4))  # fmt: skip
        for failures in pool.run(case_collectives, [0, 7, 4099, 300003], timeout=200):
            assert failures == [], f"SMDDP_CUDA_PIPELINE={pipeline} SMDDP_CUDA_RAIL_ALLGATHER={rail_allgather}"
        # The CUDA communicator is made by the first CUDA collective.
        for text in pool.run(case_describe, timeout=120):
            assert "nccl rails" in text, text


@pytest.mark.timeout(300)
@pytest.mark.parametrize("pipeline", ["0", "1"])
def test_cuda_rails_zero_copy_on_one_gpu(pools, pipeline):
    """SMDDP_CUDA_ZERO_COPY=1 over the rails (2 emulated nodes x 2 ranks on one
    GPU): the node stage reads the peers' tensors, the results are the staged
    path's (AllReduce bit for bit: the same slices and rail calls), the calls
    are mapped. SMDDP_CUDA_PIPELINE=1: the node stage chunk by chunk beside
    the rail's (the larger sizes span several chunks of the 1M staging
    buffer's). One node mapping while the other stages gives the same
    results."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    rails = {"SMDDP_RANKS_PER_NODE": "2", "SMDDP_CUDA_PIPELINE": pipeline, **_one_gpu_rails(4)}
    zero = pools(4, SMDDP_CUDA_ZERO_COPY="1", **rails)
    for failures in zero.run(case_collectives, [0, 7, 4099, 300003], timeout=200):
        assert failures == []
    for text in zero.run(case_describe, timeout=120):
        assert "nccl rails" in text and "zero-copy" in text, text
    for failures in zero.run(case_zero_copy_buffers, (1 << 18) + 5, timeout=150):
        assert failures == []
    # Every call of case_zero_copy_buffers mapped (24).
    for mapped, _, _ in zero.run(case_zero_copy_counts, timeout=60):
        assert mapped >= 24, mapped
    for failures in zero.run(case_zero_copy_mixed_nodes, [7, 4099, 300003], timeout=180):
        assert failures == []
    sizes = [4099, 300003]
    assert zero.run(case_allreduce_bits, sizes, timeout=120) == pools(4, **rails).run(
        case_allreduce_bits, sizes, timeout=120), "zero-copy AllReduce over the rails gives other bits than the staged one"


@pytest.mark.timeout(200)
def test_cuda_one_rank_per_node_on_one_gpu(pools):
    """2 emulated nodes x 1 rank on one GPU: NCCL's collectives on the
    group's buffers (PREMUL_SUM through the node stage)."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    pool = pools(2, SMDDP_RANKS_PER_NODE="1", **_one_gpu_rails(2))
    for failures in pool.run(case_collectives, [0, 7, 4099, 300003], timeout=150):
        assert failures == []
    for text in pool.run(case_describe, timeout=120):
        assert "one rank per node" in text, text


def case_rails_graph_keeps_its_scratch() -> list[str]:
    """An AllReduce over the rails captured in a CUDA graph, then a larger
    eager one that outgrows the scratch the graph writes into, then tensors
    that would take that scratch's memory if it had been freed: every
    replay's result is right and those tensors keep their values."""
    world = dist.get_world_size()
    dev = _device()
    graph, x = _captured_allreduce(1 << 16)
    big = torch.ones(1 << 22, device=dev)
    dist.all_reduce(big)
    torch.cuda.synchronize()
    # As large as the scratch the graph uses (half of x per rank, over 2 local
    # ranks), so that the allocator would hand that block out again.
    guards = [torch.full((n,), 7.0, device=dev) for n in (1 << 15, 1 << 15, 1 << 16, 1 << 15, 1 << 14) * 2]
    failures = [] if torch.all(big == float(world)) else ["the larger AllReduce is wrong"]

    def guards_kept(i: int) -> str | None:
        if all(bool(torch.all(g == 7.0)) for g in guards):
            return None
        return f"replay {i} wrote into memory the allocator had handed out again"

    return failures + _replay_failures(graph, x, 3, guards_kept)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("pipeline,sync", [("0", "device"), ("1", "memops")])
def test_cuda_rails_graph_capture_on_one_gpu(pools, pipeline, sync):
    """The rails schedule with device synchronization (kernels, or the
    streams' memory operations), captured in a CUDA graph (2 emulated nodes
    x 2 on one GPU): replays stay right after a larger call has grown the
    scratch the graph uses. SMDDP_CUDA_PIPELINE=1: the rail's stream forked
    from the captured stream and joined again."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    pool = pools(4, SMDDP_RANKS_PER_NODE="2", SMDDP_CUDA_SYNC=sync, SMDDP_CUDA_PIPELINE=pipeline,
                 **_one_gpu_rails(4))  # fmt: skip
    for failures in pool.run(case_rails_graph_keeps_its_scratch, timeout=150):
        assert failures == []
    # NCCL's rail calls under torch's default (global) capture mode too.
    for failures in pool.run(case_graph_capture, ("thread_local", "global"), timeout=120):
        assert failures == []
