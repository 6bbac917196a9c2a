"""Every native collective on CPU tensors, against independent references.

Each case draws deterministic inputs for every rank of the group (seeded by
the case and the rank), so that every rank can compute the expected result by
itself, without trusting any collective: in float64 for floating SUM, AVG,
PRODUCT and PREMUL_SUM (compared within a bound derived from the dtype's
rounding), exactly for integers (which wrap around like torch), bool and
MIN/MAX, byte for byte for the collectives that only move data. The same
inputs also go through gloo as a second opinion, and digests of the outputs
that must be identical on every rank come back to the test, which compares
them bit for bit.

A rank never raises between collectives (a rank that stopped calling would
leave its peers waiting): it collects what differed into a list that the test
asserts empty. Outputs are filled before each call with values that differ
from the expected ones everywhere, so an element the backend forgot to write
is caught.
"""

from __future__ import annotations

import datetime
import hashlib
import pickle
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.distributed as dist

from dist_harness import assert_no_failures

# ---------------------------------------------------------------- the matrix

REDUCE_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool")
# Moved as bytes: any dtype, including some smddp cannot reduce.
MOVE_DTYPES = REDUCE_DTYPES + ("complex64", "int16", "uint16", "float8_e4m3fn")
REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM", "PREMUL_SUM_TENSOR")
SIZES = (0, 1, 7, 97, 4099)
# Inputs also run through gloo at these sizes only: gloo takes milliseconds a
# call on a busy host, and the float64 reference already covers every size.
GLOO_SIZES = (97, 4099)
PREMUL_FACTOR = 0.3  # not a power of two: a factor applied twice or not at all shows
LARGE_BYTES = 16 << 20

REDUCE_APIS = (
    "all_reduce",
    "all_reduce_coalesced",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "reduce_scatter_list",
    "reduce_scatter_tensor_coalesced",
    "reduce_scatter_single_coalesced",
    # The output is the rank's block of the input.
    "reduce_scatter_tensor_inplace",
)
MOVE_APIS = (
    "all_gather_into_tensor",
    # The input is the rank's block of the output, as FSDP2 gathers.
    "all_gather_into_tensor_inplace",
    "all_gather_single",
    "all_gather_list",
    "all_gather_coalesced",
    "allgather_into_tensor_coalesced",
    "all_gather_single_coalesced",
    "broadcast",
)
# Other names of the same backend entry points (_reduce_scatter_base,
# reduce_scatter_tensor_coalesced, _allgather_base,
# allgather_into_tensor_coalesced): a few sizes show that the route works.
ALIAS_APIS = {
    "reduce_scatter_single",
    "reduce_scatter_single_coalesced",
    "all_gather_single",
    "all_gather_single_coalesced",
}
ALIAS_SIZES = (0, 97)
# Outputs that must be bitwise identical on every rank of the group.
_IDENTICAL_APIS = {"all_reduce", "all_reduce_coalesced"} | set(MOVE_APIS)


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def reduce_defined(dtype: torch.dtype, op: str) -> bool:
    """Whether smddp promises a result for ``op`` on ``dtype`` (else an error)."""
    return _is_float(dtype) or op in ("SUM", "PRODUCT", "MIN", "MAX")


def _reduce_op(op: str) -> tuple[Any, float | None]:
    """The torch ReduceOp for a matrix name, and PREMUL_SUM's factor."""
    if op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(PREMUL_FACTOR), PREMUL_FACTOR
    if op == "PREMUL_SUM_TENSOR":
        factor = torch.tensor(1.0 / 3.0, dtype=torch.float32)
        return dist._make_nccl_premul_sum(factor), float(factor.item())
    return getattr(dist.ReduceOp, op), None


# ---------------------------------------------------------------- inputs


def _seed(*parts: Any) -> int:
    # crc32, not hash(): string hashes differ between processes.
    return zlib.crc32("/".join(str(p) for p in parts).encode())


def _random_bits(numel: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (numel * itemsize,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype)


# Ranges for integer PRODUCT: wide enough that products of 4 ranks wrap
# around (except int64), narrow enough that they are not all zero mod 2^n.
_PRODUCT_RANGE = {
    torch.int8: (-9, 10),
    torch.uint8: (0, 10),
    torch.int32: (-300, 300),
    torch.int64: (-(1 << 20), 1 << 20),
}


def reduce_input(key: str, rank: int, numel: int, dtype: torch.dtype, op: str) -> torch.Tensor:
    """Rank ``rank``'s input of case ``key``; any rank can draw any rank's."""
    gen = torch.Generator().manual_seed(_seed(key, rank))
    if _is_float(dtype):
        draw = torch.float64 if dtype == torch.float64 else torch.float32
        if op == "PRODUCT":
            # Magnitudes near 1 keep products of up to 4 ranks normal.
            mag = torch.rand(numel, dtype=draw, generator=gen) + 0.5
            sign = torch.randint(0, 2, (numel,), generator=gen).to(draw) * 2 - 1
            return (mag * sign).to(dtype)
        return (torch.rand(numel, dtype=draw, generator=gen) * 2 - 1).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=gen).bool()
    if op == "PRODUCT":
        lo, hi = _PRODUCT_RANGE[dtype]
        return torch.randint(lo, hi, (numel,), dtype=dtype, generator=gen)
    # The full range: SUM wraps around.
    return _random_bits(numel, dtype, gen).clone()


