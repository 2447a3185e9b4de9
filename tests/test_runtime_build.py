"""The extension module ftw._runtime: what it was built with, and C++ errors crossing as ftw errors.

A build that silently skipped CUDA where nvcc exists fails here (CI has nvcc 13 and no GPU).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

import ftw.runtime
from ftw import _runtime, errors


def test_build_info_reports_the_build():
    info = ftw.runtime.build_info()
    assert info["version"] == ftw.__version__
    assert info["compiler"].split()[0] in ("GNU", "Clang", "AppleClang", "MSVC", "IntelLLVM")
    assert isinstance(info["simd"], list)
    assert isinstance(info["cpu_formats"], list)
    assert info["cuda"] in (True, False)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on PATH")
def test_cuda_compiled_where_nvcc_exists():
    info = ftw.runtime.build_info()
    assert info["cuda"] is True, f"nvcc is on PATH but ftw._runtime was built without CUDA: {info}"
    out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    assert f"release {info['cuda_version']}" in out, (info, out)
    assert info["cuda_architectures"] == "90"
    assert ftw.runtime.cuda_device_count() >= 0  # no GPU here: 0, and no exception


@pytest.mark.parametrize(
    "kind, cls",
    [
        ("format", errors.FormatError),
        ("shape", errors.FormatError),
        ("unsupported", errors.UnsupportedError),
        ("cuda", errors.FtwError),
        ("error", errors.FtwError),
    ],
)
def test_cpp_errors_cross_as_ftw_errors(kind, cls):
    with pytest.raises(cls) as info:
        _runtime._raise_for_test(kind, f"layer 3: bank 'down' is {kind}")
    assert type(info.value) is cls
    assert str(info.value) == f"layer 3: bank 'down' is {kind}"


def test_importing_the_runtime_does_not_import_torch():
    code = "import sys, ftw.runtime; ftw.runtime.build_info(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
