"""The benchmarked collectives: nccl-tests' size and bandwidth definitions, the
one input generator and the one oracle every benchmark here checks with.

A requested size S on n ranks of e-byte elements gives a count c = S // (n*e)
per rank for AllGather and ReduceScatter (size column: n*c*e, the larger
buffer, as nccl-tests' ``max(sendBytes, recvBytes)``), c = S // e for
AllReduce and Broadcast; busbw = algbw * (n-1)/n, * 2(n-1)/n for AllReduce, *
1 for Broadcast (nccl-tests doc/PERFORMANCE.md; bench/README.md has the table).

The inputs are small integers with a prime period, so sums, products, minima
and maxima are exact in every dtype at the world sizes a benchmark uses, and
a block misplaced by any power-of-two offset lands on different values. The
oracle compares one period-aligned block at a time against values computed
from the input formula alone (never through a collective); only floating
SUM/AVG get a tolerance. Torch-free: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

GB = 1e9


@dataclass(frozen=True)
class OpSpec:
    title: str  # nccl-tests' name
    reduces: bool


OPS: dict[str, OpSpec] = {
    "all_gather": OpSpec("AllGather", False),
    "reduce_scatter": OpSpec("ReduceScatter", True),
    "all_reduce": OpSpec("AllReduce", True),
    "broadcast": OpSpec("Broadcast", False),
}
DEFAULT_OPS = ("all_gather", "reduce_scatter", "all_reduce")
REDOPS = ("sum", "prod", "min", "max", "avg")

# name -> (element size, whether floating point); aliases map to these names.
DTYPES: dict[str, tuple[int, bool]] = {
    "float32": (4, True), "float64": (8, True), "float16": (2, True), "bfloat16": (2, True),
    "int32": (4, False), "int64": (8, False), "uint8": (1, False),
}  # fmt: skip
DTYPE_ALIASES = {
    "float": "float32", "fp32": "float32", "f32": "float32", "double": "float64",
    "fp64": "float64", "f64": "float64", "half": "float16", "fp16": "float16",
    "f16": "float16", "bf16": "bfloat16", "int": "int32", "long": "int64",
}  # fmt: skip
# Unit roundoff of each floating dtype: the AVG check allows a few of them.
EPS = {"float32": 2.0**-24, "float64": 2.0**-53, "float16": 2.0**-11, "bfloat16": 2.0**-8}


@dataclass(frozen=True)
class Geometry:
    """One point of a sweep, in nccl-tests' terms."""

    count: int  # the 'count' column
    size: int  # the 'size' column, bytes
    in_numel: int  # elements of this rank's input
    out_numel: int  # elements of this rank's output


def of_count(op: str, c: int, elem_size: int, world: int) -> Geometry:
    """The buffers of ``op`` with ``c`` in its count column."""
    if op == "all_gather":
        return Geometry(c, c * world * elem_size, c, c * world)
    if op == "reduce_scatter":
        return Geometry(c, c * world * elem_size, c * world, c)
    return Geometry(c, c * elem_size, c, c)


def geometry(op: str, nbytes: int, elem_size: int, world: int) -> Geometry | None:
    """The buffers for a requested size; None when it rounds to no element."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}")
    c = nbytes // (elem_size * world if op in ("all_gather", "reduce_scatter") else elem_size)
    return of_count(op, c, elem_size, world) if c else None


def bus_factor(op: str, world: int) -> float:
    """busbw / algbw for ``op`` on ``world`` ranks (nccl-tests doc/PERFORMANCE.md)."""
    if op == "broadcast":
        return 1.0
    if world <= 1:
        return 0.0
    return (2 if op == "all_reduce" else 1) * (world - 1) / world


def algbw_gbs(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (GB = 1e9 bytes)."""
    return size_bytes / seconds / GB