def move_input(key: str, rank: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    numel = 1
    for s in shape:
        numel *= s
    gen = torch.Generator().manual_seed(_seed(key, rank))
    if dtype == torch.bool:
        t = torch.randint(0, 2, (numel,), generator=gen).bool()
    else:
        t = _random_bits(numel, dtype, gen).clone()
    return t.reshape(shape)


# ---------------------------------------------------------------- references


@dataclass
class Reference:
    """The expected result of a reduction, and how far a backend may stray.

    Floating results are in float64 with ``bound`` (elementwise); the others
    are exact in the reduced dtype (bound None). ``magnitude`` is Σ|term| per
    element (terms scaled as the op scales them), for error bounds.
    """

    expected: torch.Tensor
    bound: torch.Tensor | None
    magnitude: torch.Tensor | None = None
    world: int = 1

    def for_accumulation_in(self, dtype: torch.dtype, acc_dtype: torch.dtype, op: str) -> torch.Tensor | None:
        """The bound for a backend that accumulates in ``acc_dtype`` (gloo: the dtype itself)."""
        if self.bound is None:
            return None
        return _float_bound(self.expected, self.magnitude, self.world, dtype, acc_dtype, op)

    def __getitem__(self, sl: slice) -> Reference:
        return Reference(
            self.expected[sl],
            None if self.bound is None else self.bound[sl],
            None if self.magnitude is None else self.magnitude[sl],
            self.world,
        )


def _float_bound(
    expected: torch.Tensor, magnitude: torch.Tensor, n: int, dtype: torch.dtype, acc_dtype: torch.dtype, op: str
) -> torch.Tensor:
    """Elementwise error bound of a floating reduction of n terms.

    Recursive summation of n terms errs by at most (n-1)·u·Σ|x| in any order;
    one more rounding each for AVG's division and PREMUL_SUM's product, and
    one rounding of the result to the dtype: eps·|result| (twice the half ulp
    a single rounding costs).
    """
    if op in ("MIN", "MAX"):
        return torch.zeros_like(expected)
    eps = torch.finfo(dtype).eps
    acc = torch.finfo(acc_dtype).eps
    tiny = torch.finfo(dtype).tiny
    mag = expected.abs()
    if op == "PRODUCT":
        return (n + 1) * acc * mag + eps * mag + tiny
    return (n + 1) * acc * magnitude + eps * mag + tiny


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """What smddp reduces ``dtype`` in: float16/bfloat16 in float32 (README)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def reference(
    inputs: list[torch.Tensor], dtype: torch.dtype, op: str, factor: float | None, partial_roundings: int = 0
) -> Reference:
    """The reduction of ``inputs`` (one per rank), computed here.

    ``partial_roundings``: how many times a partial result may be rounded to
    the dtype on its way (README: partial sums cross nodes in the tensor's
    dtype), each adding at most eps of the terms' magnitude.
    """
    n = len(inputs)
    if dtype == torch.bool:
        s = torch.stack(inputs)
        return Reference(s.any(0) if op in ("SUM", "MAX") else s.all(0), None, world=n)
    if not _is_float(dtype):
        s = torch.stack(inputs)
        if op == "SUM":
            return Reference(s.sum(0, dtype=dtype), None, world=n)
        if op == "PRODUCT":
            return Reference(s.prod(0, dtype=dtype), None, world=n)
        return Reference(s.amin(0) if op == "MIN" else s.amax(0), None, world=n)
    # Accumulated term by term: no (n, numel) float64 stack of large inputs.
    exp = inputs[0].double()
    magnitude = exp.abs()
    for x in inputs[1:]:
        xd = x.double()
        if op == "PRODUCT":
            exp = exp * xd
        elif op == "MIN":
            exp = torch.minimum(exp, xd)
        elif op == "MAX":
            exp = torch.maximum(exp, xd)
        else:
            exp = exp + xd
            magnitude += xd.abs()
    if op == "AVG":
        exp, magnitude = exp / n, magnitude / n
    elif op.startswith("PREMUL_SUM"):
        exp, magnitude = exp * factor, magnitude * abs(factor)
    ref = Reference(exp, None, magnitude, n)
    ref.bound = _float_bound(exp, magnitude, n, dtype, accumulation_dtype(dtype), op)
    if partial_roundings and op not in ("MIN", "MAX"):
        ref.bound = ref.bound + partial_roundings * torch.finfo(dtype).eps * (
            magnitude if op != "PRODUCT" else exp.abs()
        )
    return ref


def partial_roundings(ctx: Ctx) -> int:
    """Roundings of partial results the group's schedule may make: none on
    one node; across nodes, at most one per hop of a ring over the group."""
    backend = (ctx.group or dist.group.WORLD)._get_backend(torch.device("cpu"))
    nodes = backend.topology()["nodes"] if hasattr(backend, "topology") else 1
    return ctx.world - 1 if nodes > 1 else 0


def _fmt(t: torch.Tensor, i: int) -> str:
    v = t.reshape(-1)[i]
    if v.dtype == torch.bool:
        return f"byte {v.view(torch.uint8).item():#04x}"
    return repr(v.item()) if v.dtype != torch.bfloat16 else repr(float(v))


def mismatch(got: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor | None) -> str | None:
    """None if ``got`` matches; else what differed, with the first bad index.

    bound None: exact (NaN matches NaN); else |got - expected| <= bound where
    expected is finite, and an exact match where it is not.
    """
    if tuple(got.shape) != tuple(expected.shape):
        return f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    g = got.reshape(-1)
    e = expected.reshape(-1)
    if bound is None:
        if g.dtype != e.dtype:
            return f"dtype {g.dtype}, expected {e.dtype}"
        if g.dtype == torch.bool:
            # Bytes, not values: a bool byte other than 0/1 (an unwritten,
            # poisoned element) may compare equal to True.
            bad = g.view(torch.uint8) != e.view(torch.uint8)
        else:
            bad = g != e
        if _is_float(g.dtype):
            bad &= ~(torch.isnan(g) & torch.isnan(e))
    else:
        g64 = g.double()
        finite = torch.isfinite(e)
        close = (g64 - e).abs() <= bound.reshape(-1)
        same_special = (g64 == e) | (torch.isnan(g64) & torch.isnan(e))
        bad = torch.where(finite, ~close, ~same_special)
    if not bool(bad.any()):
        return None
    idx = bad.nonzero()[0].item()
    extra = f" (bound {bound.reshape(-1)[idx].item():.3g})" if bound is not None else ""
    return (
        f"{int(bad.sum())} of {g.numel()} elements differ, first at [{idx}]: "
        f"got {_fmt(g, idx)}, expected {_fmt(e, idx)}{extra}"
    )


def bytes_mismatch(got: torch.Tensor, expected: torch.Tensor) -> str | None:
    """Byte-for-byte comparison (data that is only moved, NaN payloads included)."""
    if tuple(got.shape) != tuple(expected.shape) or got.dtype != expected.dtype:
        return f"got {got.dtype}{tuple(got.shape)}, expected {expected.dtype}{tuple(expected.shape)}"
    gb = got.contiguous().reshape(-1).view(torch.uint8)
    eb = expected.contiguous().reshape(-1).view(torch.uint8)
    bad = gb != eb
    if not bool(bad.any()):
        return None
    idx = bad.nonzero()[0].item()
    item = got.element_size()
    return (
        f"{int(bad.sum())} of {gb.numel()} bytes differ, first in element [{idx // item}]: "
        f"byte {gb[idx].item():#04x}, expected {eb[idx].item():#04x}"
    )


def poison_like(expected: torch.Tensor) -> torch.Tensor:
    """A tensor of expected's dtype and shape that differs from it in every byte.

    Bitwise complement: for floats it never equals the expected value (and is
    often NaN or huge), for bool the complemented bytes are not 0/1 at all.
    """
    out = torch.empty_like(expected).contiguous()
    out.reshape(-1).view(torch.uint8).copy_(expected.contiguous().reshape(-1).view(torch.uint8) ^ 0xFF)
    return out


def digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha1()
    for t in tensors:
        h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------- rank side

# Groups created once per rank process (new_group is collective: every rank
# creates the same groups in the same order, because every rank runs the same
# cases).
_GROUPS: dict[tuple, Any] = {}


def _group(ranks: tuple[int, ...] | None, backend: str) -> Any:
    if ranks is None and backend == "smddp":
        return dist.group.WORLD
    key = (ranks, backend)
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(ranks=list(ranks) if ranks is not None else None, backend=backend)
    return _GROUPS[key]


@dataclass
class Ctx:
    """What a case needs to know about the group it runs on."""

    tag: str
    group: Any
    gloo: Any
    rank: int  # in the group
    world: int  # group size
    global_ranks: list[int]
    failures: list[str] = field(default_factory=list)
    digests: dict[str, str] = field(default_factory=dict)
    # Every reduction's output on this rank, identical to the group's or not:
    # to compare data paths with one another.
    outputs: dict[str, str] = field(default_factory=dict)
    cases: int = 0

    def fail(self, what: str, msg: str) -> None:
        # Enough to diagnose; a broken group would otherwise flood the report.
        if len(self.failures) < 40:
            self.failures.append(f"[{self.tag}] rank {self.global_ranks[self.rank]}: {what}: {msg}")

    def result(self) -> dict:
        return {
            "member": True,
            "group": self.global_ranks,
            "cases": self.cases,
            "failures": self.failures,
            "digests": self.digests,
            "outputs": self.outputs,
        }


def rank_setup() -> None:
    """Per-process settings of a rank, before its first case."""
    # Several ranks share few cores: torch's intra-op threads would spin
    # against each other and make the local references 50x slower.
    torch.set_num_threads(1)


def _contexts(tag: str, subgroups: list[tuple[int, ...]] | None) -> Ctx | None:
    """This rank's Ctx: the world, or the one of ``subgroups`` it belongs to."""
    rank_setup()
    if subgroups is None:
        ranks = None
    else:
        for sub in subgroups:
            _group(tuple(sub), "smddp")
            _group(tuple(sub), "gloo")
        mine = [s for s in subgroups if dist.get_rank() in s]
        if not mine:
            return None
        ranks = tuple(mine[0])
    group = _group(ranks, "smddp")
    gloo = _group(ranks, "gloo")
    global_ranks = dist.get_process_group_ranks(group)
    return Ctx(
        tag=tag,
        group=group,
        gloo=gloo,
        rank=dist.get_rank(group),
        world=dist.get_world_size(group),
        global_ranks=global_ranks,
    )


def _not_member() -> dict:
    return {"member": False, "cases": 0, "failures": [], "digests": {}}


# ---- reductions


def _reduce_shapes(api: str, n: int, world: int) -> list[tuple[int, int]]:
    """(input elements, output elements) of each tensor of one call."""
    if api == "all_reduce":
        return [(n, n)]
    if api == "all_reduce_coalesced":
        return [(n, n), (n // 2 + 3, n // 2 + 3)]
    if api.endswith("coalesced"):
        return [(n * world, n), ((n + 2) * world, n + 2)]
    return [(n * world, n)]


def _run_smddp_reduce(
    ctx: Ctx, api: str, ins: list[torch.Tensor], outs: list[torch.Tensor], rop: Any
) -> list[torch.Tensor]:
    """Runs ``api`` on smddp; returns the tensors that hold the results."""
    g = ctx.group
    if api == "all_reduce":
        t = ins[0].clone()
        dist.all_reduce(t, op=rop, group=g)
        return [t]
    if api == "all_reduce_coalesced":
        ts = [x.clone() for x in ins]
        dist.all_reduce_coalesced(ts, op=rop, group=g)
        return ts
    if api == "reduce_scatter_tensor_inplace":
        t = ins[0].clone()
        m = outs[0].numel()
        mine = t.narrow(0, ctx.rank * m, m)
        dist.reduce_scatter_tensor(mine, t, op=rop, group=g)
        return [mine.clone()]
    if api == "reduce_scatter_tensor":
        dist.reduce_scatter_tensor(outs[0], ins[0], op=rop, group=g)
    elif api == "reduce_scatter_single":
        dist.reduce_scatter_single(outs[0], ins[0], op=rop, group=g)
    elif api == "reduce_scatter_list":
        m = outs[0].numel()
        dist.reduce_scatter(outs[0], [ins[0][r * m : (r + 1) * m] for r in range(ctx.world)], op=rop, group=g)
    else:
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = rop
        method = getattr(g, api)  # reduce_scatter_{tensor,single}_coalesced
        method(outs, ins, opts).wait()
    return outs


def _run_gloo_reduce(
    ctx: Ctx, api: str, ins: list[torch.Tensor], outs: list[torch.Tensor], rop: Any
) -> list[torch.Tensor]:
    """The same reduction through gloo, one tensor at a time."""
    res = []
    for i, x in enumerate(ins):
        if api.startswith("all_reduce"):
            t = x.clone()
            dist.all_reduce(t, op=rop, group=ctx.gloo)
        else:
            t = torch.empty_like(outs[i])
            dist.reduce_scatter_tensor(t, x, op=rop, group=ctx.gloo)
        res.append(t)
    return res


def _native_name(api: str) -> str:
    return "allreduce" if api.startswith("all_reduce") else "reduce_scatter"


def _dtype_names(dtype: torch.dtype) -> tuple[str, ...]:
    """How an error may spell the dtype: torch's name or c10's."""
    c10 = {
        torch.int8: "Char",
        torch.uint8: "Byte",
        torch.int32: "Int",
        torch.int64: "Long",
        torch.bool: "Bool",
        torch.int16: "Short",
        torch.uint16: "UInt16",
        torch.complex64: "ComplexFloat",
    }
    return (str(dtype).replace("torch.", ""), c10.get(dtype, "?"))


def _reduce_case(ctx: Ctx, api: str, dtype: torch.dtype, op: str, n: int, with_gloo: bool) -> None:
    what = f"{api} {str(dtype)[6:]} {op} n={n}"
    key = f"{ctx.tag}/{api}/{dtype}/{op}/{n}"
    rop, factor = _reduce_op(op)
    shapes = _reduce_shapes(api, n, ctx.world)
    # Every rank's inputs, drawn locally: the reference needs them all.
    all_ins = [
        [reduce_input(f"{key}/{i}", r, numel_in, dtype, op) for i, (numel_in, _) in enumerate(shapes)]
        for r in range(ctx.world)
    ]
    ins = [x.clone() for x in all_ins[ctx.rank]]
    ctx.cases += 1

    if not reduce_defined(dtype, op):
        outs = [torch.empty(m, dtype=dtype) for _, m in shapes]
        try:
            _run_smddp_reduce(ctx, api, ins, outs, rop)
        except (RuntimeError, ValueError) as e:
            msg = str(e)
            op_word = "PREMUL_SUM" if op.startswith("PREMUL_SUM") else op
            wanted = [op_word, _native_name(api), f"rank {ctx.rank}"]
            missing = [w for w in wanted if w not in msg]
            if not any(d in msg for d in _dtype_names(dtype)):
                missing.append(f"the dtype ({' or '.join(_dtype_names(dtype))})")
            if missing:
                ctx.fail(what, f"error does not name {missing}: {msg[:300]}")
        except Exception as e:  # noqa: BLE001 - any other type is a failure
            ctx.fail(what, f"raised {type(e).__name__} instead of RuntimeError/ValueError: {str(e)[:300]}")
        else:
            ctx.fail(what, "no error for a reduce op that is not defined on this dtype")
        return

    expected: list[Reference] = []
    roundings = partial_roundings(ctx)
    for i, (_, m) in enumerate(shapes):
        ref = reference([all_ins[r][i] for r in range(ctx.world)], dtype, op, factor, roundings)
        if not api.startswith("all_reduce"):
            ref = ref[ctx.rank * m : (ctx.rank + 1) * m]
        expected.append(ref)
    outs = [poison_like(ref.expected.to(dtype)) for ref in expected]
    try:
        got = _run_smddp_reduce(ctx, api, ins, outs, rop)
    except Exception as e:  # noqa: BLE001
        ctx.fail(what, f"raised {type(e).__name__}: {str(e)[:400]}")
        return
    for i, (t, ref) in enumerate(zip(got, expected, strict=True)):
        if t.dtype != dtype:
            ctx.fail(what, f"tensor {i}: output dtype {t.dtype}")
            continue
        err = mismatch(t, ref.expected, ref.bound)
        if err:
            ctx.fail(what, f"tensor {i} vs the reference: {err}")
    for i, x in enumerate(ins):
        if not api.startswith("all_reduce") and bytes_mismatch(x, all_ins[ctx.rank][i]):
            ctx.fail(what, f"input {i} was modified by the call")
    ctx.outputs[what] = digest(got)
    if api in _IDENTICAL_APIS:
        ctx.digests[what] = ctx.outputs[what]

    # gloo has no PREMUL_SUM (and no AVG of integers, which is an error anyway).
    if with_gloo and not op.startswith("PREMUL_SUM"):
        try:
            theirs = _run_gloo_reduce(ctx, api, [x.clone() for x in all_ins[ctx.rank]], outs, rop)
        except Exception as e:  # noqa: BLE001
            ctx.fail(what, f"gloo raised {type(e).__name__}: {str(e)[:200]}")
            return
        for i, (t, g, ref) in enumerate(zip(got, theirs, expected, strict=True)):
            if ref.bound is not None:
                # Both stray from the exact value; gloo accumulates in the dtype itself.
                tol = ref.bound + ref.for_accumulation_in(dtype, dtype, op)
                err = mismatch(t, g.double(), tol)
            else:
                if dtype == torch.bool:
                    # gloo adds bool bytes (True + True gives byte 2):
                    # compare truth values with it.
                    g = g.view(torch.uint8) != 0
                err = mismatch(t, g, None)
            if err:
                ctx.fail(what, f"tensor {i} vs gloo: {err}")


def case_reduce(
    api: str,
    tag: str,
    dtypes: tuple[str, ...] = REDUCE_DTYPES,
    ops: tuple[str, ...] = REDUCE_OPS,
    sizes: tuple[int, ...] = SIZES,
    gloo_sizes: tuple[int, ...] = GLOO_SIZES,
    subgroups: list[tuple[int, ...]] | None = None,
) -> dict:
    ctx = _contexts(tag, subgroups)
    if ctx is None:
        return _not_member()
    for dname in dtypes:
        for op in ops:
            for n in sizes:
                _reduce_case(ctx, api, _dtype(dname), op, n, n in gloo_sizes)
    return ctx.result()


def case_special_values(tag: str) -> dict:
    """inf, -inf and NaN through all_reduce: IEEE sums, NaN-propagating MIN/MAX."""
    ctx = _contexts(tag, None)
    assert ctx is not None
    for dname in ("float32", "float64", "float16", "bfloat16"):
        dtype = _dtype(dname)
        for op in ("SUM", "PRODUCT", "MIN", "MAX", "AVG"):
            what = f"all_reduce special values {dname} {op}"
            all_ins = []
            for r in range(ctx.world):
                x = reduce_input(f"{tag}/special/{dname}/{op}", r, 8, dtype, op)
                if r == 0:
                    x[0] = float("inf")
                    x[1] = float("inf")
                if r == ctx.world - 1:
                    x[1] = -float("inf") if ctx.world > 1 else float("inf")
                    x[2] = float("nan")
                x[3] = float("-inf")
                all_ins.append(x)
            ref = reference(all_ins, dtype, op, None)
            t = all_ins[ctx.rank].clone()
            ctx.cases += 1
            try:
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=ctx.group)
            except Exception as e:  # noqa: BLE001
                ctx.fail(what, f"raised {type(e).__name__}: {str(e)[:300]}")
                continue
            err = mismatch(t, ref.expected, ref.bound)
            if err:
                ctx.fail(what, err)
            ctx.digests[what] = digest([t])
    return ctx.result()


# ---- data movement


def _shape(size: int | tuple[int, ...]) -> tuple[int, ...]:
    return (size,) if isinstance(size, int) else tuple(size)


def _move_shapes(api: str, size: int | tuple[int, ...]) -> list[tuple[int, ...]]:
    shape = _shape(size)
    if api.endswith("coalesced"):
        return [shape, (shape[0] * 2 + 1,)]
    return [shape]


def _cat0(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.reshape((-1,) + tuple(p.shape[1:])) for p in parts], dim=0)


def _move_case(ctx: Ctx, api: str, dtype: torch.dtype, size: int | tuple[int, ...], with_gloo: bool) -> None:
    shapes = _move_shapes(api, size)
    key = f"{ctx.tag}/{api}/{dtype}/{size}"
    all_ins = [[move_input(f"{key}/{i}", r, s, dtype) for i, s in enumerate(shapes)] for r in range(ctx.world)]
    ins = [x.clone() for x in all_ins[ctx.rank]]
    g = ctx.group

    if api == "broadcast":
        for root in range(ctx.world):
            what = f"broadcast {str(dtype)[6:]} shape={shapes[0]} root={ctx.global_ranks[root]}"
            ctx.cases += 1
            expected = all_ins[root][0]
            t = ins[0].clone() if ctx.rank == root else poison_like(expected)
            try:
                dist.broadcast(t, src=ctx.global_ranks[root], group=g)
            except Exception as e:  # noqa: BLE001
                ctx.fail(what, f"raised {type(e).__name__}: {str(e)[:400]}")
                continue
            err = bytes_mismatch(t, expected)
            if err:
                ctx.fail(what, err)
            ctx.digests[what] = digest([t])
            if with_gloo and dtype in [_dtype(d) for d in REDUCE_DTYPES]:
                tg = ins[0].clone() if ctx.rank == root else torch.zeros_like(expected)
                dist.broadcast(tg, src=ctx.global_ranks[root], group=ctx.gloo)
                err = bytes_mismatch(t, tg)
                if err:
                    ctx.fail(what, f"vs gloo: {err}")
        return

    what = f"{api} {str(dtype)[6:]} shape={shapes[0]}"
    ctx.cases += 1
    # Expected per tensor: the world's inputs concatenated along dim 0.
    expected = [_cat0([all_ins[r][i] for r in range(ctx.world)]) for i in range(len(shapes))]
    per_rank = [[all_ins[r][i] for r in range(ctx.world)] for i in range(len(shapes))]
    try:
        if api in ("all_gather_into_tensor", "all_gather_single"):
            out = poison_like(expected[0])
            fn = dist.all_gather_into_tensor if api == "all_gather_into_tensor" else dist.all_gather_single
            fn(out, ins[0], group=g)
            got, want = [out], expected
        elif api == "all_gather_into_tensor_inplace":
            out = poison_like(expected[0])
            rows = shapes[0][0]
            mine = out.narrow(0, ctx.rank * rows, rows)
            mine.copy_(ins[0])
            dist.all_gather_into_tensor(out, mine, group=g)
            got, want = [out], expected
        elif api == "all_gather_list":
            outs = [poison_like(p) for p in per_rank[0]]
            dist.all_gather(outs, ins[0], group=g)
            got, want = outs, per_rank[0]
        elif api == "all_gather_coalesced":
            lists = [[poison_like(per_rank[i][r]) for i in range(len(shapes))] for r in range(ctx.world)]
            dist.all_gather_coalesced(lists, ins, group=g)
            got = [t for lst in lists for t in lst]
            want = [per_rank[i][r] for r in range(ctx.world) for i in range(len(shapes))]
        else:  # allgather_into_tensor_coalesced, all_gather_single_coalesced
            outs = [poison_like(e) for e in expected]
            getattr(g, api)(outs, ins, dist.distributed_c10d.AllgatherOptions()).wait()
            got, want = outs, expected
    except Exception as e:  # noqa: BLE001
        ctx.fail(what, f"raised {type(e).__name__}: {str(e)[:400]}")
        return
    for i, (t, w) in enumerate(zip(got, want, strict=True)):
        err = bytes_mismatch(t, w)
        if err:
            ctx.fail(what, f"output {i}: {err}")
    for i, x in enumerate(ins):
        if bytes_mismatch(x, all_ins[ctx.rank][i]):
            ctx.fail(what, f"input {i} was modified by the call")
    ctx.digests[what] = digest(got)
    if with_gloo and dtype in [_dtype(d) for d in REDUCE_DTYPES]:
        for i, x in enumerate(ins):
            theirs = torch.zeros_like(expected[i])
            dist.all_gather_into_tensor(theirs, x, group=ctx.gloo)
            err = bytes_mismatch(_gathered(api, got, i, len(shapes)), theirs)
            if err:
                ctx.fail(what, f"output {i} vs gloo: {err}")


def _gathered(api: str, got: list[torch.Tensor], i: int, ntensors: int) -> torch.Tensor:
    """Tensor ``i`` of an all-gather's outputs, as one concatenated tensor."""
    if api == "all_gather_list":
        return _cat0(got)
    if api == "all_gather_coalesced":
        # got is rank-major: [rank 0's tensors..., rank 1's tensors..., ...]
        return _cat0(got[i::ntensors])
    return got[i]


def case_move(
    api: str,
    tag: str,
    dtypes: tuple[str, ...] = MOVE_DTYPES,
    sizes: tuple[int | tuple[int, ...], ...] = SIZES + ((3, 5),),
    gloo_sizes: tuple[int | tuple[int, ...], ...] = (97,),
    subgroups: list[tuple[int, ...]] | None = None,
) -> dict:
    ctx = _contexts(tag, subgroups)
    if ctx is None:
        return _not_member()
    for dname in dtypes:
        for size in sizes:
            _move_case(ctx, api, _dtype(dname), size, size in gloo_sizes)
    return ctx.result()


def case_all_gather_object(tag: str) -> dict:
    ctx = _contexts(tag, None)
    assert ctx is not None

    def obj(r: int) -> Any:
        # Pickles of different lengths on every rank; None on one.
        if r == 1:
            return None
        return {"rank": r, "payload": list(range(r * 37)), "text": "x" * (r * 1000 + 3), "t": (r, 2.5)}

    for round_ in range(3):
        what = f"all_gather_object round {round_}"
        ctx.cases += 1
        out: list[Any] = [object()] * ctx.world
        try:
            dist.all_gather_object(out, obj(ctx.rank), group=ctx.group)
        except Exception as e:  # noqa: BLE001
            ctx.fail(what, f"raised {type(e).__name__}: {str(e)[:300]}")
            continue
        want = [obj(r) for r in range(ctx.world)]
        if out != want:
            bad = [r for r in range(ctx.world) if out[r] != want[r]]
            ctx.fail(what, f"objects of ranks {bad} differ, first got {out[bad[0]]!r:.200}")
        ctx.digests[what] = hashlib.sha1(pickle.dumps(out)).hexdigest()
    return ctx.result()


def case_barrier(delay: float) -> dict:
    """Rank r enters the barrier r*delay seconds late; returns when it entered and left."""
    rank_setup()
    rank = dist.get_rank()
    dist.barrier()  # a common start
    time.sleep(rank * delay)
    entered = time.time()
    dist.barrier()
    left = time.time()
    return {"entered": entered, "left": left}


# ---- sub-groups, DTensor, emulated nodes


def case_dtensor(tag: str, sizes: tuple[int, ...]) -> dict:
    """FSDP2's paths: DTensor redistributions and the functional coalesced ops."""
    import torch.distributed._functional_collectives as fc
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    ctx = _contexts(tag, None)
    assert ctx is not None
    mesh = _GROUPS.get(("mesh",))
    if mesh is None:
        mesh = _GROUPS[("mesh",)] = init_device_mesh("cpu", (ctx.world,))
    w, r = ctx.world, ctx.rank
    for n in sizes:
        for dname in ("float32", "bfloat16"):
            dtype = _dtype(dname)
            key = f"{tag}/dtensor/{dname}/{n}"
            # The same full tensor on every rank (seeded by the case only).
            full = reduce_input(key, 0, n * 3, dtype, "SUM").reshape(n, 3)
            what = f"full_tensor {dname} ({n}, 3)"
            ctx.cases += 1
            try:
                got = distribute_tensor(full, mesh, [Shard(0)]).full_tensor()
                err = bytes_mismatch(got, full)
                if err:
                    ctx.fail(what, err)
            except Exception as e:  # noqa: BLE001
                ctx.fail(what, f"raised {type(e).__name__}: {str(e)[:400]}")

            parts = [reduce_input(key + "/partial", q, n * 3, dtype, "SUM").reshape(n, 3) for q in range(w)]
            for reduce, op in (("sum", "SUM"), ("avg", "AVG")):
                ref = reference([p.reshape(-1) for p in parts], dtype, op, None)
                exp, bound = ref.expected.reshape(n, 3), ref.bound.reshape(n, 3)
                for target in ("replicate", "shard"):
                    what = f"Partial({reduce}) -> {target} {dname} ({n}, 3)"
                    ctx.cases += 1
                    try:
                        dt = DTensor.from_local(parts[r].clone(), mesh, [Partial(reduce)])
                        if target == "replicate":
                            got = dt.redistribute(mesh, [Replicate()]).to_local()
                            want, wb = exp, bound
                        else:
                            got = dt.redistribute(mesh, [Shard(0)]).to_local()
                            # torch.chunk's split: ceil(n / w) rows per rank.
                            want = list(exp.chunk(w, 0))
                            wbs = list(bound.chunk(w, 0))
                            if r < len(want):
                                want, wb = want[r], wbs[r]
                            else:
                                want, wb = exp[:0], bound[:0]
                        err = mismatch(got, want, wb)
                        if err:
                            ctx.fail(what, err)
                    except Exception as e:  # noqa: BLE001
                        ctx.fail(what, f"raised {type(e).__name__}: {str(e)[:400]}")

        # The functional coalesced collectives (what FSDP2's foreach paths use).
        what = f"functional all_gather_into_tensor_coalesced n={n}"
        ctx.cases += 1
        try:
            ins = [
                move_input(f"{tag}/fagc/{i}/{n}", r, (n + i,), _dtype(d)) for i, d in enumerate(("float32", "int64"))
            ]
            outs = fc.all_gather_into_tensor_coalesced(ins, ctx.group)
            outs = [fc.wait_tensor(o) for o in outs]
            for i, o in enumerate(outs):
                want = torch.cat([move_input(f"{tag}/fagc/{i}/{n}", q, (n + i,), ins[i].dtype) for q in range(w)])
                err = bytes_mismatch(o, want)
                if err:
                    ctx.fail(what, f"output {i}: {err}")
        except Exception as e:  # noqa: BLE001
            ctx.fail(what, f"raised {type(e).__name__}: {str(e)[:400]}")
        what = f"functional reduce_scatter_tensor_coalesced n={n}"
        ctx.cases += 1
        try:
            all_ins = [
                [reduce_input(f"{tag}/frsc/{i}/{n}", q, (n + i) * w, torch.float32, "SUM") for i in range(2)]
                for q in range(w)
            ]
            outs = fc.reduce_scatter_tensor_coalesced([x.clone() for x in all_ins[r]], "sum", [0, 0], ctx.group)
            outs = [fc.wait_tensor(o) for o in outs]
            for i, o in enumerate(outs):
                m = n + i
                ref = reference([all_ins[q][i] for q in range(w)], torch.float32, "SUM", None)[r * m : (r + 1) * m]
                err = mismatch(o, ref.expected, ref.bound)
                if err:
                    ctx.fail(what, f"output {i}: {err}")
        except Exception as e:  # noqa: BLE001
            ctx.fail(what, f"raised {type(e).__name__}: {str(e)[:400]}")
    return ctx.result()


def case_group_backend(subgroups: list[tuple[int, ...]]) -> list[str | None]:
    """The backend class of the smddp sub-group each rank belongs to."""
    rank_setup()
    out: list[str | None] = []
    for sub in subgroups:
        g = _group(tuple(sub), "smddp")
        if dist.get_rank() in sub:
            out.append(type(g._get_backend(torch.device("cpu"))).__name__)
        else:
            out.append(None)
    return out


# ---------------------------------------------------------------- test side


@dataclass(frozen=True)
class Config:
    world: int
    env: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        parts = [f"w{self.world}"] + [f"{k.removeprefix('SMDDP_').lower()}={v}" for k, v in self.env]
        return "-".join(parts)


DEFAULT_CONFIGS = [Config(1), Config(2), Config(3), Config(4)]
VARIANT_CONFIGS = [
    Config(3, (("SMDDP_SINGLE_COPY", "on"),)),
    Config(4, (("SMDDP_SINGLE_COPY", "off"),)),
    # 4 KiB slots: every size above a few hundred elements takes many
    # pipelined rounds through the staged path.
    Config(3, (("SMDDP_SHM_SLOT_BYTES", "4096"), ("SMDDP_SINGLE_COPY", "off"))),
    # Waiting by futex alone (no spinning, no yielding); the default configs
    # cover spinning (2 ranks) and yielding (4 ranks on a 2-core host).
    Config(2, (("SMDDP_SPIN_US", "0"), ("SMDDP_YIELD_US", "0"))),
]
ALL_CONFIGS = DEFAULT_CONFIGS + VARIANT_CONFIGS


class PoolRef:
    """A config's rank pool, fetched afresh for every call (a failed call kills it)."""

    def __init__(self, pools: Callable[..., Any], config: Config):
        self._pools = pools
        self.config = config
        self.last: Any = None

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 120.0, **kwargs: Any) -> list[Any]:
        self.last = self._pools(self.config.world, **dict(self.config.env))
        return self.last.run(fn, *args, timeout=timeout, **kwargs)


