"""The CPU executor's other instruction-set paths (csrc/core/simd.h): the suite's own build
uses -march=native (AVX-512 here), so this builds the module twice more, portable
(-march=x86-64, FTW_NATIVE=OFF) and AVX2 (-march=haswell), and runs tests/test_cpu_executor.py
against each, isolated from the editable install (python -S, the wheel's files first on the
path). Slow: two compiles without CUDA.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@pytest.mark.slow
@pytest.mark.parametrize("path, flags, simd", [
    ("portable", "-march=x86-64", set()),
    ("avx2", "-march=haswell", {"avx2", "fma", "f16c"}),
])
def test_cpu_executor_on_other_simd_paths(tmp_path, path, flags, simd):
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 paths")
    if not simd <= _cpu_flags():
        pytest.skip(f"this CPU lacks {sorted(simd - _cpu_flags())}")
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", str(tmp_path / "dist"),
         "-C", f"build-dir={tmp_path / 'build'}", "-C", "cmake.define.FTW_NATIVE=OFF", "-C", "cmake.define.FTW_CUDA=OFF",
         "-C", f"cmake.define.CMAKE_CXX_FLAGS={flags}", str(ROOT)],
        capture_output=True, text=True, env=env)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("ftw_moe-*.whl")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path / "site")
    site = sysconfig.get_paths()["purelib"]
    probe = (
        "import sys, ftw.runtime as r, pytest; i = r.build_info();"
        f"assert r.__file__.startswith({str(tmp_path / 'site')!r}), r.__file__;"
        f"assert ('avx512f' in i['simd']) is False and ('avx2' in i['simd']) is {bool(simd)}, i['simd'];"
        "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'test_cpu_executor.py', '-k', 'not mixed_model']))"
    )
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), str(ROOT), str(ROOT / "tests"), site])
    run = subprocess.run([sys.executable, "-S", "-c", probe], cwd=ROOT / "tests", capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout
