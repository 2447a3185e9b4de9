"""The bundled C++/CUDA runtime (the extension module ftw._runtime) and its Python API.

Importing this package never imports torch: arrays cross into C++ through nanobind's ndarray
(numpy arrays and torch tensors alike, zero copy).
"""

from .. import _runtime


def build_info() -> dict:
    """What ftw._runtime was compiled with: version, compiler, SIMD flags, CPU formats, CUDA."""
    return dict(_runtime.build_info())


def cuda_device_count() -> int:
    """Visible CUDA devices; 0 where there is no GPU, no driver, or the build has no CUDA."""
    return int(_runtime.cuda_device_count())


def cpu_formats() -> list[str]:
    """Formats the CPU executor has kernels for (the C++ registry's names)."""
    return list(_runtime.cpu_formats())


from .cpu import CpuMoeExecutor  # noqa: E402

__all__ = ["build_info", "cuda_device_count", "cpu_formats", "CpuMoeExecutor"]
