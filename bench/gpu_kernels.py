"""The GPU reduction kernel against the same GPU's device-to-device copy.

    python bench/gpu_kernels.py [--json FILE]

For each dtype (float32, bfloat16) and size, times smddp's reduction of two
sources into a third buffer (reads 2n, writes n elements) and torch's
device-to-device copy (reads n, writes n), both with CUDA events, median of
20 after warm-up, and reports each as bytes moved per second and the ratio.
The kernel is timed with several block counts (SMDDP_CUDA_REDUCE_BLOCKS):
the collectives use few blocks to leave the GPU to the computation.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import smddp


def _time(fn, iters: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None)
    p.add_argument("--sizes", default="64M,256M,1G", help="bytes per source buffer")
    p.add_argument("--blocks", default="16,32,64,132,264")
    args = p.parse_args()
    if not torch.cuda.is_available() or not smddp._C.with_cuda:
        print("no GPU, or smddp built without CUDA")
        return 1
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = [int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s) for s in args.sizes.split(",")]
    blocks = [int(b) for b in args.blocks.split(",")]
    rows = []
    print(f"# {torch.cuda.get_device_name(0)}; GB/s = bytes read + written per second / 1e9")
    print(f"# {'dtype':>9} {'bytes':>12} {'copy GB/s':>10} {'blocks':>7} {'reduce GB/s':>12} {'ratio':>6}")
    for dtype in (torch.float32, torch.bfloat16):
        for nbytes in sizes:
            n = nbytes // torch.tensor([], dtype=dtype).element_size()
            x = torch.randn(n, device="cuda").to(dtype)
            y = torch.randn(n, device="cuda").to(dtype)
            out = torch.empty_like(x)
            t_copy = _time(lambda: out.copy_(x))
            copy_bw = 2 * nbytes / t_copy / 1e9
            want = (x.float() + y.float()).to(dtype)
            for nb in blocks:
                got = smddp._C.device_reduce([x, y], "SUM", nb)
                torch.cuda.synchronize()
                assert torch.equal(got, want), "device reduction differs from torch"
                t_red = _time(lambda: smddp._C.device_reduce([x, y], "SUM", nb, out=out))
                red_bw = 3 * nbytes / t_red / 1e9
                rows.append({"dtype": str(dtype).split(".")[-1], "bytes": nbytes, "copy_gbps": copy_bw,
                             "blocks": nb, "reduce_gbps": red_bw, "ratio": red_bw / copy_bw})
                r = rows[-1]
                print(f"  {r['dtype']:>9} {nbytes:>12} {copy_bw:>10.1f} {nb:>7} {red_bw:>12.1f} {r['ratio']:>6.2f}")
            del x, y, out, want
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
