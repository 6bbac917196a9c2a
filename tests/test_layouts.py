"""Tensors as users have them: strided views, per-rank sizes, sparse gradients.

The native collectives work on flat buffers, but a torch user may pass any
strided tensor: a transposed matrix, a channels_last activation, every other
column of a larger buffer, or one rank's tensor in a layout that differs from
its peers'. Each of these must give the result of the collective on the
tensors' values (as `tensor.tolist()` sees them), leave every element outside
a view untouched, and work on every route (single node, emulated nodes).

Outputs and inputs may share memory, as views of one buffer: in the
in-place layout (one rank's block of the larger tensor) and otherwise.

The list forms take one size per rank (all_gather with outputs of different
sizes, as nccl allows, and reduce_scatter with inputs of different sizes, as
gloo allows). A sparse all_reduce (DDP's gradients of sparse embeddings) is
served by the fallback. (An output whose elements share memory cannot be
written: test_errors.py checks that it is refused.)

Every expected value is computed by each rank from the inputs every rank
draws (seeded by rank), with integer values that float32 sums exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
from dist_harness import assert_no_failures

SENTINEL = -7  # what lies outside a view, and must stay there
SMALL = (3, 5)
# 68K elements: more than the 32K per rank from which a 2-rank node reads
# peers' buffers directly instead of through the staging slots.
LARGE = (130, 131)
LAYOUTS = ("transposed", "strided", "contiguous")
# (input, output) layouts of the calls with both: all but the plain pair.
LAYOUT_PAIRS = tuple((i, o) for i in LAYOUTS for o in LAYOUTS if (i, o) != ("contiguous", "contiguous"))


def _setup() -> None:
    torch.set_num_threads(1)


def _values(rank: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32, salt: int = 0) -> torch.Tensor:
    n = math.prod(shape)
    return ((torch.arange(n, dtype=torch.int64) * 7 + rank * 13 + salt * 5) % 101).to(dtype).reshape(shape)


def _as_layout(v: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`v`'s values in `layout`; and the buffer around the view, if any."""
    if layout == "contiguous":
        return v.clone(), None
    if layout == "transposed":
        return v.t().contiguous().t(), None
    if layout == "channels_last":
        return v.contiguous(memory_format=torch.channels_last), None
    if layout == "strided":
        # Every other column of a buffer twice as wide.
        buf = torch.full((v.shape[0], 2 * v.shape[1]), SENTINEL, dtype=v.dtype)
        view = buf[:, ::2]
        view.copy_(v)
        return view, buf
    raise ValueError(layout)


def _check(
    failures: list[str], what: str, got: torch.Tensor, want: torch.Tensor, buf: torch.Tensor | None, exact: bool = True
) -> None:
    ok = torch.equal(got, want) if exact else torch.allclose(got.double(), want.double(), rtol=1e-6, atol=1e-6)
    if not ok:
        bad = (got != want).nonzero()[:3].tolist() if got.shape == want.shape else "shape"
        failures.append(
            f"{what}: wrong values (first bad indices {bad}; got {got.flatten()[:6].tolist()}, "
            f"want {want.flatten()[:6].tolist()})"
        )
    if buf is not None and not torch.all(buf[:, 1::2] == SENTINEL):
        failures.append(f"{what}: elements outside the view were written")


def _reduced(parts: list[torch.Tensor], op: str) -> torch.Tensor:
    if op == "SUM":
        return sum(parts)
    if op == "AVG":
        return sum(parts) / len(parts)
    if op == "MAX":
        return torch.stack(parts).amax(0)
    raise ValueError(op)


def _layout_for(rank: int, layout: str) -> str:
    # "mixed": every rank its own layout, so that a backend that reduces the
    # bytes in memory order (and not the values) gets it wrong.
    return LAYOUTS[rank % len(LAYOUTS)] if layout == "mixed" else layout


