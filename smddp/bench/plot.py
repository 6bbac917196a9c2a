"""The one plot writer: busbw against size, one panel per table, one line per
backend, from point records (measured, with no wrong element). matplotlib is
optional; without it nothing is written."""

from __future__ import annotations

import math
import os
from typing import Callable, Sequence

from smddp.bench.record import measured
from smddp.bench.units import format_size


def busbw(results: list[dict], keys: Sequence[str], title_of: Callable[[tuple], str], path: str,
          title: str, ncols: int = 3) -> bool:
    """Writes the PNG: one panel per distinct value of ``keys``, titled
    ``title_of(values)``; False (and nothing written) without matplotlib."""
    series: dict[tuple, dict[str, list[tuple[int, float]]]] = {}
    for r in results:
        if measured(r) and not r.get("wrong"):
            points = series.setdefault(tuple(r[k] for k in keys), {}).setdefault(r["backend"], [])
            points.append((r["size_bytes"], r["busbw_gbs"]))
    panels = [(title_of(k), s) for k, s in series.items()] or [("nothing measured", {})]
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = min(ncols, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.9 * nrows), squeeze=False)
    for i, (name, series) in enumerate(panels):
        ax = axes[i // ncols][i % ncols]
        sizes: set[int] = set()
        for j, (label, pts) in enumerate(series.items()):
            if pts:
                xs, ys = zip(*sorted(pts))
                sizes.update(xs)
                ax.plot(xs, ys, marker="osD^v<>"[j % 7], linewidth=1.7, markersize=4, label=label)
        ax.set_xscale("log", base=2)
        ticks = sorted(sizes)[:: math.ceil(len(sizes) / 10) or 1]
        ax.set_xticks(ticks)
        ax.set_xticklabels([format_size(t) for t in ticks], rotation=45 if len(ticks) > 6 else 0)
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.set_xlabel("size (bytes, nccl-tests definition)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(name, fontsize=10)
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    for k in range(len(panels), nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=105)
    plt.close(fig)
    return True

