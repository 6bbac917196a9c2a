"""Huge pages for the large CPU buffers of collectives (SMDDP_HUGE_PAGES).

A rank reads the kernel's own account of a tensor's memory
(/proc/self/smaps, AnonHugePages of the mapping that holds it) before and
after collectives on it:

- auto (the default): a buffer written before the call and reused, as a
  benchmark's or DDP's buckets are, is backed by huge pages from its second
  call on, for AllGather and ReduceScatter (whose input is the whole of the
  ranks' blocks); the values are those of the collective;
- advise: an output not yet written gets huge pages when the collective
  writes it, and a buffer already written is not collapsed (khugepaged, the
  kernel's background collapser, may still get to a part of it);
- off: the memory is left as it is.

The kernel must help: THP not disabled, and for auto MADV_COLLAPSE and
PAGEMAP_SCAN (Linux 6.7); elsewhere the cases say why they skip.
"""

from __future__ import annotations

import ctypes
import os
import platform
import re

import pytest
import torch
import torch.distributed as dist
from dist_harness import assert_no_failures

MIB = 1 << 20
HUGE = 2 * MIB
ELEMS = 8 * MIB  # 32 MiB inputs, 64 MiB outputs on 2 ranks
# A buffer "has huge pages" when at least this share of it does: the kernel
# may fail to find a free huge page for a few blocks (fragmentation, memory
# limits), but a buffer missed entirely, or only one of the two halves of a
# ReduceScatter input, stays below it.
ENOUGH = 0.75
PROT_READ, PROT_WRITE = 1, 2
MAP_PRIVATE, MAP_ANONYMOUS = 0x02, 0x20
MADV_COLLAPSE = 25
# What a case reports when the kernel could not supply huge pages at all (a
# fragmented host): the test skips with it instead of failing.
NO_SUPPLY = "no supply: "


