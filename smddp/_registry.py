"""Registration of the "smddp" backend with torch.distributed."""

from __future__ import annotations

import datetime
import os
import threading
from typing import Any

import torch
import torch.distributed as dist

from smddp import _C, _cuda
from smddp import config as _config

BACKEND_NAME = "smddp"
ProcessGroupSMDDP = _C.ProcessGroupSMDDP

_lock = threading.Lock()
_registered = False


# gloo connects every pair of a group's ranks when the group is created: a
# socket and a store round trip per peer, on every rank, for every group (at
# a thousand ranks, past the usual limit of open files), for a fallback that
# serves few calls and often none. With torch's lazy pairs a pair connects on
# its first message. torch reads the switch from the environment whenever a
# gloo group is created, so it is set around the fallback's creation only (a
# user's own gloo groups keep their behaviour), and a user's own setting of
# it is left to decide.
_GLOO_LAZY = "TORCH_GLOO_LAZY_INIT"
_env_lock = threading.Lock()


def _fallback_gloo(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> Any:
    with _env_lock:
        if _GLOO_LAZY in os.environ:
            return dist.ProcessGroupGloo(store, rank, size, timeout)
        os.environ[_GLOO_LAZY] = "1"
        try:
            return dist.ProcessGroupGloo(store, rank, size, timeout)
        finally:
            del os.environ[_GLOO_LAZY]


def _make_fallbacks(
    store: dist.Store, rank: int, size: int, timeout: datetime.timedelta, mode: str
) -> list[tuple[str, Any]]:
    """The backends that serve what smddp does not implement natively.

    Called by the native layer whenever a group is created (also by split),
    with a store prefixed for the fallbacks.
    """
    gloo = _fallback_gloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
    out: list[tuple[str, Any]] = [("cpu", gloo)]
    # nccl needs a GPU per rank: ranks that share GPUs fall back to gloo.
    shared_gpus = int(_config.current()["SMDDP_CUDA_RANKS_PER_GPU"]) > 1
    if mode == "gloo" or shared_gpus:
        out.append(("cuda", gloo))
    elif torch.cuda.is_available() and dist.is_nccl_available():
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        nccl = dist.ProcessGroupNCCL(dist.PrefixStore("nccl/", store), rank, size, opts)
        out.append(("cuda", nccl))
    return out


def _create_backend(opts: Any, backend_options: Any = None) -> ProcessGroupSMDDP:
    """Creator called by torch.distributed for every group using smddp."""
    return ProcessGroupSMDDP(
        opts.store,
        opts.group_rank,
        opts.group_size,
        opts.timeout,
        [int(r) for r in opts.global_ranks_in_group],
        str(opts.group_id),
    )


def register() -> None:
    """Registers the "smddp" backend (idempotent).

    Called on ``import smddp``, and by torch >= 2.14 through the
    ``torch.distributed.backends`` entry point.
    """
    global _registered
    with _lock:
        if _registered:
            return
        _config.apply_log_level()
        _C.set_fallback_factory(_make_fallbacks)
        # The CUDA module is imported when a CUDA tensor first needs it.
        _C.set_device_path_loader(_cuda._loader)
        dist.Backend.register_backend(
            BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"]
        )
        _registered = True


def is_registered() -> bool:
    """Whether ``backend="smddp"`` is available in this process."""
    return _registered
