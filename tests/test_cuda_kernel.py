"""The CUDA reduction kernel (device_reduce) against the CPU reduction
(smddp._C.reduce), bit for bit, in one process. Skipped without a GPU.

The kernel's contract (algorithm/cuda/device_reduce.h) is the CPU kernels'
semantics, so every result is compared as integers (the dtype's bits) with
the CPU reduction of the same inputs, except the payload of a NaN that
arithmetic produced (IEEE leaves it open: the GPU makes a canonical NaN, x86
another), which must only be a NaN on both: float32, float16 and bfloat16; SUM,
AVG, PRODUCT, MIN, MAX and PREMUL_SUM; raw and finalize on and off. The
cases cross sizes 0 to 2^20+3, 1 to 16 sources, element offsets 0-7 of the
sources and of the destination (slices of larger tensors, so that aligned and
unaligned paths both run), 1 to 4096 blocks, and results written in place
over a source; 17 sources must be refused. The whole cross product would take
long, so the main test samples it per dtype and op, and sweeps vary one axis
at a time.

Every case also checks that nothing outside the destination slice was
written (guard elements holding a NaN pattern around it) and that the sources
are unchanged. Source slices end where their allocation ends, so that under
compute-sanitizer with PYTORCH_NO_CUDA_MEMORY_CACHING=1 a read past them is
an error. SMDDP_KERNEL_TEST_QUICK=1 keeps every code path but only small
sizes (for the sanitizer's slowdown).

The device binding is smddp._C_cuda.device_reduce (loaded by
smddp._cuda.load()), or smddp._C.device_reduce in builds from before the CUDA
module was split off; a binding without raw/finalize arguments skips the
cases that need them.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

pytestmark = pytest.mark.gpu

QUICK = os.environ.get("SMDDP_KERNEL_TEST_QUICK", "") == "1"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
# A quiet NaN with a payload no computation makes: what guard elements hold.
GUARD = {torch.float32: 0x7FC0DEAD, torch.float16: 0x7E5A, torch.bfloat16: 0x7FDA}
OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM"]
MODES = {"raw-finalize": (True, True), "raw": (True, False), "finalize": (False, True), "partial": (False, False)}
MAX_SOURCES = 16
BIG = 70001 if QUICK else (1 << 20) + 3
SIZES = [0, 1, 2, 7, 8, 9, 15, 16, 17, 4099, BIG]
BLOCKS = [1, 3, 32, 132, 4096]
PREMUL = 0.1
DIVISOR = 3.0
TAIL_GUARD = 16
DEVICE = "cuda"


def _sync() -> None:
    torch.cuda.synchronize()


def _skip_without_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no GPU")


@functools.cache
def _binding():
    """(device_reduce, whether it takes raw/finalize), or (None, why not).

    smddp._cuda.load() gives the CUDA module; a build from before it was
    split off has device_reduce in smddp._C (used when the loader has none).
    """
    reason = "smddp was built without CUDA"
    fn = None
    try:
        from smddp import _cuda
    except ImportError:
        _cuda = None
    if _cuda is not None:
        try:
            fn = _cuda.load().device_reduce
        except ImportError as e:
            reason = f"smddp's CUDA module is not available: {e}"
    if fn is None:
        from smddp import _C

        if not (getattr(_C, "with_cuda", False) and hasattr(_C, "device_reduce")):
            return None, reason
        fn = _C.device_reduce
    return fn, "raw" in (fn.__doc__ or "")


def device_reduce(srcs, op, max_blocks=32, out=None, premul=1.0, divisor=1.0, raw=True, finalize=True):
    """The device binding of either layout, with one signature."""
    _skip_without_gpu()
    fn, modes = _binding()
    if fn is None:
        pytest.skip(modes)
    if modes:
        return fn(srcs, op, max_blocks=max_blocks, out=out, premul=premul, divisor=divisor, raw=raw,
                  finalize=finalize)
    if not (raw and finalize):
        pytest.skip("this build's device_reduce has no raw/finalize arguments")
    return fn(srcs, op, max_blocks, out, premul, divisor)


def cpu_reduce(srcs, op, premul, divisor, raw, finalize):
    from smddp import _C

    return _C.reduce(srcs, op, premul, divisor, raw, finalize)


def _values(n: int, dtype: torch.dtype, seed: int, op: str) -> torch.Tensor:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    if op == "PRODUCT":
        # Near 1, so that 16 factors stay in range; 0.5 to 1.5 still rounds.
        x = 0.5 + torch.rand(n, generator=g, device=DEVICE)
    else:
        x = torch.randn(n, generator=g, device=DEVICE) * 8
    return x.to(dtype)


def _guarded(n: int, dtype: torch.dtype, offset: int, tail: int) -> torch.Tensor:
    """A tensor of offset + n + tail elements, all of them the guard pattern."""
    t = torch.empty(offset + n + tail, dtype=dtype, device=DEVICE)
    t.view(BITS[dtype]).fill_(GUARD[dtype])
    return t


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(BITS[t.dtype]).cpu()


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal bits, or both NaN (a NaN's payload from arithmetic is open)."""
    both_nan = torch.isnan(got.float()) & torch.isnan(want.float())
    return torch.equal(_bits(got)[~both_nan], _bits(want)[~both_nan]) and torch.equal(
        torch.isnan(got.float()), torch.isnan(want.float()))


