"""Where the CUDA toolkit, its headers and NCCL are, found from what is installed.

The toolkit folder comes from the real nvcc (the one on PATH may be a wrapper
script). NCCL comes from NCCL_HOME, the toolkit, the system, or the NVIDIA
Python packages torch was installed with (find_nccl); headers torch's CUDA
build needs but the toolkit may lack (cusparse.h) from those packages.

Build knobs: SMDDP_WITH_CUDA (1, 0 or auto), SMDDP_CUDA_ARCHS (compute
capabilities, default 80,90), SMDDP_NVCC_FLAGS (more nvcc flags, e.g.
-lineinfo), NCCL_HOME.
"""

import glob
import os
import re
import shlex
import shutil
import struct
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


def find_nccl(cuda_home_dir):
    """(include folder, library file) of NCCL, or None.

    In order: NCCL_HOME (a source build or a tarball: include/, lib/); the
    NVIDIA Python packages torch was installed with (the NCCL torch itself
    loads, so that one library serves both); the CUDA toolkit; the system's
    folders (libnccl-dev and the like). Header and library always come from
    the same place.
    """

    def under(root):
        inc = os.path.join(root, "include")
        if not os.path.exists(os.path.join(inc, "nccl.h")):
            return None
        for libdir in ("lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "targets/x86_64-linux/lib"):
            hits = sorted(glob.glob(os.path.join(root, libdir, "libnccl.so*")))
            if hits:
                return inc, hits[0]
        return None

    if os.environ.get("NCCL_HOME"):
        found = under(os.environ["NCCL_HOME"])
        if found is None:
            raise RuntimeError(
                f"NCCL_HOME={os.environ['NCCL_HOME']} has no include/nccl.h with a lib/libnccl.so* beside it"
            )
        return found
    for root in nvidia_package_dirs() + [cuda_home_dir, "/usr", "/usr/local"]:
        found = under(root)
        if found is not None:
            return found
    return None


def cuda_build_settings():
    home = cuda_home()
    toolkit_include = os.path.join(home, "include")
    # The toolkit's own headers first: the NVIDIA packages' include folders
    # hold partial copies (no crt/) and are only for what the toolkit lacks.
    include_dirs = [toolkit_include]
    d = find_header("cusparse.h", [toolkit_include])
    if d is None:
        raise RuntimeError(f"cusparse.h not found in {toolkit_include} or the nvidia Python packages")
    if d not in include_dirs:
        include_dirs.append(d)
    nccl = find_nccl(home)
    if nccl is None:
        raise RuntimeError(
            "NCCL not found: set NCCL_HOME to a folder with include/nccl.h and lib/libnccl.so, install "
            "the system's NCCL development package, or the nvidia-nccl Python package"
        )
    nccl_include, nccl_lib = nccl
    if nccl_include not in include_dirs:
        include_dirs.append(nccl_include)
    nccl_dir = os.path.dirname(nccl_lib)
    return {
        "cuda_home": home,
        "include_dirs": include_dirs,
        "library_dirs": [nccl_dir],
        # The wheel's library has no unversioned symlink: link the file.
        "link_args": [f"-l:{os.path.basename(nccl_lib)}", f"-Wl,-rpath,{nccl_dir}"],
        "nvcc_arch_flags": arch_flags(),
        "nvcc_extra_flags": extra_nvcc_flags(),
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


# torch uses the shared libstdc++, so a process holds one copy of it; an
# extension carrying a static copy of its own keeps separate locale and stream
# state and crashes at its first string stream, or when an exception or a
# std::string crosses into torch. A compiler may link one without being asked:
# by -static-libstdc++, or by searching first a folder of its own that holds
# only libstdc++.a (which -lstdc++ then finds, even with -Bdynamic). Naming
# the shared library's file, before the compiler's own -lstdc++, makes the
# linker take every libstdc++ symbol from it.
def shared_libstdcxx_link_args():
    """Linker arguments that link the shared libstdc++ this process (which
    has imported torch) has loaded, else the one the linker finds by its
    versioned name."""
    lib = "-l:libstdc++.so.6"
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if os.path.basename(path).startswith("libstdc++.so") and os.path.exists(path):
                    lib = path
                    break
    except OSError:
        pass
    return [f"-Wl,--push-state,--no-as-needed,{lib},--pop-state"]


def needed_libraries(path):
    """The DT_NEEDED entries of an ELF shared object (64-bit little-endian,
    as x86-64 and aarch64 build), or None for any other file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    needed = []
    for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != 6:  # SHT_DYNAMIC
            continue
        strtab_offset = sections[link][4]
        for at in range(offset, offset + size, entsize or 16):
            tag, value = struct.unpack_from("<qQ", data, at)
            if tag == 0:  # DT_NULL
                break
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", strtab_offset + value)
                needed.append(data[strtab_offset + value:end].decode())
    return needed


def check_shared_libstdcxx(path, compiler):
    """Raises RuntimeError if the extension at `path` does not load the
    shared libstdc++ (see shared_libstdcxx_link_args)."""
    needed = needed_libraries(path)
    if needed is None or any(n.startswith("libstdc++.so") for n in needed):
        return
    raise RuntimeError(
        f"{os.path.basename(path)} was linked without the shared libstdc++ (it needs only {', '.join(needed)}): "
        f"the compiler {compiler} put a static copy of the C++ runtime into it, which crashes beside torch's. "
        "Build with a compiler that links libstdc++ dynamically, e.g. CXX=/usr/bin/g++ CC=/usr/bin/gcc"
    )


if __name__ == "__main__":
    print("want_cuda:", want_cuda())
    if want_cuda():
        print(cuda_build_settings())