@pytest.fixture(scope="module", params=ALL_CONFIGS, ids=lambda c: c.id)
def ranks(request, pools) -> PoolRef:
    # Module scope with params: pytest runs every test of one config before
    # the next, so at most a couple of pools live at a time.
    ref = PoolRef(pools, request.param)
    yield ref
    if ref.last is not None and ref.last.alive and (request.param.env or request.param.world == 1):
        # Not needed again: free its memory. Closing waits for the ranks to
        # exit (seconds each on a busy host), which need not hold up the
        # next config's tests.
        threading.Thread(target=ref.last.close, name=f"close-{request.param.id}").start()


def check_results(results: list[dict], identical: bool = True) -> int:
    """Asserts no rank reported a failure and identical digests within groups."""
    failures = [f for r in results for f in r["failures"]]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:25])
    members = [r for r in results if r["member"]]
    assert members and all(r["cases"] > 0 for r in members), "no case ran"
    if identical:
        by_group: dict[tuple, list[dict]] = {}
        for r in members:
            by_group.setdefault(tuple(r["group"]), []).append(r)
        for group, rs in by_group.items():
            keys = set().union(*(r["digests"] for r in rs))
            for key in sorted(keys):
                values = [r["digests"].get(key) for r in rs]
                assert len(set(values)) == 1, (
                    f"group {list(group)}: {key}: outputs are not bitwise identical on every rank "
                    f"(digests by rank {dict(zip(group, values, strict=True))})"
                )
    return sum(r["cases"] for r in members)