def _describe_mismatch(got: torch.Tensor, want: torch.Tensor, limit: int = 3) -> str:
    gb, wb = _bits(got), _bits(want)
    idx = (gb != wb).nonzero().flatten()
    mask = (1 << 32) - 1 if got.dtype == torch.float32 else (1 << 16) - 1
    parts = []
    for i in idx[:limit].tolist():
        parts.append(f"[{i}] got {got[i].item()!r} ({int(gb[i]) & mask:#x}) want {want[i].item()!r} "
                     f"({int(wb[i]) & mask:#x})")
    return f"{idx.numel()} of {got.numel()} elements differ: " + ", ".join(parts)


def run_case(dtype, op, n, nsrc, src_offsets, dst_offset=0, blocks=32, raw=True, finalize=True,
             in_place=None, seed=0, make=None) -> list[str]:
    """One device reduction against the CPU's; returns what was wrong.

    src_offsets: one element offset per source (each source is the tail of
    its own allocation); dst_offset: the destination's offset in a guarded
    tensor; in_place: the index of the source that is also the destination.
    make(n, dtype, seed) gives the values (default: random, by op).
    """
    what = (f"{str(dtype).split('.')[-1]} {op} raw={raw} finalize={finalize} n={n} sources={nsrc} "
            f"offsets={list(src_offsets)} dst_offset={dst_offset} blocks={blocks} in_place={in_place}")
    srcs = []
    for k in range(nsrc):
        off = src_offsets[k]
        parent = _guarded(n, dtype, off, 0)
        vals = make(n, dtype, seed * 131 + k) if make else _values(n, dtype, seed * 131 + k, op)
        parent[off:] = vals
        srcs.append(parent[off:off + n])
    inputs = [s.cpu() for s in srcs]
    want = cpu_reduce(inputs, op, PREMUL, DIVISOR, raw, finalize)
    if in_place is None:
        dparent = _guarded(n, dtype, dst_offset, TAIL_GUARD)
        out = dparent[dst_offset:dst_offset + n]
    else:
        dparent = None
        out = srcs[in_place]
    got = device_reduce(srcs, op, max_blocks=blocks, out=out, premul=PREMUL, divisor=DIVISOR, raw=raw,
                        finalize=finalize)
    _sync()
    bad = []
    if got.data_ptr() != out.data_ptr() and n > 0:
        bad.append(f"{what}: the result is not in out")
        return bad
    if not _same(out.cpu(), want):
        bad.append(f"{what}: {_describe_mismatch(out.cpu(), want)}")
    if dparent is not None:
        guard = _bits(_guarded(0, dtype, dst_offset, TAIL_GUARD))
        around = torch.cat([_bits(dparent[:dst_offset]), _bits(dparent[dst_offset + n:])])
        if not torch.equal(around, guard):
            bad.append(f"{what}: elements outside the destination were written")
    for k, (s, before) in enumerate(zip(srcs, inputs)):
        if k != in_place and not torch.equal(_bits(s), _bits(before)):
            bad.append(f"{what}: source {k} was changed")
    return bad


