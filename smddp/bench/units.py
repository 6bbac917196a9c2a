"""Byte sizes as nccl-tests spells them (``4K``, ``256M``, ``1G``: powers of
1024), comma lists of names, and the command-line options every benchmark
here shares. Plain integers are bytes; ``KB``/``KiB`` etc. are read as the
same binary units, because that is what people type after reading nccl-tests
output.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)

# A sweep longer than this is almost certainly a typo (-f 1.0001, -i 1).
MAX_POINTS = 4096

# What people type for the collectives (nccl-tests' names, abbreviations).
OP_ALIASES = {"allgather": "all_gather", "ag": "all_gather", "reducescatter": "reduce_scatter",
              "rs": "reduce_scatter", "allreduce": "all_reduce", "ar": "all_reduce", "bcast": "broadcast"}


def parse_size(text: str) -> int:
    """``"4K"`` -> 4096. Raises ValueError naming the text if it is not a size."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (expected bytes such as 4096, 4K, 16M, 1G)")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value != math.floor(value):
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return int(value)


def parse_size_list(text: str) -> list[int]:
    """``"1M,16M"`` -> [1048576, 16777216]; sizes must be positive."""
    parts = [p for p in str(text).split(",") if p.strip()]
    if not parts:
        raise ValueError(f"empty size list: {text!r}")
    sizes = [parse_size(p) for p in parts]
    for p, s in zip(parts, sizes):
        if s <= 0:
            raise ValueError(f"sizes must be positive: {p.strip()!r}")
    return sizes


def size_range(minbytes: int, maxbytes: int, factor: float = 2, step: int = 0) -> list[int]:
    """The sizes nccl-tests sweeps for ``-b min -e max -f factor`` (or ``-i step``,
    which wins over the factor, as in nccl-tests)."""
    if minbytes <= 0:
        raise ValueError(f"the smallest size must be positive, got {minbytes}")
    if maxbytes < minbytes:
        raise ValueError(f"the largest size ({format_size(maxbytes)}) is below the smallest ({format_size(minbytes)})")
    if step < 0:
        raise ValueError(f"the step in bytes must be positive, got {step}")
    if not step and factor <= 1:
        raise ValueError(f"the step factor must be above 1, got {factor}")
    sizes, size = [], minbytes
    while size <= maxbytes:
        sizes.append(size)
        if len(sizes) > MAX_POINTS:
            raise ValueError(f"more than {MAX_POINTS} sizes from {minbytes} to {maxbytes}")
        size = size + step if step else max(size + 1, int(size * factor))
    return sizes


def format_size(nbytes: int) -> str:
    """4096 -> ``"4K"``; sizes that are not whole units stay in bytes."""
    for suffix in ("T", "G", "M", "K"):
        unit = _UNITS[suffix]
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit}{suffix}"
    return str(nbytes)


def parse_counts(text: str, low: int = 1) -> tuple[int, ...]:
    """``"8,2,4"`` -> (2, 4, 8): whole numbers of at least ``low``, sorted, once each."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    for part in parts:
        if not part.isdigit() or int(part) < low:
            raise ValueError(f"not a whole number of at least {low}: {part!r}")
    if not parts:
        raise ValueError(f"no number given: {text!r}")
    return tuple(sorted({int(p) for p in parts}))


def choose(text: str, allowed: Iterable[str], what: str, aliases: dict[str, str] | None = None,
           canonical: bool = False) -> tuple[str, ...]:  # fmt: skip
    """A comma list of names from ``allowed`` (or ``all``), aliases resolved and
    duplicates dropped, in the order typed (``canonical``: in ``allowed``'s)."""
    allowed = tuple(allowed)
    names = [p.strip().lower() for p in str(text).split(",") if p.strip()]
    if names == ["all"]:
        return allowed
    out = tuple(dict.fromkeys((aliases or {}).get(n, n) for n in names))
    for n in out:
        if n not in allowed:
            raise ValueError(f"unknown {what} {n!r} (choose from {', '.join(allowed)}, or all)")
    if not out:
        raise ValueError(f"no {what} given")
    return tuple(a for a in allowed if a in out) if canonical else out


# -- command-line options ------------------------------------------------------------


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except the ones that only mean "decided later"."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False) or "[" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


def arg(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as an argparse type: its ValueError's message becomes the
    usage error (argparse would print only "invalid value")."""

    def wrapped(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return wrapped


def at_least(low: Any, kind: Callable[[str], Any] = int) -> Callable[[str], Any]:
    """An argparse type: ``kind(text)`` (an int unless told), at least ``low``."""

    def value(text: str) -> Any:
        number = kind(text)
        if number < low:
            raise ValueError(f"must be at least {low}, got {text}")
        return number

    return arg(value)


def positive(text: str) -> float:
    """An argparse type: a number above 0."""
    if not float(text) > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return float(text)


@dataclass(frozen=True)
class SizeOptions:
    """``--sizes``, or nccl-tests' ``-b``/``-e``/``-f``/``-i``, and what they
    mean when left out: ``sizes`` if neither is given (the range of the
    defaults when empty), the defaults for the bounds that are not given."""

    sizes: str = ""
    minbytes: str = "4K"
    maxbytes: str = "64M"
    factor: float = 2.0

    def add(self, group: Any) -> None:
        default = f" [{self.sizes}]" if self.sizes else ""
        group.add_argument("--sizes", type=arg(parse_size_list),
                           help=f"comma list of sizes instead of -b/-e/-f/-i, e.g. 1M,16M{default}")
        group.add_argument("-b", "--minbytes", type=arg(parse_size), help=f"smallest size [{self.minbytes}]")
        group.add_argument("-e", "--maxbytes", type=arg(parse_size), help=f"largest size [{self.maxbytes}]")
        group.add_argument("-f", "--stepfactor", type=float, help=f"size multiplier [{self.factor:g}]")
        group.add_argument("-i", "--stepbytes", type=arg(parse_size), help="size increment (instead of -f)")

    def parse(self, ns: argparse.Namespace) -> list[int]:
        """The sizes asked for; ValueError when they are not a valid sweep."""
        given = {k: v for k, v in vars(ns).items()
                 if k in ("minbytes", "maxbytes", "stepfactor", "stepbytes") and v is not None}  # fmt: skip
        if ns.sizes is not None and given:
            raise ValueError("give either --sizes or -b/-e/-f/-i, not both")
        if ns.sizes is not None or (self.sizes and not given):
            return ns.sizes or parse_size_list(self.sizes)
        return size_range(given.get("minbytes", parse_size(self.minbytes)),
                          given.get("maxbytes", parse_size(self.maxbytes)),
                          given.get("stepfactor", self.factor), given.get("stepbytes", 0))