# The variants change data paths, not arithmetic: every reduce op still, but
# one dtype of each element size and kind (the default configs run them all).
VARIANT_REDUCE_DTYPES = ("float32", "float64", "bfloat16", "int8", "int64", "bool")
VARIANT_MOVE_DTYPES = ("float32", "bfloat16", "int8", "int64", "bool", "complex64")


def _skip_alias_in_variant(cfg: Config, api: str) -> None:
    if cfg.env and api in ALIAS_APIS:
        pytest.skip("an alias of an entry point the variant runs under its own name")


@pytest.mark.timeout(150, func_only=True)
@pytest.mark.parametrize("api", REDUCE_APIS)
def test_reduction(ranks: PoolRef, api: str) -> None:
    cfg = ranks.config
    _skip_alias_in_variant(cfg, api)
    gloo = () if cfg.env else GLOO_SIZES if api in ("all_reduce", "reduce_scatter_tensor") else GLOO_SIZES[:1]
    sizes = ALIAS_SIZES if api in ALIAS_APIS else SIZES
    dtypes = VARIANT_REDUCE_DTYPES if cfg.env else REDUCE_DTYPES
    check_results(ranks.run(case_reduce, api, cfg.id, dtypes=dtypes, sizes=sizes, gloo_sizes=gloo, timeout=120))


