"""smddp-bench: smddp against its rival, side by side, and the cost model.

    smddp-bench                          # smddp vs gloo (nccl on GPUs), nccl-tests style
    smddp-bench model --preset p4d       # flat ring vs smddp's hierarchy at 16-128 nodes
    python -m smddp.bench --help

The modules are the torch-free core every benchmark of the repository is
built on (bench/README.md lists them); ``sweep`` is its torch side.
"""

from __future__ import annotations

try:
    import numpy  # noqa: F401 - the expected results are computed with it
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "smddp-bench needs numpy: pip install 'smddp[bench]' (numpy, and tqdm and "
        "matplotlib for the progress bar and the plot, both optional)"
    ) from e

from smddp.bench.model import PRESETS, Estimate, Machine, estimate, fit_alpha_beta
from smddp.bench.model import hierarchical_time, ring_time
from smddp.bench.ops import OPS, Geometry, algbw_gbs, bus_factor, busbw_gbs, geometry
from smddp.bench.timing import Timing
from smddp.bench.units import format_size, parse_size, parse_size_list, size_range

__all__ = [
    "OPS", "PRESETS", "Estimate", "Geometry", "Machine", "Timing", "algbw_gbs", "bus_factor",
    "busbw_gbs", "estimate", "fit_alpha_beta", "format_size", "geometry", "hierarchical_time",
    "ring_time", "parse_size", "parse_size_list", "size_range",
]  # fmt: skip


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    # The command's pieces import torch: loaded when asked for.
    if name in ("main", "parse_run_args"):
        from smddp.bench import cli

        return getattr(cli, name)
    raise AttributeError(f"module 'smddp.bench' has no attribute {name!r}")
