"""One table formatter for every benchmark here: a list of columns, rows of
values, optional groups of columns under a common label (a backend's
``time algbw busbw #wrong``), printed nccl-tests style (header lines start
with ``# ``, rows with two spaces, so that both can be printed one at a time
as they are measured) or as markdown for the docs. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    if value is None:
        return ""
    return value if isinstance(value, str) else col.fmt.format(value)


def _spans(columns: Sequence[Column], groups: Groups) -> list[int]:
    spans = [n for _, n in groups] or [len(columns)]
    if sum(spans) != len(columns):
        raise ValueError(f"groups cover {sum(spans)} of {len(columns)} columns")
    return spans


def _line(columns: Sequence[Column], texts: Sequence[str], groups: Groups) -> str:
    out, i = "", 0
    for g, span in enumerate(_spans(columns, groups)):
        parts = []
        for col, text in zip(columns[i : i + span], texts[i : i + span]):
            parts.append(f"{text:<{col.width}}" if col.left else f"{text:>{col.width}}")
        out += ("  " if g else "") + " ".join(parts)
        i += span
    return out


def header(columns: Sequence[Column], groups: Groups = ()) -> str:
    """The header lines (group labels, names, units), each starting with ``#``."""
    lines = []
    if any(label for label, _ in groups):
        i, line = 0, ""
        for g, (label, span) in enumerate(groups):
            width = sum(c.width for c in columns[i : i + span]) + span - 1
            line += ("  " if g else "") + f"{label:^{width}}"
            i += span
        lines.append(line)
    lines.append(_line(columns, [c.name for c in columns], groups))
    if any(c.unit for c in columns):
        lines.append(_line(columns, [c.unit for c in columns], groups))
    return "\n".join(("# " + ln).rstrip() for ln in lines)


def row(columns: Sequence[Column], values: Sequence[Any], groups: Groups = ()) -> str:
    return ("  " + _line(columns, [cell(c, v) for c, v in zip(columns, values)], groups)).rstrip()


def _sized(columns: Sequence[Column], rows: Sequence[Sequence[Any]]) -> list[Column]:
    out = []
    for i, c in enumerate(columns):
        if c.width:
            out.append(c)
            continue
        widest = max([len(c.name), len(c.unit)] + [len(cell(c, r[i])) for r in rows if r])
        out.append(Column(c.name, c.unit, c.fmt, widest, c.left))
    return out


def text(
    columns: Sequence[Column], rows: Sequence[Sequence[Any] | None], groups: Groups = ()
) -> str:
    """A whole table; a row of None is a blank line between blocks."""
    cols = _sized(columns, [r for r in rows if r])
    lines = [header(cols, groups)] + [row(cols, r, groups) if r else "" for r in rows]
    return "\n".join(lines)


def markdown(
    columns: Sequence[Column], rows: Sequence[Sequence[Any] | None], groups: Groups = ()
) -> str:
    """The same table in markdown; group labels prefix their columns' names."""
    labels: list[str] = []
    for label, span in groups or [("", len(columns))]:
        labels += [label] * span
    names = []
    for label, c in zip(labels, columns):
        unit = f" ({c.unit.strip('()')})" if c.unit.strip("()") else ""
        names.append(f"{label} {c.name}{unit}".strip())
    lines = ["| " + " | ".join(names) + " |"]
    lines.append("|" + "|".join("---" if c.left else "---:" for c in columns) + "|")
    for r in rows:
        if r:
            lines.append("| " + " | ".join(cell(c, v) for c, v in zip(columns, r)) + " |")
    return "\n".join(lines)