@pytest.mark.timeout(150, func_only=True)
@pytest.mark.parametrize("api", MOVE_APIS)
def test_data_movement(ranks: PoolRef, api: str) -> None:
    cfg = ranks.config
    _skip_alias_in_variant(cfg, api)
    gloo = (97,) if not cfg.env else ()
    sizes = ALIAS_SIZES if api in ALIAS_APIS else SIZES + ((3, 5),)
    dtypes = VARIANT_MOVE_DTYPES if cfg.env else MOVE_DTYPES
    check_results(ranks.run(case_move, api, cfg.id, dtypes=dtypes, sizes=sizes, gloo_sizes=gloo, timeout=120))


@pytest.mark.timeout(60, func_only=True)
def test_special_values(ranks: PoolRef) -> None:
    check_results(ranks.run(case_special_values, ranks.config.id, timeout=40))


@pytest.mark.timeout(60, func_only=True)
def test_all_gather_object(ranks: PoolRef) -> None:
    check_results(ranks.run(case_all_gather_object, ranks.config.id, timeout=40))


@pytest.mark.timeout(60, func_only=True)
def test_barrier_synchronizes(ranks: PoolRef) -> None:
    delay = 0.15
    res = ranks.run(case_barrier, delay, timeout=40)
    last_in = max(r["entered"] for r in res)
    for rank, r in enumerate(res):
        # Nobody may leave before the last rank came in.
        assert r["left"] >= last_in - 0.002, (
            f"rank {rank} left the barrier {last_in - r['left']:.3f} s before rank "
            f"{max(range(len(res)), key=lambda q: res[q]['entered'])} entered it"
        )


