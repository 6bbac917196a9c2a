"""Shared fixtures: rank pools, created once per (world size, settings) for the
whole session and reused by every test that asks for the same kind."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dist_harness import RankPool  # noqa: E402

_pools: dict[tuple, RankPool] = {}


def get_pool(world: int, backend: str = "smddp", **env: str) -> RankPool:
    """A live pool of ``world`` ranks with the given SMDDP_* settings."""
    key = (world, backend, tuple(sorted(env.items())))
    pool = _pools.get(key)
    if pool is None or not pool.alive:
        pool = RankPool(world, env=env, backend=backend)
        _pools[key] = pool
    return pool


@pytest.fixture(scope="session")
def pools():
    yield get_pool
    # Every pool is told to leave first, then waited for: they exit together.
    for pool in _pools.values():
        pool.begin_close()
    for pool in _pools.values():
        pool.finish_close()
    _pools.clear()


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running test (deselect with -m 'not slow')")
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:
        has_gpu = False
    if not has_gpu:
        skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
