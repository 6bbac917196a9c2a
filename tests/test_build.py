"""How the extensions are linked: against the shared libstdc++ that torch
uses, whatever the compiler does by default (tools/build_env.py). A static
copy of the C++ runtime beside torch's crashes at the first string stream."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
try:
    import build_env
finally:
    sys.path.pop(0)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF shared objects only")

SOURCE = """
#include <sstream>
#include <string>
std::string text(int x) { std::ostringstream o; o << x; return o.str(); }
"""


def test_the_built_extensions_load_the_shared_libstdcxx() -> None:
    built = glob.glob(os.path.join(ROOT, "smddp", "_C*.so"))
    assert built, "smddp is not built"
    for path in built:
        needed = build_env.needed_libraries(path)
        assert needed is not None and "libstdc++.so.6" in needed, (path, needed)
        build_env.check_shared_libstdcxx(path, "c++")


@pytest.mark.parametrize("how", ["-static-libstdc++", "an archive-only folder first"])
def test_a_compiler_that_links_libstdcxx_statically_is_overridden(tmp_path, how) -> None:
    """The two ways a compiler links libstdc++ statically without being asked:
    -static-libstdc++, or a folder of its own searched first that holds only
    libstdc++.a (which -lstdc++ then finds even with -Bdynamic)."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++")
    src = tmp_path / "text.cc"
    src.write_text(SOURCE)
    if how == "-static-libstdc++":
        compiler_flags = ["-static-libstdc++"]
    else:
        archive = subprocess.run([cxx, "-print-file-name=libstdc++.a"], capture_output=True, text=True).stdout.strip()
        if not os.path.isabs(archive):
            pytest.skip("g++ has no libstdc++.a")
        only = tmp_path / "only-archive"
        only.mkdir()
        shutil.copy(archive, only / "libstdc++.a")
        compiler_flags = [f"-L{only}"]

    def link(name: str, extra: list[str]) -> str:
        out = str(tmp_path / name)
        # The project's link arguments come after the compiler's own, as in setup.py.
        subprocess.run([cxx, "-fPIC", "-shared", *compiler_flags, str(src), *extra, "-o", out],
                       check=True, capture_output=True, timeout=120)  # fmt: skip
        return out

    static = link("static.so", [])
    assert "libstdc++.so.6" not in build_env.needed_libraries(static)
    with pytest.raises(RuntimeError, match=r"static\.so was linked without the shared libstdc\+\+.*CXX="):
        build_env.check_shared_libstdcxx(static, cxx)
    shared = link("shared.so", build_env.shared_libstdcxx_link_args())
    assert "libstdc++.so.6" in build_env.needed_libraries(shared)
    build_env.check_shared_libstdcxx(shared, cxx)


def test_other_files_are_not_read_as_shared_objects(tmp_path) -> None:
    p = tmp_path / "x.so"
    p.write_bytes(b"#!/bin/sh\n")
    assert build_env.needed_libraries(str(p)) is None
    build_env.check_shared_libstdcxx(str(p), "c++")