def _large_cases() -> list[tuple[str, str, str, str | None]]:
    """(kind, api, dtype, reduce op): one per collective."""
    return [
        ("reduce", "all_reduce", "float32", "SUM"),
        ("reduce", "reduce_scatter_tensor", "bfloat16", "AVG"),
        # FSDP2's gradient reduction with a divide factor.
        ("reduce", "reduce_scatter_tensor_coalesced", "float32", "PREMUL_SUM"),
        ("move", "all_gather_into_tensor", "bfloat16", None),
        ("move", "allgather_into_tensor_coalesced", "int64", None),
        ("move", "broadcast", "uint8", None),
    ]


def case_large(tag: str, big: int, gloo: bool) -> dict:
    ctx = _contexts(tag, None)
    assert ctx is not None
    w = ctx.world
    # Sizes make the largest buffer of each call at least ``big`` bytes.
    for kind, api, dname, op in _large_cases():
        dtype = _dtype(dname)
        item = torch.empty((), dtype=dtype).element_size()
        elems = big // item
        if kind == "reduce":
            # n is the per-rank output of a reduce-scatter, the whole tensor of an all-reduce.
            n = elems + 7 if api.startswith("all_reduce") else elems // w + 7
            _reduce_case(ctx, api, dtype, op, n, gloo and api == "all_reduce")
        else:
            n = elems + 7 if api == "broadcast" else elems // w + 7
            if api == "broadcast":
                # Every root of a 16 MiB broadcast is slow here; one root is enough.
                _large_broadcast(ctx, dtype, n)
            else:
                _move_case(ctx, api, dtype, n, False)
    return ctx.result()