def case_all_reduce(world_tag: str) -> list[str]:
    _setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    failures: list[str] = []
    for shape in (SMALL, LARGE):
        for layout in ("transposed", "strided", "mixed"):
            for dtype, op in (
                (torch.float32, "SUM"),
                (torch.int64, "SUM"),
                (torch.float32, "AVG"),
                (torch.int32, "MAX"),
            ):
                what = f"{world_tag} all_reduce {op} {dtype} {shape} {layout}"
                t, buf = _as_layout(_values(rank, shape, dtype), _layout_for(rank, layout))
                work = dist.all_reduce(t, op=getattr(dist.ReduceOp, op), async_op=True)
                work.wait()
                want = _reduced([_values(k, shape, torch.float64) for k in range(world)], op).to(dtype)
                _check(failures, what, t, want, buf, exact=op != "AVG")
                if work.result()[0].data_ptr() != t.data_ptr():
                    failures.append(f"{what}: the work's result is not the caller's tensor")
    # channels_last, alone and next to contiguous peers.
    shape4 = (2, 3, 4, 5)
    for mixed in (False, True):
        layout = "contiguous" if mixed and rank % 2 == 0 else "channels_last"
        t, _ = _as_layout(_values(rank, shape4), layout)
        dist.all_reduce(t)
        _check(
            failures,
            f"{world_tag} all_reduce channels_last mixed={mixed}",
            t,
            sum(_values(k, shape4) for k in range(world)),
            None,
        )
        if layout == "channels_last" and not t.is_contiguous(memory_format=torch.channels_last):
            failures.append(f"{world_tag} all_reduce channels_last: the tensor changed its layout")
    # The coalesced form, contiguous and not side by side.
    ts = [
        _as_layout(_values(rank, SMALL, salt=i), lay) for i, lay in enumerate(("contiguous", "transposed", "strided"))
    ]
    dist.all_reduce_coalesced([t for t, _ in ts])
    for i, (t, buf) in enumerate(ts):
        _check(
            failures,
            f"{world_tag} all_reduce_coalesced tensor {i}",
            t,
            sum(_values(k, SMALL, salt=i) for k in range(world)),
            buf,
        )
    return failures


def case_broadcast(world_tag: str) -> list[str]:
    _setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    failures: list[str] = []
    for shape in (SMALL, LARGE):
        for layout in ("transposed", "strided", "mixed"):
            for root in (0, world - 1):
                t, buf = _as_layout(_values(rank, shape), _layout_for(rank, layout))
                dist.broadcast(t, src=root)
                _check(failures, f"{world_tag} broadcast {shape} {layout} root {root}", t, _values(root, shape), buf)
    return failures


def case_all_gather(world_tag: str) -> list[str]:
    _setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    failures: list[str] = []
    for shape in (SMALL, LARGE):
        a, b = shape
        want = torch.cat([_values(k, shape) for k in range(world)])
        for lin, lout in LAYOUT_PAIRS:
            what = f"{world_tag} all_gather_into_tensor {shape} input {lin} output {lout}"
            inp, _ = _as_layout(_values(rank, shape), lin)
            out, buf = _as_layout(torch.full((world * a, b), SENTINEL + 1.0), lout)
            dist.all_gather_into_tensor(out, inp)
            _check(failures, what, out, want, buf)
            if inp.tolist() != _values(rank, shape).tolist():
                failures.append(f"{what}: the input changed")
        # The list form, every output transposed or strided.
        outs = [_as_layout(torch.zeros(shape), LAYOUTS[k % 2]) for k in range(world)]
        dist.all_gather([o for o, _ in outs], _as_layout(_values(rank, shape), "strided")[0])
        for k, (o, buf) in enumerate(outs):
            _check(failures, f"{world_tag} all_gather list {shape} output {k}", o, _values(k, shape), buf)
    # Coalesced (FSDP1 and DTensor gather this way).
    pairs = []
    with dist._coalescing_manager():
        for i, (lin, lout) in enumerate((("transposed", "strided"), ("contiguous", "transposed"))):
            inp, _ = _as_layout(_values(rank, SMALL, salt=i), lin)
            out, buf = _as_layout(torch.zeros(world * SMALL[0], SMALL[1]), lout)
            dist.all_gather_into_tensor(out, inp)
            pairs.append((out, buf))
    for i, (out, buf) in enumerate(pairs):
        _check(
            failures,
            f"{world_tag} allgather_into_tensor_coalesced tensor {i}",
            out,
            torch.cat([_values(k, SMALL, salt=i) for k in range(world)]),
            buf,
        )
    return failures


