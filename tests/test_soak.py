"""A short soak: a random mix of collectives (ops, sizes, dtypes, async
interleavings, sub-groups) on an emulated 2x2, every result checked. The
long run is bench/soak.py."""

import pytest

from smddp._soak import run_soak


def case_soak(ops: int, seed: int):
    r = run_soak(ops, seed)
    return r.ops, r.mismatches, r.first_mismatch


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_short_soak_on_emulated_nodes(pools):
    pool = pools(4, SMDDP_RANKS_PER_NODE="2")
    for ops, mismatches, first in pool.run(case_soak, 300, 1, timeout=280):
        assert mismatches == 0, first