def busbw_gbs(op: str, size_bytes: int, seconds: float, world: int) -> float:
    """Bus bandwidth in GB/s, nccl-tests' definition."""
    return algbw_gbs(size_bytes, seconds) * bus_factor(op, world)


PERIOD = 1021  # prime: see the module docstring
_BLOCK = PERIOD * 1024  # elements the oracle compares at a time


def _tile(rank: int, redop: str, dtype: str) -> np.ndarray:
    idx = (np.arange(PERIOD, dtype=np.int64) * 37 + rank * 101) % PERIOD
    unsigned = dtype == "uint8"
    if redop == "prod":
        # Mostly ones so that products of many ranks stay representable.
        return np.where(idx % 13 == 0, 2.0, np.where((idx % 11 == 0) & (not unsigned), -1.0, 1.0))
    return (idx % 17 - (0 if unsigned else 8)).astype(np.float64)


def _combined(world: int, redop: str, dtype: str) -> np.ndarray:
    tiles = np.stack([_tile(r, redop, dtype) for r in range(world)])
    reduce = {"sum": np.sum, "avg": np.mean, "prod": np.prod, "min": np.min, "max": np.max}
    out = reduce[redop](tiles, axis=0)
    return out % 256 if dtype == "uint8" else out  # the collective wraps as the dtype does


def _stretch(tile: np.ndarray, start: int, count: int) -> np.ndarray:
    return np.resize(np.roll(tile, -(start % PERIOD)), count)


def input_values(rank: int, start: int, count: int, redop: str, dtype: str = "float32") -> np.ndarray:
    """Elements ``start .. start+count-1`` of rank ``rank``'s input, as float64."""
    return _stretch(_tile(rank, redop, dtype), start, count)


def rank_input(
    op: str, redop: str, rank: int, geom: Geometry, root: int, dtype: str = "float32",
    offset: int = 0,
) -> np.ndarray | None:  # fmt: skip
    """This rank's input (None: a broadcast receiver, whose buffer is output only);
    ``offset`` shifts every rank's inputs alike, so that calls differ."""
    if op == "broadcast" and rank != root:
        return None
    owner = root if op == "broadcast" else rank
    return input_values(owner, offset, geom.in_numel, redop if OPS[op].reduces else "sum", dtype)


def tolerance(op: str, dtype: str, redop: str) -> float:
    """Relative error the check allows: exact except floating SUM/AVG (AVG's
    division, sums over many ranks in the narrow dtypes)."""
    floating = DTYPES[dtype][1]
    return 4 * EPS[dtype] if floating and OPS[op].reduces and redop in ("sum", "avg") else 0.0


def count_wrong(
    op: str, redop: str, dtype: str, rank: int, world: int, geom: Geometry, root: int,
    get: Callable[[int, int], Any], offset: int = 0,
) -> int:  # fmt: skip
    """Elements of ``rank``'s output that differ from the expected value;
    ``get(a, b)`` returns output elements a..b-1 (any numeric array). The
    expected values are never materialized beyond one block."""
    c = geom.count
    r = redop if OPS[op].reduces else "sum"
    if op == "all_gather":
        segments = [(q * c, _tile(q, r, dtype), offset) for q in range(world)]
    elif op == "broadcast":
        segments = [(0, _tile(root, r, dtype), offset)]
    else:
        start = offset + (rank * c if op == "reduce_scatter" else 0)
        segments = [(0, _combined(world, r, dtype), start)]
    tol = tolerance(op, dtype, redop)
    wrong = 0
    for base, tile, start in segments:
        want = _stretch(tile, start, min(_BLOCK, c))
        for a in range(0, c, _BLOCK):
            b = min(a + _BLOCK, c)
            got = np.asarray(get(base + a, base + b), dtype=np.float64)
            w = want[: b - a]
            # Written so that NaN (the poison) counts as wrong.
            wrong += int(np.count_nonzero(~(np.abs(got - w) <= tol * np.abs(w))))
    return wrong