def _large_broadcast(ctx: Ctx, dtype: torch.dtype, n: int) -> None:
    root = ctx.world - 1
    expected = move_input(f"{ctx.tag}/large-bcast", root, (n,), dtype)
    t = expected.clone() if ctx.rank == root else poison_like(expected)
    what = f"broadcast {dtype} n={n} root={ctx.global_ranks[root]}"
    ctx.cases += 1
    try:
        dist.broadcast(t, src=ctx.global_ranks[root], group=ctx.group)
    except Exception as e:  # noqa: BLE001
        ctx.fail(what, f"raised {type(e).__name__}: {str(e)[:300]}")
        return
    err = bytes_mismatch(t, expected)
    if err:
        ctx.fail(what, err)


@pytest.mark.slow
@pytest.mark.timeout(240, func_only=True)
def test_large_messages(ranks: PoolRef) -> None:
    cfg = ranks.config
    if cfg.id not in ("w3", "w4-single_copy=off", "w3-shm_slot_bytes=4096-single_copy=off"):
        # Slow on a small host: the default path (which picks single-copy for
        # them) and the staged path are enough.
        pytest.skip("large messages run on w3, w4-single_copy=off and w3-shm_slot_bytes=4096")
    slot_4k = any(k == "SMDDP_SHM_SLOT_BYTES" for k, _ in cfg.env)
    # 16 MiB through 4 KiB slots is thousands of rounds; 1 MiB is hundreds.
    big = (1 << 20) if slot_4k else LARGE_BYTES
    check_results(ranks.run(case_large, cfg.id, big, not cfg.env, timeout=200), identical=True)


# ---- tests that need one particular world


@pytest.mark.timeout(150, func_only=True)
def test_subgroups(pools) -> None:
    """new_group(backend="smddp") of arbitrary subsets, two of them at once."""
    pool = pools(4)
    layouts = [[(0, 2), (3, 1)], [(1, 2, 3)], [(2,)], [(3, 0, 1)]]
    for subs in layouts:
        names = pool.run(case_group_backend, subs, timeout=60)
        for rank, row in enumerate(names):
            for sub, name in zip(subs, row, strict=True):
                assert name == ("ProcessGroupSMDDP" if rank in sub else None), (sub, rank, name)
        tag = "sub" + "_".join("-".join(map(str, s)) for s in subs)
        for api in ("all_reduce", "reduce_scatter_tensor", "all_reduce_coalesced", "reduce_scatter_list"):
            res = pool.run(
                case_reduce,
                api,
                tag,
                ops=("SUM", "AVG", "MAX", "PREMUL_SUM"),
                sizes=(0, 7, 97),
                gloo_sizes=(97,),
                subgroups=subs,
                timeout=60,
            )
            check_results(res)
            assert {tuple(r["group"]) for r in res if r["member"]} == {tuple(sorted(s)) for s in subs}
        for api in ("all_gather_into_tensor", "all_gather_list", "broadcast"):
            res = pool.run(case_move, api, tag, dtypes=REDUCE_DTYPES, sizes=(0, 7, 97), subgroups=subs, timeout=60)
            check_results(res)


@pytest.mark.timeout(120, func_only=True)
@pytest.mark.parametrize("world", [2, 4])
def test_dtensor(pools, world: int) -> None:
    check_results(pools(world).run(case_dtensor, f"w{world}", (1, 7, 97), timeout=100), identical=False)


EMULATED_LARGE = (1 << 17) + 3


@pytest.mark.slow
@pytest.mark.timeout(180, func_only=True)
def test_emulated_nodes(pools) -> None:
    """2 emulated nodes x 2 ranks: whatever path serves them, the results hold."""
    # The pool is shared with test_registration's topology test. Small
    # messages run the hierarchical stages one after the other through the
    # staging slots, EMULATED_LARGE elements per block (more than 512K of a
    # rail's data) by single-copy transfers; with SMDDP_PIPELINE=on the stages
    # run at once, on two threads (on a host with more cores than ranks, the
    # default for large messages).
    # Both paths give the same bits. (On 2 x 2 every sum has two operands,
    # so this checks where PREMUL_SUM's factor and AVG's division apply; the
    # native schedule tests check the order on 2 x 3 and 3 x 2.)
    digests: dict[str, list[dict]] = {}
    for env in ({}, {"SMDDP_PIPELINE": "on"}):
        pool = pools(4, SMDDP_RANKS_PER_NODE="2", **env)
        for api in ("all_reduce", "reduce_scatter_tensor", "reduce_scatter_tensor_inplace"):
            res = pool.run(case_reduce, api, "rpn2", sizes=(1, 97, EMULATED_LARGE), gloo_sizes=(), timeout=120)
            check_results(res)
            digests.setdefault(api, []).append(dict(enumerate(r["outputs"] for r in res)))
        for api in ("all_gather_into_tensor", "all_gather_into_tensor_inplace", "broadcast"):
            res = pool.run(
                case_move, api, "rpn2", dtypes=REDUCE_DTYPES, sizes=(1, 97, EMULATED_LARGE), gloo_sizes=(),
                timeout=120,
            )
            check_results(res)
    for api, (default, pipelined) in digests.items():
        assert all(default.values()), f"{api}: no digests to compare"
        for rank, mine in default.items():
            for key, digest in mine.items():
                assert pipelined[rank].get(key) == digest, (
                    f"{api} {key} rank {rank}: SMDDP_PIPELINE=on gives other bits than the default path"
                )


