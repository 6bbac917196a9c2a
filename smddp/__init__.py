"""smddp: hierarchical AllGather, ReduceScatter and AllReduce for PyTorch.

    import smddp
    import torch.distributed as dist
    dist.init_process_group(backend="smddp")

Importing smddp registers the "smddp" backend for CPU and CUDA tensors. With
torch >= 2.14 the package also declares a ``torch.distributed.backends``
entry point, so ``backend="smddp"`` works without the import.
"""

from __future__ import annotations

from smddp import config
from smddp._registry import BACKEND_NAME, ProcessGroupSMDDP, is_registered, register

__all__ = [
    "BACKEND_NAME",
    "ProcessGroupSMDDP",
    "config",
    "is_registered",
    "register",
]

__version__ = "0.1.0"

register()
