"""Builds smddp: the Python package and its native extensions, smddp._C (the
CPU core and the backend) and smddp._C_cuda (the CUDA path, loaded only when a
CUDA tensor first needs it).

CPU sources are always built. CUDA sources (csrc/**/cuda/) are built when
torch has CUDA and nvcc is found; SMDDP_WITH_CUDA=1 insists on them (and fails
if they cannot be built), SMDDP_WITH_CUDA=0 leaves them out.
SMDDP_CUDA_ARCHS picks the GPU architectures (default 80,90) and
SMDDP_NVCC_FLAGS adds nvcc flags (e.g. -lineinfo). The objects carry line
tables only; SMDDP_DEBUG_INFO=full builds them with full debug information.

    pip install --no-build-isolation .        # or -e .
"""

import glob
import os
import sys

from setuptools import find_packages, setup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools"))

import build_env  # noqa: E402  (tools/build_env.py: toolkit discovery)

# torch.utils.cpp_extension reads CUDA_HOME when it is imported; the nvcc on
# PATH may be a wrapper whose folder is not the toolkit's, so say where.
WANT_CUDA = build_env.want_cuda()
CUDA_SETTINGS = build_env.cuda_build_settings() if WANT_CUDA else None
if CUDA_SETTINGS is not None:
    os.environ["CUDA_HOME"] = CUDA_SETTINGS["cuda_home"]

from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(ROOT, "csrc")


def rel(paths):
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def _in_cuda_dir(path):
    return os.sep + "cuda" + os.sep in path


def cpu_sources():
    srcs = glob.glob(os.path.join(CSRC, "**", "*.cc"), recursive=True)
    return rel(s for s in srcs if not _in_cuda_dir(s))


def cuda_sources():
    """Sources in any csrc/**/cuda/ folder: built only with CUDA."""
    srcs = glob.glob(os.path.join(CSRC, "**", "*.cc"), recursive=True)
    srcs += glob.glob(os.path.join(CSRC, "**", "*.cu"), recursive=True)
    return rel(s for s in srcs if _in_cuda_dir(s))


CXX_FLAGS = [
    "-O3",
    "-std=c++20",
    # Reductions must give the same bits with and without FMA units.
    "-ffp-contract=off",
    "-Wall",
    "-Wno-unused-function",
    # Every switch over one of smddp's enums names every enumerator: a new
    # reduce op or dtype is a compile error wherever it must be handled.
    "-Werror=switch",
    # torch's CUDA headers use hardware_destructive_interference_size.
    "-Wno-interference-size",
    # Line tables only (overriding Python's -g): backtraces and profilers
    # still name file and line, and torch's headers do not double the build
    # time with their full debug information. SMDDP_DEBUG_INFO=full keeps it.
    "-g" if os.environ.get("SMDDP_DEBUG_INFO") == "full" else "-g1",
]


def make_extensions():
    """smddp._C (CPU, always) and smddp._C_cuda (the CUDA path, when built).

    smddp._C exports its symbols (default visibility) and smddp._C_cuda links
    against it, so that both share one core: one logger, one error type, one
    registry of the device path. smddp._C never loads a CUDA library.
    """
    exts = [
        CppExtension(
            name="smddp._C",
            sources=cpu_sources(),
            include_dirs=[CSRC],
            extra_compile_args=CXX_FLAGS,
        )
    ]
    if WANT_CUDA and cuda_sources():
        cuda = CUDA_SETTINGS
        exts.append(
            CUDAExtension(
                name="smddp._C_cuda",
                sources=cuda_sources(),
                include_dirs=[CSRC] + cuda["include_dirs"],
                library_dirs=cuda["library_dirs"],
                extra_link_args=cuda["link_args"],
                define_macros=[("SMDDP_WITH_CUDA", "1")],
                extra_compile_args={
                    "cxx": CXX_FLAGS + ["-fvisibility=hidden"],
                    # No contracted multiply-adds (the CPU kernels' bits);
                    # host code checked like the C++ sources.
                    "nvcc": ["-O3", "-std=c++20", "--fmad=false", "-Xcompiler=-Werror=switch"]
                    + cuda["nvcc_arch_flags"]
                    + cuda["nvcc_extra_flags"],
                },
            )
        )
    return exts


class BuildExt(BuildExtension.with_options(use_ninja=True)):
    """Links smddp._C_cuda against the smddp._C just built (same folder), and
    both against the shared libstdc++ that torch uses (build_env)."""

    def build_extension(self, ext):
        if ext.name == "smddp._C_cuda":
            core = self.get_ext_fullpath("smddp._C")
            ext.extra_link_args = list(ext.extra_link_args) + [
                f"-L{os.path.dirname(core)}",
                f"-l:{os.path.basename(core)}",
                "-Wl,-rpath,$ORIGIN",
            ]
        if sys.platform.startswith("linux"):
            ext.extra_link_args = list(ext.extra_link_args) + build_env.shared_libstdcxx_link_args()
        super().build_extension(ext)
        if sys.platform.startswith("linux"):
            build_env.check_shared_libstdcxx(self.get_ext_fullpath(ext.name), " ".join(self.compiler.linker_so[:1]))


# The Makefile installs the package editable without the extension
# (SMDDP_NO_EXTENSION=1: metadata and entry points only) and then builds the
# extension in place, so that rebuilds after that are incremental.
EXT_MODULES = [] if os.environ.get("SMDDP_NO_EXTENSION") == "1" else make_extensions()

setup(
    name="smddp",
    version="0.1.0",
    description="Hierarchical AllGather/ReduceScatter/AllReduce backend for PyTorch",
    python_requires=">=3.10",
    packages=find_packages(include=["smddp", "smddp.*"]),
    ext_modules=EXT_MODULES,
    cmdclass={"build_ext": BuildExt},
    # smddp-bench: numpy computes the expected results; tqdm (progress bar)
    # and matplotlib (plot) are optional.
    extras_require={"bench": ["numpy", "tqdm", "matplotlib"]},
    entry_points={
        "torch.distributed.backends": ["smddp = smddp:register"],
        "console_scripts": ["smddp-bench = smddp.bench.cli:main", "smddp-cluster = smddp.cluster.cli:main"],
    },
    zip_safe=False,
)
