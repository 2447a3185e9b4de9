"""Pinned host memory for loaded banks: filled as plain pages, then page-locked in place.

Measured on an H200 host (bench/bench_pinned.py --size-gib 8, docs/BENCHMARKS.md): torch's
pinned allocator (one cudaHostAlloc per bank) followed by a 16-thread fill took 4.10 s, as
cudaHostAlloc pins page by page on one thread before any data moves; filling pageable
memory with 16 threads and then cudaHostRegister-ing each bank on the pool took 1.08 s.
torch's caching host allocator also rounds every block up to a power of two; here each bank
costs at most one partly used page.
"""

from __future__ import annotations

import mmap
import weakref

import numpy as np

from .errors import FtwError


def host_buffer(nbytes: int) -> np.ndarray:
    """A page-aligned uint8 buffer that shares no page with any other: registration works
    on whole pages, and a page registered twice is an error."""
    if nbytes == 0:
        return np.empty(0, dtype=np.uint8)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)


def _unregister(ptr: int) -> None:
    import torch

    torch.cuda.cudart().cudaHostUnregister(ptr)


def as_tensor(buf: np.ndarray, torch_dtype, shape: tuple[int, ...], register: bool):
    """The torch view of a filled host_buffer, page-locked when register is True. The pages
    stay locked for as long as the tensor (or any view of it) lives."""
    import torch

    flat = buf.reshape(-1).view(np.uint8)
    if register and flat.nbytes:
        rc = torch.cuda.cudart().cudaHostRegister(flat.ctypes.data, flat.nbytes, 0)
        if int(rc) != 0:
            raise FtwError(f"cudaHostRegister of {flat.nbytes} bytes failed with CUDA error {int(rc)}")
        # torch keeps `flat` alive for as long as the tensor's storage: unlock when it goes
        weakref.finalize(flat, _unregister, flat.ctypes.data)
    return torch.from_numpy(flat).view(torch_dtype).reshape(shape)
