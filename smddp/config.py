"""The SMDDP_* environment variables.

The native core declares each knob once (csrc/common/config.h: its kind,
default, values, whether ranks must agree on it, and its help, with the
values the "auto" settings resolve to interpolated from the code's own
constants); this module reads that table from the extension, for Python users
and the docs (``python -m smddp.config`` prints docs/configuration.md's table).
Values are read when a process group is created, so set them before
``init_process_group`` / ``new_group``; a bad value is an error naming the
variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Knob:
    name: str
    agree: bool  # must be the same on every rank of a group
    kind: str  # choice, bytes, int, autoint / autobytes ("auto" or a value), bool or string
    default: str
    domain: str  # choices ("a|b") or range ("lo..hi")
    help: str


def _native_knobs() -> tuple[Knob, ...]:
    import torch  # noqa: F401  (loads the libraries smddp._C links against)

    from smddp import _C

    return tuple(
        Knob(k["name"], k["agree"], k["kind"], k["default"], k["domain"], k["help"]) for k in _C.config_knobs()
    )


KNOBS: tuple[Knob, ...] = _native_knobs()


def knob(name: str) -> Knob:
    """The knob called ``name`` (KeyError if there is none)."""
    for k in KNOBS:
        if k.name == name:
            return k
    raise KeyError(name)


def current() -> dict[str, str]:
    """Every knob's value as this process sees it (the default if unset)."""
    return {k.name: (os.environ.get(k.name) or k.default) for k in KNOBS}


def check() -> None:
    """Raises ValueError naming the first SMDDP_* variable with a bad value."""
    from smddp import _C

    _C.check_config()


def apply_log_level() -> None:
    """Applies SMDDP_LOG_LEVEL to the native logger."""
    from smddp import _C

    level = (os.environ.get("SMDDP_LOG_LEVEL") or "warn").strip().lower()
    _C.set_log_level(level)


def markdown_table() -> str:
    """The table of knobs of docs/configuration.md."""
    rows = ["| variable | default | values | agree | meaning |", "|---|---|---|---|---|"]
    for k in KNOBS:
        values = k.domain.replace("|", ", ") if k.kind == "choice" else (k.domain or k.kind)
        if k.kind == "bytes":
            values = f"bytes, {k.domain} (K/M/G suffixes)"
        elif k.kind == "autoint":
            values = f"auto, or {k.domain}"
        elif k.kind == "autobytes":
            values = f"auto, or bytes {k.domain} (K/M/G suffixes)"
        agree = "agree" if k.agree else ""
        rows.append(f"| `{k.name}` | `{k.default or '(empty)'}` | {values} | {agree} | {k.help} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
