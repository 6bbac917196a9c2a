"""The CUDA half of smddp, the extension module ``smddp._C_cuda``.

It is imported the first time a CUDA tensor reaches one of smddp's native
collectives (the backend asks through the loader registered at import), never
by ``import smddp`` itself: CPU users never load a CUDA library. When it
cannot be imported (smddp was built without CUDA, or its CUDA or NCCL do not
match the machine's), CUDA tensors take the fallback backend (nccl) for every
collective and one warning says why.

    smddp._cuda.status()   # {"available": bool, "reason": str}
    smddp._cuda.load()     # the module, or ImportError with the reason
"""

from __future__ import annotations

import glob
import importlib
import os
import threading
from types import ModuleType

MODULE = "smddp._C_cuda"

_lock = threading.Lock()
_module: ModuleType | None = None
_error: str | None = None


def _built() -> bool:
    here = os.path.dirname(os.path.abspath(__file__))
    return bool(glob.glob(os.path.join(here, "_C_cuda*.so")))


def load() -> ModuleType:
    """Imports the CUDA module once; raises ImportError naming why it cannot."""
    global _module, _error
    with _lock:
        if _module is None and _error is None:
            if MODULE == "smddp._C_cuda" and not _built():
                _error = (
                    "smddp was built without its CUDA module (torch without CUDA, or no nvcc, when it "
                    "was built; SMDDP_WITH_CUDA=1 makes the build insist)"
                )
            else:
                try:
                    _module = importlib.import_module(MODULE)
                except Exception as e:  # noqa: BLE001 - any failure is the reason to report
                    _error = f"importing {MODULE} failed: {type(e).__name__}: {e}"
        if _module is None:
            raise ImportError(_error)
        return _module


def status() -> dict:
    """Whether the CUDA path is available in this process, and why not."""
    try:
        load()
        return {"available": True, "reason": ""}
    except ImportError as e:
        return {"available": False, "reason": str(e)}


def _loader() -> str:
    """Called by the native layer: "" once the module is loaded, else why not."""
    try:
        load()
        return ""
    except ImportError as e:
        return str(e)