def case_reduce_scatter(world_tag: str) -> list[str]:
    _setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    failures: list[str] = []
    for shape in (SMALL, LARGE):
        a, b = shape
        whole = (world * a, b)
        want = sum(_values(k, whole) for k in range(world))[rank * a : (rank + 1) * a]
        for lin, lout in LAYOUT_PAIRS:
            what = f"{world_tag} reduce_scatter_tensor {shape} input {lin} output {lout}"
            inp, _ = _as_layout(_values(rank, whole), lin)
            out, buf = _as_layout(torch.full(shape, SENTINEL + 1.0), lout)
            dist.reduce_scatter_tensor(out, inp)
            _check(failures, what, out, want, buf)
        # The list form with a strided output.
        out, buf = _as_layout(torch.zeros(shape), "strided")
        dist.reduce_scatter(out, [_as_layout(_values(rank, shape, salt=k), "transposed")[0] for k in range(world)])
        _check(
            failures,
            f"{world_tag} reduce_scatter list {shape}",
            out,
            sum(_values(j, shape, salt=rank) for j in range(world)),
            buf,
        )
    pairs = []
    with dist._coalescing_manager():
        for i, lay in enumerate(("strided", "transposed")):
            out, buf = _as_layout(torch.zeros(SMALL), lay)
            dist.reduce_scatter_tensor(out, _as_layout(_values(rank, (world * SMALL[0], SMALL[1]), salt=i), lay)[0])
            pairs.append((out, buf))
    for i, (out, buf) in enumerate(pairs):
        want = sum(_values(k, (world * SMALL[0], SMALL[1]), salt=i) for k in range(world))
        _check(
            failures,
            f"{world_tag} reduce_scatter_tensor_coalesced tensor {i}",
            out,
            want[rank * SMALL[0] : (rank + 1) * SMALL[0]],
            buf,
        )
    return failures