def _assert_none(bad: list[str], limit: int = 12) -> None:
    assert not bad, f"{len(bad)} cases failed:\n" + "\n".join(bad[:limit])


# 16-byte shifts keep the vector path; other offsets take the scalar one.
def _aligned_shift(dtype: torch.dtype) -> int:
    return 16 // torch.tensor([], dtype=dtype).element_size()


def _patterns(dtype: torch.dtype, i: int, nsrc: int) -> list[tuple[list[int], int]]:
    """(source offsets, destination offset): aligned, shifted by 16 bytes,
    mixed per source, and only the destination unaligned."""
    a = _aligned_shift(dtype) % 8
    return [
        ([0] * nsrc, 0),
        ([a] * nsrc, a),
        ([(i + k) % 8 for k in range(nsrc)], (3 * i + 1) % 8),
        ([0] * nsrc, 1),
    ]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dname", list(DTYPES))
def test_reduce_matches_cpu(dname, op, mode):
    _skip_without_gpu()
    dtype = DTYPES[dname]
    raw, finalize = MODES[mode]
    source_counts = [1, 2, 3, 5, MAX_SOURCES]
    bad = []
    case = 0
    for i, n in enumerate(SIZES):
        patterns = _patterns(dtype, i, MAX_SOURCES)
        if n == BIG:
            patterns = [patterns[0], patterns[2]]
        for j, (offs, doff) in enumerate(patterns):
            nsrc = source_counts[(i + j) % len(source_counts)]
            blocks = BLOCKS[case % len(BLOCKS)]
            bad += run_case(dtype, op, n, nsrc, offs[:nsrc], doff, blocks, raw, finalize, seed=case)
            case += 1
    _assert_none(bad)


@pytest.mark.parametrize("dname", list(DTYPES))
def test_every_source_count(dname):
    _skip_without_gpu()
    dtype = DTYPES[dname]
    bad = []
    for nsrc in range(1, MAX_SOURCES + 1):
        for j, op in enumerate(OPS):
            mixed = [(nsrc + k + j) % 8 for k in range(nsrc)]
            for offs, doff in (([0] * nsrc, 0), (mixed, (nsrc + j) % 8)):
                bad += run_case(dtype, op, 4099, nsrc, offs, doff, blocks=32, seed=nsrc * 10 + j)
    _assert_none(bad)


@pytest.mark.parametrize("dname", list(DTYPES))
def test_every_block_count(dname):
    _skip_without_gpu()
    dtype = DTYPES[dname]
    blocks = [1, 2, 3, 4, 7, 8, 31, 32, 33, 64, 100, 132, 264, 1000, 1024, 2048, 4096]
    bad = []
    for b in blocks:
        for n in (4099, BIG):
            for op in ("SUM", "MAX"):
                for offs, doff in (([0, 0, 0], 0), ([1, 2, 3], 5)):
                    bad += run_case(dtype, op, n, 3, offs, doff, blocks=b, seed=b)
    _assert_none(bad)


@pytest.mark.parametrize("dname", list(DTYPES))
def test_every_offset(dname):
    _skip_without_gpu()
    dtype = DTYPES[dname]
    bad = []
    for s in range(8):
        for d in range(8):
            for n in (17, 4099):
                bad += run_case(dtype, "SUM", n, 3, [s, s, s], d, blocks=4, seed=s * 8 + d)
                bad += run_case(dtype, "MIN", n, 3, [s, (s + d) % 8, d], d, blocks=32, seed=s * 8 + d)
    _assert_none(bad)


