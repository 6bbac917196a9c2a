"""The benchmarked collectives: nccl-tests' size and bandwidth definitions,
deterministic inputs and the independently computed expected results.

Sizes follow nccl-tests (src/common.cu prints ``max(sendBytes, recvBytes)``;
each test's ``GetCollByteCount`` splits it):

=============== ====================== ================== =====================
op              size column            count column       buffers per rank
=============== ====================== ================== =====================
all_gather      output bytes (n*c*e)   c per rank         in c, out n*c
reduce_scatter  input bytes (n*c*e)    c per rank         in n*c, out c
all_reduce      buffer bytes (c*e)     c                  one buffer of c
broadcast       buffer bytes (c*e)     c                  one buffer of c
=============== ====================== ================== =====================

where a requested size S gives ``c = S // (n*e)`` (AllGather, ReduceScatter)
or ``c = S // e``, n is the world size and e the element size. algbw = size /
time; busbw = algbw * (n-1)/n for AllGather and ReduceScatter, algbw *
2(n-1)/n for AllReduce, algbw for Broadcast (nccl-tests doc/PERFORMANCE.md).

The inputs are small integers, so sums, products, minima and maxima are exact
in every dtype at the world sizes a benchmark uses, and a result can be
compared with the expected value exactly; only AVG needs a tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GB = 1e9


@dataclass(frozen=True)
class OpSpec:
    name: str
    title: str
    reduces: bool
    in_place: bool


OPS: dict[str, OpSpec] = {
    "all_gather": OpSpec("all_gather", "AllGather", False, False),
    "reduce_scatter": OpSpec("reduce_scatter", "ReduceScatter", True, False),
    "all_reduce": OpSpec("all_reduce", "AllReduce", True, True),
    "broadcast": OpSpec("broadcast", "Broadcast", False, True),
}
DEFAULT_OPS = ("all_gather", "reduce_scatter", "all_reduce")

REDOPS = ("sum", "prod", "min", "max", "avg")

# name -> (element size, whether floating point); aliases map to these names.
DTYPES: dict[str, tuple[int, bool]] = {
    "float32": (4, True),
    "float64": (8, True),
    "float16": (2, True),
    "bfloat16": (2, True),
    "int32": (4, False),
    "int64": (8, False),
}
DTYPE_ALIASES = {
    "float": "float32",
    "fp32": "float32",
    "f32": "float32",
    "double": "float64",
    "fp64": "float64",
    "f64": "float64",
    "half": "float16",
    "fp16": "float16",
    "f16": "float16",
    "bf16": "bfloat16",
    "int": "int32",
    "long": "int64",
}
# Unit roundoff of each floating dtype: the AVG check allows a few of them.
EPS = {"float32": 2.0**-24, "float64": 2.0**-53, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def canonical_dtype(name: str) -> str:
    """``"bf16"`` -> ``"bfloat16"``; ValueError for a dtype the benchmark lacks."""
    key = name.strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r} (choose from {', '.join(DTYPES)})")
    return key


@dataclass(frozen=True)
class Geometry:
    """One point of a sweep, in nccl-tests' terms."""

    count: int  # the 'count' column
    size: int  # the 'size' column, bytes
    in_numel: int  # elements of this rank's input
    out_numel: int  # elements of this rank's output


def geometry(op: str, nbytes: int, elem_size: int, world: int) -> Geometry | None:
    """The buffers for a requested size; None when it rounds to no element."""
    if op in ("all_gather", "reduce_scatter"):
        c = nbytes // (elem_size * world)
        if c == 0:
            return None
        size = c * world * elem_size
        if op == "all_gather":
            return Geometry(c, size, c, c * world)
        return Geometry(c, size, c * world, c)
    if op in ("all_reduce", "broadcast"):
        c = nbytes // elem_size
        if c == 0:
            return None
        return Geometry(c, c * elem_size, c, c)
    raise ValueError(f"unknown op {op!r}")


def bus_factor(op: str, world: int) -> float:
    """busbw / algbw for ``op`` on ``world`` ranks (nccl-tests doc/PERFORMANCE.md)."""
    if world <= 1:
        return 0.0 if op != "broadcast" else 1.0
    if op in ("all_gather", "reduce_scatter"):
        return (world - 1) / world
    if op == "all_reduce":
        return 2 * (world - 1) / world
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown op {op!r}")


def algbw_gbs(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (GB = 1e9 bytes)."""
    return size_bytes / seconds / GB


def busbw_gbs(op: str, size_bytes: int, seconds: float, world: int) -> float:
    """Bus bandwidth in GB/s, nccl-tests' definition."""
    return algbw_gbs(size_bytes, seconds) * bus_factor(op, world)


# Inputs repeat with a prime period so that a block misplaced by any
# power-of-two offset lands on different values.
_PERIOD = 1021


def _tile(rank: int, redop: str) -> np.ndarray:
    idx = (np.arange(_PERIOD, dtype=np.int64) * 37 + rank * 101) % _PERIOD
    if redop == "prod":
        # Mostly ones so that products of many ranks stay representable.
        return np.where(idx % 13 == 0, 2.0, np.where(idx % 11 == 0, -1.0, 1.0))
    return (idx % 17 - 8).astype(np.float64)


def _stretch(tile: np.ndarray, start: int, count: int) -> np.ndarray:
    return np.resize(np.roll(tile, -(start % _PERIOD)), count)


def input_values(rank: int, start: int, count: int, redop: str) -> np.ndarray:
    """Elements ``start .. start+count-1`` of rank ``rank``'s input, as float64."""
    return _stretch(_tile(rank, redop), start, count)


def _combined_tile(world: int, redop: str) -> np.ndarray:
    tiles = np.stack([_tile(r, redop) for r in range(world)])
    if redop in ("sum", "avg"):
        out = tiles.sum(axis=0)
        return out / world if redop == "avg" else out
    if redop == "prod":
        return tiles.prod(axis=0)
    if redop == "min":
        return tiles.min(axis=0)
    if redop == "max":
        return tiles.max(axis=0)
    raise ValueError(f"unknown reduction {redop!r}")


def rank_input(op: str, redop: str, rank: int, geom: Geometry, root: int) -> np.ndarray | None:
    """This rank's input (None: a broadcast receiver, whose buffer is output only)."""
    if op == "broadcast" and rank != root:
        return None
    owner = root if op == "broadcast" else rank
    return input_values(owner, 0, geom.in_numel, redop)


def expected_output(
    op: str, redop: str, rank: int, world: int, geom: Geometry, root: int
) -> np.ndarray:
    """What ``rank`` must hold after the collective, computed from the input
    formula alone (never through a collective)."""
    c = geom.count
    if op == "all_gather":
        return np.concatenate([input_values(q, 0, c, redop) for q in range(world)])
    if op == "broadcast":
        return input_values(root, 0, c, redop)
    tile = _combined_tile(world, redop)
    if op == "reduce_scatter":
        return _stretch(tile, rank * c, c)
    if op == "all_reduce":
        return _stretch(tile, 0, c)
    raise ValueError(f"unknown op {op!r}")
