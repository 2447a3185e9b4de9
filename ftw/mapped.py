"""Read-only memory maps of source files that remember which file they map.

Readers hand rows to the writer as zero-copy views of their maps. When a view's memory is
found to come from a FileMap (through numpy's chain of bases, so the map is alive for as
long as the view is), the writer copies those bytes with copy_file_range inside the kernel
instead of write()-ing them out of the map: 1.5x faster on the development disk, where it
matched `cp` (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import mmap
import os

import numpy as np


class FileMap(mmap.mmap):
    """mmap of a whole file, read-only, holding its own descriptor of that file."""

    def __new__(cls, fd: int):
        self = super().__new__(cls, fd, 0, access=mmap.ACCESS_READ)
        self.source_fd = os.dup(fd)
        self.start = np.frombuffer(self, dtype=np.uint8).ctypes.data if len(self) else 0
        return self

    def close(self) -> None:
        super().close()  # raises BufferError while views exist: the descriptor stays with them
        if self.source_fd >= 0:
            os.close(self.source_fd)
            self.source_fd = -1

    def __del__(self) -> None:
        if getattr(self, "source_fd", -1) >= 0:
            os.close(self.source_fd)
            self.source_fd = -1


def file_span(view) -> tuple[int, int] | None:
    """(fd, file offset) of a C-contiguous view of a FileMap, else None."""
    obj = view
    while isinstance(obj, (np.ndarray, memoryview)):
        obj = obj.base if isinstance(obj, np.ndarray) else obj.obj
    if not isinstance(obj, FileMap) or obj.closed or obj.source_fd < 0:
        return None
    a = view if isinstance(view, np.ndarray) else np.frombuffer(view, dtype=np.uint8)
    if not a.flags.c_contiguous or not a.nbytes:
        return None
    offset = a.ctypes.data - obj.start
    if offset < 0 or offset + a.nbytes > len(obj):
        return None
    return obj.source_fd, offset


MADV_POPULATE_READ = 22  # Linux >= 5.14; Python's mmap module does not name it
MIN_POPULATE = 256 << 10  # below this, a few page faults cost less than the call


def populate(mm: mmap.mmap, offset: int, nbytes: int) -> None:
    """Map a byte range's pages in one call: faulting them in 4 KiB at a time costs more than
    a warm read (bench/bench_readers.py, bench/bench_gguf.py)."""
    if nbytes < MIN_POPULATE:
        return
    start = offset - offset % mmap.PAGESIZE
    try:
        mm.madvise(MADV_POPULATE_READ, start, offset + nbytes - start)
    except (OSError, ValueError, AttributeError):
        pass  # an older kernel: page faults do the same, slower


def release_pages(mm: mmap.mmap) -> None:
    """Drop the pages of a read-only file mapping from this process (MADV_DONTNEED): they
    stay in the page cache and fault back in on the next access, but stop counting towards
    RSS. Views into the map stay valid."""
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if advice is not None and len(mm):
        try:
            mm.madvise(advice)
        except (OSError, ValueError):
            pass  # advice only: a platform that refuses it just keeps the pages mapped
