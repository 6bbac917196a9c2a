"""The CUDA path lives in its own extension module, smddp._C_cuda: CPU users
never load it, it is loaded the first time a CUDA tensor needs it, and a
module that cannot be loaded is one warning naming why (CUDA tensors then
take the fallback backend), never a failed ``import smddp``.

These run on any machine: the module imports without a GPU.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILT = bool(glob.glob(os.path.join(ROOT, "smddp", "_C_cuda*.so")))


def _run(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("SMDDP_")}
    e.update(env or {})
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, env=e, cwd=ROOT
    )


@pytest.mark.timeout(150)
def test_cpu_users_never_load_the_cuda_module(tmp_path) -> None:
    r = _run(
        f"""
        import datetime, sys
        import torch, torch.distributed as dist
        import smddp
        assert "smddp._C_cuda" not in sys.modules, "import smddp loaded the CUDA module"
        dist.init_process_group("smddp", init_method="file://{tmp_path}/init", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=30))
        t = torch.ones(8)
        dist.all_reduce(t)
        dist.all_gather_into_tensor(torch.empty(8), t)
        dist.barrier()
        dist.destroy_process_group()
        print("LOADED", [m for m in sys.modules if m.startswith("smddp._C_cuda")])
        """
    )
    assert r.returncode == 0, r.stderr
    assert "LOADED []" in r.stdout, r.stdout + r.stderr


@pytest.mark.timeout(60)
def test_the_cpu_module_needs_no_cuda_library() -> None:
    import shutil

    if shutil.which("readelf") is None:
        pytest.skip("readelf is not installed")
    (core,) = glob.glob(os.path.join(ROOT, "smddp", "_C.cpython*.so"))
    dynamic = subprocess.run(["readelf", "-d", core], capture_output=True, text=True, check=True).stdout
    needed = [line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
    cuda = [n for n in needed if any(k in n for k in ("cuda", "nccl", "cudart"))]
    assert needed and not cuda, f"smddp._C needs {cuda}"


@pytest.mark.timeout(150)
@pytest.mark.skipif(not BUILT, reason="smddp was built without its CUDA module")
def test_the_cuda_module_loads_on_demand_and_registers_the_device_path() -> None:
    r = _run(
        """
        import sys
        import smddp
        print("STATUS", repr(smddp._C.device_path_status()))
        print("LOADED", "smddp._C_cuda" in sys.modules)
        m = smddp._cuda.load()
        print("MAX", m.max_sources)
        """
    )
    assert r.returncode == 0, r.stderr
    assert "STATUS ''" in r.stdout and "LOADED True" in r.stdout and "MAX 16" in r.stdout, r.stdout + r.stderr


@pytest.mark.timeout(150)
def test_a_cuda_module_that_does_not_load_is_one_warning() -> None:
    r = _run(
        """
        import smddp
        smddp._cuda.MODULE = "smddp._no_such_cuda_module"
        first = smddp._C.device_path_status()
        second = smddp._C.device_path_status()
        print("FIRST", first)
        print("SAME", first == second)
        print("STATUS", smddp._cuda.status())
        """
    )
    assert r.returncode == 0, r.stderr
    assert "FIRST importing smddp._no_such_cuda_module failed: ModuleNotFoundError" in r.stdout, r.stdout
    assert "SAME True" in r.stdout
    assert "'available': False" in r.stdout
    # Told once on stderr, naming the reason and what CUDA tensors do instead.
    warnings = [line for line in r.stderr.splitlines() if "the CUDA path is unavailable" in line]
    assert len(warnings) == 1, r.stderr
    assert "no_such_cuda_module" in warnings[0] and "fallback backend" in warnings[0], warnings[0]


@pytest.mark.timeout(60)
@pytest.mark.skipif(not BUILT, reason="smddp was built without its CUDA module")
def test_device_reduce_checks_its_arguments() -> None:
    import torch

    import smddp

    m = smddp._cuda.load()
    with pytest.raises(ValueError, match="1 to 16 tensors"):
        m.device_reduce([], "SUM")
    with pytest.raises(ValueError, match="1 to 16 tensors"):
        m.device_reduce([torch.ones(4)] * 17, "SUM")
    with pytest.raises(ValueError, match="contiguous CUDA tensors"):
        m.device_reduce([torch.ones(4)], "SUM")


@pytest.mark.timeout(60)
def test_nccl_is_found_in_nccl_home_first(tmp_path, monkeypatch) -> None:
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import build_env
    finally:
        sys.path.pop(0)
    home = tmp_path / "nccl"
    (home / "include").mkdir(parents=True)
    (home / "include" / "nccl.h").write_text("/* nccl */\n")
    (home / "lib").mkdir()
    (home / "lib" / "libnccl.so.2").write_text("")
    monkeypatch.setenv("NCCL_HOME", str(home))
    assert build_env.find_nccl("/nonexistent") == (str(home / "include"), str(home / "lib" / "libnccl.so.2"))
    # A NCCL_HOME without NCCL is an error naming it, not a silent fallback.
    monkeypatch.setenv("NCCL_HOME", str(tmp_path / "empty"))
    with pytest.raises(RuntimeError, match="NCCL_HOME="):
        build_env.find_nccl("/nonexistent")
    # Without NCCL_HOME: the NCCL torch was installed with, if any.
    monkeypatch.delenv("NCCL_HOME")
    found = build_env.find_nccl("/nonexistent")
    if found is not None:
        inc, lib = found
        assert os.path.exists(os.path.join(inc, "nccl.h")) and os.path.basename(lib).startswith("libnccl.so")
