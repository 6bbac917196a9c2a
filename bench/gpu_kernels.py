"""The GPU reduction kernel against the same GPU's device-to-device copy.

    python bench/gpu_kernels.py [--json FILE] [--sizes 64M,256M,1G] [--blocks 16,32,64]

For each dtype (float32, bfloat16) and size, times smddp's reduction of two
sources into a third buffer (reads 2n, writes n elements) and torch's
device-to-device copy (reads n, writes n), each call between CUDA events
(smddp.bench.timing, a barrier before each call: median of 20 after 3 warm-up
calls), checks both, and reports each as bytes moved per second and the
ratio. The kernel is timed with several block counts
(SMDDP_CUDA_REDUCE_BLOCKS): the collectives use few blocks to leave the GPU to
the computation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from types import SimpleNamespace
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository's root is one folder up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from smddp.bench import record, table, timing  # noqa: E402
from smddp.bench.units import parse_size_list  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None, help="the record (kind gpu-kernels)")
    p.add_argument("--sizes", default="64M,256M,1G", help="bytes per source buffer")
    p.add_argument("--blocks", default="16,32,64,132,264", help="block counts of the kernel")
    p.add_argument("--offsets", default="0,1",
                   help="element offsets of every buffer: 0 aligned; 1 as an AllReduce slice of an "
                        "odd element count per rank (a scalar head, then vectors)")
    args = p.parse_args(argv)
    import torch

    import smddp

    cuda = smddp._cuda.status()
    if not torch.cuda.is_available() or not cuda["available"]:
        print("no GPU, or no CUDA module:", cuda["reason"] or "no GPU")
        return 1
    kernels = smddp._cuda.load()
    sizes, blocks = parse_size_list(args.sizes), [int(b) for b in args.blocks.split(",")]
    offsets = [int(o) for o in args.offsets.split(",")]
    how = timing.Timing(timing.BARRIER_EACH, warmup=3, block_warmup=0, iters=20, rounds=1)

    def clock():  # type: ignore[no-untyped-def]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()

        def stop() -> float:
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3

        return stop

    def gbs(run: Any, out: Any, want: Any, moved: int, what: str) -> float:
        """Bytes moved per second by ``run``, whose output ``out`` must equal ``want``."""
        nan = float("nan")
        case = SimpleNamespace(run=run, restore=lambda: None, poison=lambda: out.fill_(nan),
                               wrong=lambda: int((out != want).sum()))  # fmt: skip
        r = timing.measure({"k": case}, timing.LocalComm(), how, torch.cuda.synchronize, clock)["k"]
        if r.status != "ok" or r.wrong:
            raise SystemExit(f"{what}: {r.error or f'{r.wrong} wrong elements'}")
        return moved / statistics.median(r.samples) / 1e9

    device = torch.cuda.get_device_name(0)
    rows: list[dict[str, Any]] = []

    def save() -> None:
        if args.json:
            record.write_gpu("gpu-kernels", "bench/gpu_kernels.py", argv or sys.argv[1:], args, how, device, rows,
                             args.json)  # fmt: skip

    print(f"# {device}; GB/s = bytes read + written per second / 1e9\n# {how.describe()}", flush=True)
    for dtype in (torch.float32, torch.bfloat16):
        for nbytes in sizes:
            for off in offsets:
                n = nbytes // torch.tensor([], dtype=dtype).element_size()
                xs, ys = (torch.randn(n + off, device="cuda").to(dtype) for _ in range(2))
                outs = torch.empty_like(xs)
                x, y, out = xs[off:], ys[off:], outs[off:]
                want = (x.float() + y.float()).to(dtype)
                moved = x.numel() * x.element_size()
                copy_bw = gbs(lambda: out.copy_(x), out, x, 2 * moved, "copy")
                for nb in blocks:
                    red_bw = gbs(lambda nb=nb: kernels.device_reduce([x, y], "SUM", nb, out=out), out,
                                 want, 3 * moved, f"device_reduce with {nb} blocks, offset {off}")  # fmt: skip
                    rows.append({"dtype": str(dtype).split(".")[-1], "bytes": nbytes, "offset": off,
                                 "copy_gbps": copy_bw, "blocks": nb, "reduce_gbps": red_bw,
                                 "ratio": red_bw / copy_bw})  # fmt: skip
                    print(f"# {rows[-1]['dtype']} {nbytes} B offset {off}: copy {copy_bw:.1f} GB/s, {nb} blocks "
                          f"{red_bw:.1f} GB/s ({red_bw / copy_bw:.2f})", flush=True)
                del xs, ys, outs, want
                torch.cuda.empty_cache()
                save()
    cols = [table.Column("dtype"), table.Column("bytes"), table.Column("offset"),
            table.Column("copy", "(GB/s)", "{:.1f}"),
            table.Column("blocks"), table.Column("reduce", "(GB/s)", "{:.1f}"),
            table.Column("ratio", fmt="{:.2f}")]  # fmt: skip
    print(table.text(cols, [list(r.values()) for r in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