def _uneven_shapes(world: int, large: bool) -> list[tuple[int, ...]]:
    # One rank with nothing, 1-D and 2-D blocks, none of them the same size.
    base = 40000 if large else 0
    return [(0,) if k == 1 else ((base + 3 * k + 2,) if k % 2 == 0 else (2, base // 2 + k + 1)) for k in range(world)]


def case_uneven(world_tag: str) -> list[str]:
    _setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    failures: list[str] = []
    for large in (False, True):
        shapes = _uneven_shapes(world, large)
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            outs = [torch.full(s, SENTINEL, dtype=dtype) for s in shapes]
            work = dist.all_gather(outs, _values(rank, shapes[rank], dtype), async_op=True)
            work.wait()
            for k, o in enumerate(outs):
                _check(
                    failures,
                    f"{world_tag} all_gather uneven {dtype} large={large} from rank {k}",
                    o,
                    _values(k, shapes[k], dtype),
                    None,
                )
            for op in ("SUM", "MAX", "AVG"):
                if op == "AVG" and not dtype.is_floating_point:
                    continue
                out = torch.full(shapes[rank], SENTINEL, dtype=dtype)
                ins = [_values(rank, s, dtype, salt=k) for k, s in enumerate(shapes)]
                dist.reduce_scatter(out, ins, op=getattr(dist.ReduceOp, op))
                parts = [_values(j, shapes[rank], torch.float64, salt=rank) for j in range(world)]
                want = _reduced(parts, op).to(dtype)
                _check(
                    failures,
                    f"{world_tag} reduce_scatter uneven {op} {dtype} large={large}",
                    out,
                    want,
                    None,
                    exact=op != "AVG",
                )
    return failures


def case_sparse(world_tag: str) -> list[str]:
    _setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    failures: list[str] = []
    n = 3 * world
    for async_op in (False, True):
        idx = torch.tensor([[rank, rank + world, n - 1]])
        s = torch.sparse_coo_tensor(idx, torch.tensor([1.0, 2.0, float(rank)]), (n,))
        work = dist.all_reduce(s, async_op=async_op)
        if async_op:
            work.wait()
            s = work.result()[0]
        want = torch.zeros(n)
        for k in range(world):
            want[k] += 1.0
            want[k + world] += 2.0
            want[n - 1] += float(k)
        _check(failures, f"{world_tag} sparse all_reduce async={async_op}", s.to_dense(), want, None)
    # DDP reduces an embedding's sparse gradient through the same call.
    from torch.nn.parallel import DistributedDataParallel as DDP

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.EmbeddingBag(16, 4, mode="sum", sparse=True), torch.nn.Linear(4, 1))

    def batch(k: int) -> torch.Tensor:
        return torch.tensor([[k, (3 * k + 1) % 16, 7]])

    ddp = DDP(model())
    ddp(batch(rank)).sum().backward()
    got = ddp.module[0].weight.grad.coalesce().to_dense()
    grads = []
    for k in range(world):
        local = model()
        local(batch(k)).sum().backward()
        grads.append(local[0].weight.grad.coalesce().to_dense())
    _check(failures, f"{world_tag} DDP sparse embedding gradient", got, sum(grads) / world, None, exact=False)
    return failures


def case_overlap(world_tag: str) -> list[str]:
    """Outputs and inputs that share memory other than in the in-place layout
    (a block of another rank, a range across two blocks): the result of the
    collective on the values as they were when it was called, as gloo gives."""
    _setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    failures: list[str] = []
    # The largest is read across emulated nodes by single-copy reads too.
    for n in (math.prod(SMALL), math.prod(LARGE), (1 << 18) + 3):
        starts = {"own block": rank * n, "next rank's block": (rank + 1) % world * n, "across blocks": n // 2}
        for where, s in starts.items():
            what = f"{world_tag} reduce_scatter_tensor {n} output in the input at {where}"
            inp = _values(rank, (world * n,))
            before = inp.clone()
            want = sum(_values(k, (world * n,)) for k in range(world))[rank * n : (rank + 1) * n]
            out = inp[s : s + n]
            dist.reduce_scatter_tensor(out, inp)
            _check(failures, what, out, want, None)
            rest = torch.ones(world * n, dtype=torch.bool)
            rest[s : s + n] = False
            if not torch.equal(inp[rest], before[rest]):
                failures.append(f"{what}: input outside the output changed")

            what = f"{world_tag} all_gather_into_tensor {n} input in the output at {where}"
            whole = torch.full((world * n,), SENTINEL + 1.0)
            view = whole[s : s + n]
            view.copy_(_values(rank, (n,)))
            dist.all_gather_into_tensor(whole, view)
            _check(failures, what, whole, torch.cat([_values(k, (n,)) for k in range(world)]), None)
    # A coalesced pair whose output lies across two blocks of its input.
    n = math.prod(SMALL)
    inp = _values(rank, (world * n,))
    with dist._coalescing_manager():
        dist.reduce_scatter_tensor(inp[n // 2 : n // 2 + n], inp)
    want = sum(_values(k, (world * n,)) for k in range(world))[rank * n : (rank + 1) * n]
    _check(failures, f"{world_tag} reduce_scatter_tensor_coalesced output across blocks", inp[n // 2 : n // 2 + n], want, None)
    return failures


CASES = (
    case_all_reduce, case_broadcast, case_all_gather, case_reduce_scatter, case_uneven, case_sparse, case_overlap
)
CONFIGS = {
    # 3 ranks: uneven sizes with one rank of nothing; 2 x 2: the hierarchical
    # schedules between emulated nodes.
    "w3": (3, {}),
    "2x2": (4, {"SMDDP_RANKS_PER_NODE": "2"}),
}


@pytest.mark.timeout(240, func_only=True)
@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__[len("case_") :])
def test_layouts(pools, config: str, case: Callable[[str], list[str]]) -> None:
    world, env = CONFIGS[config]
    assert_no_failures(pools(world, **env).run(case, config, timeout=200))
