"""Loaded by every Python process that tools/gpu_check.py starts (this folder
is put first on their PYTHONPATH), including ranks started with spawn, which
inherit the environment.

When SMDDP_STACKS_ON_SIGUSR1=1, SIGUSR1 makes the process print the Python
stacks of all its threads to its stderr (faulthandler: it works even while a
thread is blocked in native code holding the GIL), and the process goes on.
gpu_check.py sends SIGUSR1 to a step's whole process tree before it kills a
step that outlived its cap, so that the log says where each process was.

A sitecustomize found later on sys.path (a distribution's own) is still run:
this one only stands in front of it.
"""

import os
import sys


def _install():
    if os.environ.get("SMDDP_STACKS_ON_SIGUSR1") != "1":
        return
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        folder = os.path.abspath(entry or os.getcwd())
        if folder == here:
            continue
        path = os.path.join(folder, "sitecustomize.py")
        if os.path.isfile(path):
            with open(path, "rb") as f:
                code = compile(f.read(), path, "exec")
            exec(code, {"__name__": "sitecustomize", "__file__": path})
            return


try:
    _install()
except Exception as e:  # never stop the interpreter from starting
    print(f"gpu_check sitecustomize: no stack dumps on SIGUSR1: {e}", file=sys.stderr)
try:
    _chain()
except Exception as e:
    print(f"gpu_check sitecustomize: the next sitecustomize failed: {e}", file=sys.stderr)
