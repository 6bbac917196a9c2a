"""One table formatter for every benchmark here: a list of columns, rows of
values, optional groups of columns under a common label (a backend's
``time algbw busbw #wrong``), printed nccl-tests style (header lines start
with ``# ``, rows with two spaces, so that both can be printed one at a time
as they are measured) or as markdown for the docs. Torch-free.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any, Sequence


@dataclass(frozen=True)
class Column:
    name: str
    unit: str = ""
    fmt: str = "{}"  # for values that are not already text
    width: int = 0  # text width; 0: as wide as the widest cell (whole tables only)
    left: bool = False  # aligned left (names) instead of right (numbers)


Groups = Sequence[tuple[str, int]]  # (label, number of consecutive columns)


def grouped(*blocks: tuple[str, Sequence[Column]]) -> tuple[list[Column], list[tuple[str, int]]]:
    """The columns of consecutive labelled blocks, and their groups (an empty
    block has none)."""
    columns = [c for _, block in blocks for c in block]
    return columns, [(label, len(block)) for label, block in blocks if block]


def cell(col: Column, value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else col.fmt.format(value)


def _split(items: Sequence[Any], columns: Sequence[Column], groups: Groups) -> list[Sequence[Any]]:
    """``items`` (one per column) cut into the groups' blocks."""
    spans = [n for _, n in groups] or [len(columns)]
    if sum(spans) != len(columns):
        raise ValueError(f"groups cover {sum(spans)} of {len(columns)} columns")
    starts = list(itertools.accumulate(spans, initial=0))
    return [items[a:b] for a, b in zip(starts, starts[1:])]


def _line(columns: Sequence[Column], texts: Sequence[str], groups: Groups) -> str:
    parts = [f"{t:<{c.width}}" if c.left else f"{t:>{c.width}}" for c, t in zip(columns, texts)]
    return "  ".join(" ".join(block) for block in _split(parts, columns, groups))


def header(columns: Sequence[Column], groups: Groups = ()) -> str:
    """The header lines (group labels, names, units), each starting with ``#``."""
    lines = []
    if any(label for label, _ in groups):
        widths = [sum(c.width for c in b) + len(b) - 1 for b in _split(columns, columns, groups)]
        lines.append("  ".join(f"{label:^{w}}" for (label, _), w in zip(groups, widths)))
    lines.append(_line(columns, [c.name for c in columns], groups))
    if any(c.unit for c in columns):
        lines.append(_line(columns, [c.unit for c in columns], groups))
    return "\n".join(("# " + ln).rstrip() for ln in lines)


def row(columns: Sequence[Column], values: Sequence[Any], groups: Groups = ()) -> str:
    return ("  " + _line(columns, [cell(c, v) for c, v in zip(columns, values)], groups)).rstrip()


def _sized(columns: Sequence[Column], rows: Sequence[Sequence[Any]]) -> list[Column]:
    widest = lambda i, c: max([len(c.name), len(c.unit)] + [len(cell(c, r[i])) for r in rows])  # noqa: E731
    return [c if c.width else replace(c, width=widest(i, c)) for i, c in enumerate(columns)]


def text(columns: Sequence[Column], rows: Sequence[Sequence[Any] | None], groups: Groups = ()) -> str:
    """A whole table; a row of None is a blank line between blocks."""
    cols = _sized(columns, [r for r in rows if r])
    lines = [header(cols, groups)] + [row(cols, r, groups) if r else "" for r in rows]
    return "\n".join(lines)


def markdown(columns: Sequence[Column], rows: Sequence[Sequence[Any] | None], groups: Groups = ()) -> str:
    """The same table in markdown; group labels prefix their columns' names."""
    labels = [label for label, span in groups or [("", len(columns))] for _ in range(span)]
    units = [f" ({c.unit.strip('()')})" if c.unit.strip("()") else "" for c in columns]
    names = [f"{label} {c.name}{unit}".strip() for label, c, unit in zip(labels, columns, units)]
    lines = ["| " + " | ".join(names) + " |"]
    lines.append("|" + "|".join("---" if c.left else "---:" for c in columns) + "|")
    lines += ["| " + " | ".join(cell(c, v) for c, v in zip(columns, r)) + " |" for r in rows if r]
    return "\n".join(lines)