def _kernel_support() -> str | None:
    """Why this host cannot show huge pages, or None."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = f.read()
    except OSError:
        return "no transparent huge pages in this kernel"
    if "[never]" in thp:
        return "transparent huge pages are disabled ([never])"
    if "[always]" in thp:
        return "transparent huge pages are always on: every buffer has them already"
    m = re.match(r"(\d+)\.(\d+)", platform.release())
    if m is None or (int(m.group(1)), int(m.group(2))) < (6, 7):
        return f"kernel {platform.release()} lacks PAGEMAP_SCAN (6.7)"
    return None


class _Mappings:
    """Tensors in private anonymous mappings of their own, fenced by
    inaccessible pages so that the kernel cannot merge them with their
    neighbours: /proc/self/smaps then accounts for each buffer alone."""

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.mmap.restype = ctypes.c_void_p
        self.libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_long]
        self.libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.maps: list[tuple[int, int]] = []

    def tensor(self, elems: int) -> torch.Tensor:
        nbytes = elems * 4
        total = nbytes + 4 * HUGE
        base = self.libc.mmap(None, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        assert base not in (None, ctypes.c_void_p(-1).value), "mmap failed"
        self.maps.append((base, total))
        start = (base + 2 * HUGE - 1) // HUGE * HUGE  # a huge page of fence before it
        self.libc.mprotect(base, start - base, 0)
        self.libc.mprotect(start + nbytes, base + total - start - nbytes, 0)
        return torch.frombuffer((ctypes.c_char * nbytes).from_address(start), dtype=torch.float32)

    def kernel_supplies(self, nbytes: int) -> bool:
        """Whether the kernel can collapse a written buffer of ``nbytes`` into
        huge pages now (what auto asks of it), as a control."""
        t = self.tensor(nbytes // 4)
        t.fill_(1.0)
        self.libc.madvise(t.data_ptr(), nbytes, MADV_COLLAPSE)
        return _huge_bytes(t) >= ENOUGH * nbytes

    def close(self) -> None:
        for base, total in self.maps:
            self.libc.munmap(base, total)


def _smaps_field(lo_t: int, hi_t: int, field: str) -> list[list[str]]:
    """The values of `field` ("AnonHugePages:") of every mapping that
    overlaps [lo_t, hi_t), as /proc/self/smaps gives them, split."""
    inside = False
    values = []
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo < hi_t and lo_t < hi
            elif inside and head == field:
                values.append(line.split()[1:])
    return values


def _huge_bytes(t: torch.Tensor) -> int:
    """AnonHugePages of the mappings that hold `t` (the advice splits a
    mapping at the 2 MiB boundaries inside the buffer)."""
    lo_t, hi_t = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    return sum(int(v[0]) * 1024 for v in _smaps_field(lo_t, hi_t, "AnonHugePages:"))


def _advised(t: torch.Tensor) -> bool:
    """Whether every mapping inside the 2 MiB-aligned part of `t` carries
    MADV_HUGEPAGE ("hg" in its VmFlags)."""
    lo_t = (t.data_ptr() + HUGE - 1) // HUGE * HUGE
    hi_t = (t.data_ptr() + t.numel() * t.element_size()) // HUGE * HUGE
    flags = _smaps_field(lo_t, hi_t, "VmFlags:")
    return bool(flags) and all("hg" in f for f in flags)


def _thp_refusals() -> int:
    """Huge-page faults the kernel served with small pages, and huge pages it
    split, so far (system-wide, /proc/vmstat)."""
    total = 0
    with open("/proc/vmstat") as f:
        for line in f:
            key, value = line.split()
            if key in ("thp_fault_fallback", "thp_split_page", "thp_split_pmd"):
                total += int(value)
    return total


def case_huge_pages() -> list[str]:
    rank, world = dist.get_rank(), dist.get_world_size()
    bad: list[str] = []
    expected = torch.arange(world, dtype=torch.float32).repeat_interleave(ELEMS)
    groups = {}
    for mode in ("advise", "off"):
        os.environ["SMDDP_HUGE_PAGES"] = mode
        groups[mode] = dist.new_group(backend="smddp")
    del os.environ["SMDDP_HUGE_PAGES"]

    def gather(out: torch.Tensor, inp: torch.Tensor, group=None) -> None:
        dist.all_gather_into_tensor(out, inp, group=group)
        if not torch.equal(out, expected):
            bad.append(f"wrong all_gather result, group {group}")

    maps = _Mappings()

    def written(elems: int, value: float) -> torch.Tensor:
        t = maps.tensor(elems)
        t.fill_(value)
        return t

    def huge(t: torch.Tensor) -> bool:
        return _huge_bytes(t) >= ENOUGH * t.numel() * 4

    def short(what: str, t: torch.Tensor) -> None:
        said = f"{what} has {_huge_bytes(t)} of {t.numel() * 4} bytes in huge pages"
        # smddp's fault only where the kernel gives a control buffer of the same size huge pages.
        bad.append(said if maps.kernel_supplies(t.numel() * 4) else NO_SUPPLY + said)

    # auto: written buffers, reused.
    inp, out = written(ELEMS, float(rank)), written(world * ELEMS, 0.0)
    if _huge_bytes(inp) or _huge_bytes(out):
        bad.append("fresh buffers already have huge pages: the case shows nothing")
    # The first call only advises (khugepaged may then collapse some of the
    # advised pages in the background, so that is not checked here; the
    # native tests check what each call does).
    gather(out, inp)
    gather(out, inp)
    for name, t in (("input", inp), ("output", out)):
        if not huge(t):
            short(f"auto: the reused {name}", t)

    # auto, ReduceScatter: its input is the whole (world blocks), its output one block.
    rs_in, rs_out = written(world * ELEMS, 1.0), written(ELEMS, 0.0)
    for _ in range(2):
        dist.reduce_scatter_tensor(rs_out, rs_in)
        if not torch.equal(rs_out, torch.full((ELEMS,), float(world))):
            bad.append("wrong reduce_scatter result")
    for name, t in (("input", rs_in), ("output", rs_out)):
        if not huge(t):
            short(f"auto: the reduce_scatter {name}", t)

    # advise: an output not yet written is faulted in with huge pages; the
    # written input keeps its pages.
    inp, out = written(ELEMS, float(rank)), maps.tensor(world * ELEMS)
    refusals = _thp_refusals()
    gather(out, inp, groups["advise"])
    gather(out, inp, groups["advise"])
    if not _advised(out):
        bad.append("advise: the unwritten output was not advised (no hg in its VmFlags)")
    elif not huge(out) and _thp_refusals() == refusals:
        # Advised, and the kernel neither fell back to small pages nor split
        # huge ones meanwhile: the pages were never asked for as huge. (A
        # fragmented or reclaiming host may refuse them: that is its call.)
        bad.append(f"advise: the unwritten output has {_huge_bytes(out)} bytes in huge pages")
    if _huge_bytes(inp) == inp.numel() * 4:
        bad.append("advise: the written input was collapsed")

    # off: nothing changes.
    inp, out = written(ELEMS, float(rank)), maps.tensor(world * ELEMS)
    gather(out, inp, groups["off"])
    gather(out, inp, groups["off"])
    if _huge_bytes(inp) or _huge_bytes(out):
        bad.append("off: buffers got huge pages")
    del inp, out
    maps.close()
    for g in groups.values():
        dist.destroy_process_group(g)
    return bad


def test_huge_pages(pools) -> None:
    why = _kernel_support()
    if why:
        pytest.skip(why)
    results = pools(2).run(case_huge_pages, timeout=120)
    assert_no_failures([[f for f in fs if not f.startswith(NO_SUPPLY)] for fs in results])
    unsupplied = [
        f"rank {r}: {f[len(NO_SUPPLY):]}" for r, fs in enumerate(results) for f in fs if f.startswith(NO_SUPPLY)
    ]
    if unsupplied:
        pytest.skip("the kernel could not supply huge pages (a control of the same size had none either): "
                    + "; ".join(unsupplied))