# ---- the checker itself (no ranks): it must be able to fail


@pytest.mark.timeout(30, func_only=True)
def test_checker_catches_what_it_must() -> None:
    for dname in MOVE_DTYPES:
        dtype = _dtype(dname)
        e = move_input("self-test", 0, (33,), dtype)
        p = poison_like(e)
        err = bytes_mismatch(p, e)
        assert err is not None and err.startswith(f"{33 * e.element_size()} of "), f"{dname}: {err}"
    for dname in REDUCE_DTYPES:
        dtype = _dtype(dname)
        for op in ("SUM", "PRODUCT", "MIN", "MAX") + (("AVG", "PREMUL_SUM") if _is_float(dtype) else ()):
            factor = PREMUL_FACTOR if op == "PREMUL_SUM" else None
            ins = [reduce_input(f"self/{dname}/{op}", r, 257, dtype, op) for r in range(4)]
            ref = reference(ins, dtype, op, factor)
            exact = ref.expected.to(dtype)
            assert mismatch(exact, ref.expected, ref.bound) is None, f"{dname} {op}: the rounded reference fails"
            unwritten = mismatch(poison_like(exact), ref.expected, ref.bound)
            assert unwritten is not None and unwritten.startswith("257 of 257"), f"{dname} {op}: {unwritten}"
            if _is_float(dtype):
                # One element off by twice its bound (by one ulp where the
                # result must be exact) is caught, and named.
                off = exact.clone()
                if op in ("MIN", "MAX"):
                    off[5] = torch.nextafter(off[5], torch.tensor(2.0, dtype=dtype))
                else:
                    off[5] = (ref.expected[5] + 2 * ref.bound[5]).to(dtype)
                got = mismatch(off, ref.expected, ref.bound)
                assert got is not None and got.startswith("1 of 257") and "first at [5]" in got, f"{dname} {op}: {got}"
    # Integer SUM wraps around like torch; bool reduces to OR / AND.
    wrapped = reference(
        [torch.tensor([127, -128], dtype=torch.int8), torch.tensor([1, -1], dtype=torch.int8)], torch.int8, "SUM", None
    )
    assert wrapped.expected.tolist() == [-128, 127]
    bools = [torch.tensor([True, False, True]), torch.tensor([False, False, True])]
    assert reference(bools, torch.bool, "SUM", None).expected.tolist() == [True, False, True]
    assert reference(bools, torch.bool, "PRODUCT", None).expected.tolist() == [False, False, True]
    # A bool byte of 2 is not True.
    two = torch.tensor([2], dtype=torch.uint8).view(torch.bool)
    assert mismatch(two, torch.tensor([True]), None) is not None


# ---------------------------------------------------------------- float16 AVG


def case_float16_average_of_large_values() -> list[str]:
    """float16 AVG of values whose sum leaves float16's range (65504): the
    partial sums that cross nodes in float16 must not overflow."""
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []
    for n in (1, 37, 4096):
        t = torch.full((n,), 30000.0 + rank, dtype=torch.float16)
        want = torch.full((n,), 30000.0 + (world - 1) / 2, dtype=torch.float16)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        if not torch.isfinite(t).all() or (t.float() - want.float()).abs().max() > 16:
            failures.append(f"all_reduce AVG n={n}: {t[:4].tolist()}, expected about {want[0].item()}")
        big = torch.full((n * world,), 30000.0 + rank, dtype=torch.float16)
        out = torch.empty(n, dtype=torch.float16)
        dist.reduce_scatter_tensor(out, big, op=dist.ReduceOp.AVG)
        if not torch.isfinite(out).all() or (out.float() - want.float()).abs().max() > 16:
            failures.append(f"reduce_scatter_tensor AVG n={n}: {out[:4].tolist()}")
    return failures


@pytest.mark.timeout(150, func_only=True)
@pytest.mark.parametrize(
    "env", [{"SMDDP_RANKS_PER_NODE": "2"}, {"SMDDP_RANKS_PER_NODE": "2", "SMDDP_ALGO": "ring"}], ids=["2x2", "ring"]
)
def test_float16_average_does_not_overflow(pools, env) -> None:
    assert_no_failures(pools(4, **env).run(case_float16_average_of_large_values))


# ---------------------------------------------------------------- what the fallback serves


def case_every_delegated_collective() -> list[str]:
    """Each collective smddp leaves to its fallback, with its result checked;
    the point-to-point ones between two ranks only (pipeline parallelism)."""
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    wrong: list[str] = []

    def check(what: str, got: Any, want: Any) -> None:
        if got != want:
            wrong.append(f"{what}: got {got}, expected {want}")

    # Point to point between ranks 0 and 1 alone, then a ring of isend/irecv.
    if rank == 0:
        dist.send(torch.tensor([7.0, 8.0]), dst=1)
    elif rank == 1:
        t = torch.empty(2)
        dist.recv(t, src=0)
        check("send/recv", t.tolist(), [7.0, 8.0])
    got = torch.empty(3)
    ops = [dist.P2POp(dist.isend, torch.full((3,), float(rank)), (rank + 1) % world),
           dist.P2POp(dist.irecv, got, (rank - 1) % world)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check("batch_isend_irecv", got.tolist(), [float((rank - 1) % world)] * 3)
    # Rooted collectives.
    mine = torch.tensor([float(rank), 1.0])
    gathered = [torch.empty(2) for _ in range(world)] if rank == 0 else None
    dist.gather(mine, gathered, dst=0)
    if rank == 0:
        check("gather", [g.tolist() for g in gathered], [[float(r), 1.0] for r in range(world)])
    part = torch.empty(2)
    dist.scatter(part, [torch.full((2,), 10.0 + r) for r in range(world)] if rank == world - 1 else None, src=world - 1)
    check("scatter", part.tolist(), [10.0 + rank] * 2)
    red = torch.tensor([float(rank + 1)])
    dist.reduce(red, dst=1)
    if rank == 1:
        check("reduce", red.tolist(), [world * (world + 1) / 2])
    # All to all, list form.
    outs = [torch.empty(1) for _ in range(world)]
    dist.all_to_all(outs, [torch.tensor([100.0 * rank + r]) for r in range(world)])
    check("all_to_all", [o.item() for o in outs], [100.0 * r + rank for r in range(world)])
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    objs: list[Any] = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "name": "r" * (rank + 1)})
    check("all_gather_object", objs, [{"rank": r, "name": "r" * (r + 1)} for r in range(world)])
    return wrong


@pytest.mark.timeout(150, func_only=True)
@pytest.mark.parametrize("world, env", [(3, {}), (4, {"SMDDP_RANKS_PER_NODE": "2"})], ids=["1x3", "2x2"])
def test_every_delegated_collective(pools, world: int, env: dict) -> None:
    assert_no_failures(pools(world, **env).run(case_every_delegated_collective, timeout=100))
