"""A short soak: a random mix of collectives (ops, sizes, dtypes, async
interleavings, sub-groups) on an emulated 2x2, every result checked with
smddp.bench.ops's oracle. The long run is bench/soak.py."""

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # the ranks import this module, and with it bench.soak
    sys.path.insert(0, REPO)

from bench.soak import run_soak  # noqa: E402


def case_soak(ops: int, seed: int):
    r = run_soak(ops, seed)
    return r.ops, r.mismatches, r.first_mismatch


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_short_soak_on_emulated_nodes(pools):
    pool = pools(4, SMDDP_RANKS_PER_NODE="2")
    for ops, mismatches, first in pool.run(case_soak, 300, 1, timeout=280):
        assert ops == 300 and mismatches == 0, first


@pytest.mark.timeout(120)
def test_the_soak_catches_a_wrong_result(pools):
    """The soak's check is live: outputs corrupted after the call are counted."""
    pool = pools(2)
    results = pool.run(case_corrupted_soak, 40, 3, timeout=100)
    assert all(mismatches > 0 for _, mismatches, _ in results)


def case_corrupted_soak(ops: int, seed: int):
    from smddp.bench import sweep

    wrong = sweep.Buffers.wrong

    def corrupted(self):  # what a backend that writes garbage leaves
        self.out.fill_(3)
        return wrong(self)

    sweep.Buffers.wrong = corrupted
    try:
        return case_soak(ops, seed)
    finally:
        sweep.Buffers.wrong = wrong