@pytest.mark.parametrize("dname", list(DTYPES))
def test_every_small_size(dname):
    _skip_without_gpu()
    dtype = DTYPES[dname]
    # Around the vector width, the unrolled block and one block's whole step.
    sizes = list(range(0, 67)) + [511, 512, 513, 2047, 2048, 2049, 8191, 8192, 8193, 16385]
    if not QUICK:
        sizes += [(1 << 20) - 1, 1 << 20, (1 << 20) + 1]
    bad = []
    for n in sizes:
        for offs, doff in (([0, 0], 0), ([1, 0], 3)):
            bad += run_case(dtype, "AVG", n, 2, offs, doff, blocks=2, seed=n)
    _assert_none(bad)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dname", list(DTYPES))
def test_in_place(dname, op):
    _skip_without_gpu()
    dtype = DTYPES[dname]
    bad = []
    for n in (1, 17, 4099, BIG):
        for nsrc in (1, 3, MAX_SOURCES):
            for where in sorted({0, nsrc // 2, nsrc - 1}):
                for offs in ([0] * nsrc, [(k * 3 + n) % 8 for k in range(nsrc)]):
                    bad += run_case(dtype, op, n, nsrc, offs, blocks=32, in_place=where, seed=n + nsrc + where)
    _assert_none(bad)


def _specials(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Signed zeros, infinities, subnormals, the largest finite values (their
    sum overflows), values whose product underflows; no NaN."""
    tiny = {torch.float32: 1e-40, torch.float16: 6e-8, torch.bfloat16: 1e-40}[dtype]
    big = {torch.float32: 3e38, torch.float16: 6e4, torch.bfloat16: 3e38}[dtype]
    table = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), tiny, -tiny, big, -big, 1.0, -1.0, 1e-3, 7.0],
                         device=DEVICE)
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    pick = torch.randint(0, len(table), (n,), generator=g, device=DEVICE)
    plain = torch.randn(n, generator=g, device=DEVICE)
    use = torch.rand(n, generator=g, device=DEVICE) < 0.5
    return torch.where(use, table[pick], plain).to(dtype)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dname", list(DTYPES))
def test_special_values(dname, op):
    _skip_without_gpu()
    dtype = DTYPES[dname]
    bad = []
    for n in (7, 4099):
        for nsrc in (2, 5, MAX_SOURCES):
            for offs in ([0] * nsrc, [(k + 1) % 8 for k in range(nsrc)]):
                bad += run_case(dtype, op, n, nsrc, offs, blocks=32, seed=n + nsrc, make=_specials)
    _assert_none(bad)


# NaNs of several payloads and both signs, as raw bits.
NANS = {
    torch.float32: [0x7FC00000, 0x7FC00001, 0x7FD23456, 0xFFC00000],
    torch.float16: [0x7E00, 0x7E01, 0x7F12, 0xFE00],
    torch.bfloat16: [0x7FC0, 0x7FC1, 0x7FD2, 0xFFC0],
}


def _with_nans(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = (torch.randn(n, generator=g, device=DEVICE) * 4).to(dtype)
    width = 32 if dtype == torch.float32 else 16
    nans = torch.tensor([b - (1 << width) if b >= 1 << (width - 1) else b for b in NANS[dtype]],
                        dtype=BITS[dtype], device=DEVICE).view(dtype)
    pick = torch.randint(0, len(nans), (n,), generator=g, device=DEVICE)
    where = torch.rand(n, generator=g, device=DEVICE) < 0.2
    return torch.where(where, nans[pick], x)


def _nan_cases(dtype):
    for op in OPS:
        for nsrc in (2, 5):
            for offs in ([0] * nsrc, [(k + 3) % 8 for k in range(nsrc)]):
                yield op, 4099, nsrc, offs


@pytest.mark.parametrize("dname", list(DTYPES))
def test_nan_positions(dname):
    """NaN where the CPU has NaN, and every other element's bits equal."""
    _skip_without_gpu()
    dtype = DTYPES[dname]
    bad = []
    for op, n, nsrc, offs in _nan_cases(dtype):
        srcs = [_with_nans(n, dtype, 7 * k + nsrc) for k in range(nsrc)]
        dev = []
        for s, off in zip(srcs, offs):
            parent = _guarded(n, dtype, off, 0)
            parent[off:] = s
            dev.append(parent[off:])
        want = cpu_reduce([s.cpu() for s in srcs], op, PREMUL, DIVISOR, True, True)
        got = device_reduce(dev, op, max_blocks=32, premul=PREMUL, divisor=DIVISOR).cpu()
        nan_w, nan_g = torch.isnan(want.float()), torch.isnan(got.float())
        what = f"{dname} {op} sources={nsrc} offsets={offs}"
        if not torch.equal(nan_w, nan_g):
            bad.append(f"{what}: NaN at {int((nan_w != nan_g).sum())} other positions")
        elif not torch.equal(_bits(got)[~nan_w], _bits(want)[~nan_w]):
            bad.append(f"{what}: non-NaN elements differ: {_describe_mismatch(got[~nan_w], want[~nan_w])}")
    _assert_none(bad)


@pytest.mark.parametrize("dname", list(DTYPES))
def test_nan_payloads(dname):
    """MIN and MAX select one of their operands: the NaN they return keeps its
    bits (sign and payload), as on the CPU. (Arithmetic makes NaNs whose
    payload IEEE leaves open; test_nan_positions covers those.)"""
    _skip_without_gpu()
    dtype = DTYPES[dname]
    bad = []
    for op, n, nsrc, offs in _nan_cases(dtype):
        if offs[0] != 0 or op not in ("MIN", "MAX"):
            continue  # the positions test covers the unaligned path
        srcs = [_with_nans(n, dtype, 7 * k + nsrc) for k in range(nsrc)]
        want = cpu_reduce([s.cpu() for s in srcs], op, PREMUL, DIVISOR, True, True)
        got = device_reduce(srcs, op, max_blocks=32, premul=PREMUL, divisor=DIVISOR).cpu()
        if not torch.equal(_bits(got), _bits(want)):
            bad.append(f"{dname} {op} sources={nsrc}: {_describe_mismatch(got, want)}")
    _assert_none(bad)


@pytest.mark.parametrize("n", [1, 4099, BIG])
def test_seventeen_sources_are_refused(n):
    _skip_without_gpu()
    srcs = [torch.ones(n, device=DEVICE) for _ in range(MAX_SOURCES + 1)]
    out = torch.full((n,), -1.0, device=DEVICE)
    with pytest.raises((RuntimeError, ValueError)):
        device_reduce(srcs, "SUM", max_blocks=32, out=out)
        _sync()
    assert torch.all(out == -1.0), "a refused call wrote its output"


# Last in the file: on a binding that does not check out, these write where
# they should not (within the allocator's rounding, so no fault).
def test_bad_out_is_refused():
    _skip_without_gpu()
    n = 4099
    srcs = [torch.ones(n, device=DEVICE) for _ in range(2)]
    half = [torch.ones(n, device=DEVICE, dtype=torch.float16) for _ in range(2)]
    cases = {
        "one element short": (srcs, torch.empty(n - 1, device=DEVICE)),
        "another dtype of the same size": (half, torch.empty(n, device=DEVICE, dtype=torch.bfloat16)),
        "not contiguous": (srcs, torch.empty(2 * n, device=DEVICE)[::2]),
    }
    accepted = []
    for what, (inputs, out) in cases.items():
        try:
            device_reduce(inputs, "SUM", max_blocks=32, out=out)
            _sync()
            accepted.append(what)
        except (RuntimeError, ValueError):
            pass
    assert not accepted, f"device_reduce accepted an output that is {', '.join(accepted)}"
