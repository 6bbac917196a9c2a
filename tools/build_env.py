"""Where the CUDA toolkit, its headers and NCCL are, found from what is installed.

Nothing here is a hard-coded path: the toolkit folder comes from the real
nvcc (the one on PATH may be a wrapper script), and the headers and libraries
torch's CUDA build needs but the toolkit may lack (cusparse.h, nccl.h,
libnccl.so.2) come from the NVIDIA Python packages torch was installed with.

Build knobs: SMDDP_WITH_CUDA (1, 0 or auto), SMDDP_CUDA_ARCHS (compute
capabilities, default 80,90), SMDDP_NVCC_FLAGS (more nvcc flags, e.g.
-lineinfo).
"""

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys


def want_cuda():
    """Whether to build the CUDA sources: SMDDP_WITH_CUDA=1/0, or auto."""
    flag = os.environ.get("SMDDP_WITH_CUDA", "").strip().lower()
    if flag in ("0", "false", "off", "no"):
        return False
    import torch

    available = torch.version.cuda is not None and find_nvcc() is not None
    if flag in ("1", "true", "on", "yes"):
        if not available:
            sys.exit(
                "SMDDP_WITH_CUDA=1 but torch has no CUDA (torch.version.cuda is None) "
                "or nvcc was not found on PATH or in CUDA_HOME"
            )
        return True
    if flag not in ("", "auto"):
        sys.exit(f"SMDDP_WITH_CUDA={flag!r} is not valid; use 1, 0 or unset it")
    return available


def find_nvcc():
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
        return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def cuda_home():
    """The toolkit folder of the nvcc that will really run.

    nvcc reports its own folder in its dry-run output (_HERE_, the bin
    folder), which is right even when the nvcc on PATH is a wrapper script
    elsewhere.
    """
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found")
    try:
        out = subprocess.run(
            [nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
        )
        text = out.stdout + out.stderr
        m = re.search(r"_HERE_=(\S+)", text)
        if m:
            return os.path.dirname(os.path.realpath(m.group(1).strip('"')))
    except (OSError, subprocess.SubprocessError):
        pass
    return os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))


def nvidia_package_dirs():
    """site-packages/nvidia/* folders of the installed NVIDIA wheels."""
    out = []
    for entry in sys.path:
        base = os.path.join(entry, "nvidia")
        if os.path.isdir(base):
            out.extend(sorted(glob.glob(os.path.join(base, "*"))))
    return out


def find_header(name, extra_dirs=()):
    for d in list(extra_dirs) + [os.path.join(p, "include") for p in nvidia_package_dirs()]:
        if os.path.exists(os.path.join(d, name)):
            return d
    return None


def find_library(pattern):
    for p in nvidia_package_dirs():
        hits = sorted(glob.glob(os.path.join(p, "lib", pattern)))
        if hits:
            return hits[0]
    return None


def cuda_build_settings():
    home = cuda_home()
    toolkit_include = os.path.join(home, "include")
    # The toolkit's own headers first: the NVIDIA packages' include folders
    # hold partial copies (no crt/) and are only for what the toolkit lacks.
    include_dirs = [toolkit_include]
    for header in ("cusparse.h", "nccl.h"):
        d = find_header(header, [toolkit_include])
        if d is None:
            raise RuntimeError(f"{header} not found in {toolkit_include} or the nvidia Python packages")
        if d != toolkit_include and d not in include_dirs:
            include_dirs.append(d)
    nccl = find_library("libnccl.so*")
    if nccl is None:
        raise RuntimeError("libnccl.so not found in the nvidia Python packages")
    nccl_dir = os.path.dirname(nccl)
    return {
        "cuda_home": home,
        "include_dirs": include_dirs,
        "library_dirs": [nccl_dir],
        # NCCL's wheel has no unversioned symlink.
        "link_args": [f"-l:{os.path.basename(nccl)}", f"-Wl,-rpath,{nccl_dir}"],
        # The arch flags and SMDDP_NVCC_FLAGS: setup.py passes this list to
        # nvcc after its own flags.
        "nvcc_arch_flags": arch_flags() + extra_nvcc_flags(),
    }


def arch_flags():
    """SASS for each of SMDDP_CUDA_ARCHS (default 80,90: A100 and H100/H200)
    and PTX of the newest, for GPUs after it."""
    text = os.environ.get("SMDDP_CUDA_ARCHS", "80,90")
    archs = [a.strip() for a in text.split(",") if a.strip()]
    if not archs or not all(a.isdigit() for a in archs):
        sys.exit(f"SMDDP_CUDA_ARCHS={text!r} is not valid; use compute capabilities like 80,90")
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    flags.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
    return flags


def extra_nvcc_flags():
    """SMDDP_NVCC_FLAGS, split like a shell would (e.g. "-lineinfo" so that
    compute-sanitizer and cuda-gdb report source lines): appended to nvcc's
    flags, after the defaults, so that it can also override them."""
    text = os.environ.get("SMDDP_NVCC_FLAGS", "")
    try:
        flags = shlex.split(text)
    except ValueError as e:
        sys.exit(f"SMDDP_NVCC_FLAGS={text!r} is not valid: {e}")
    return flags


if __name__ == "__main__":
    print("want_cuda:", want_cuda())
    if want_cuda():
        print(cuda_build_settings())
