"""Read-only memory maps of source files that remember which file they map, and pread
helpers that turn a file shrinking under us into an error instead of a SIGBUS.

Readers hand rows to the writer as zero-copy views of their maps. The writer never reads
those views: it finds the file and offset behind them (through numpy's chain of bases, so
the map is alive for as long as the view is) and reads the bytes once with pread, into the
output buffer where the checksum reads them (writers/ftw_writer.py). Nothing is touched
through the map, so a source truncated mid-conversion ends in a short read naming the file
(docs/BENCHMARKS.md, "Convert: every layout").
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from .errors import FtwError, SourceError


class FileMap(mmap.mmap):
    """mmap of a whole file, read-only, holding its own descriptor of that file and its path."""

    def __new__(cls, fd: int, path: str | None = None):
        self = super().__new__(cls, fd, 0, access=mmap.ACCESS_READ)
        self.source_fd = os.dup(fd)
        self.path = path if path is not None else _fd_path(fd)
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

    def check_size(self) -> None:
        """SourceError when the file no longer holds every byte this map was made for: reading
        a page of the map past the new end would kill the process with SIGBUS."""
        size = os.fstat(self.source_fd).st_size if self.source_fd >= 0 else len(self)
        if size < len(self):
            raise SourceError(f"{self.path}: file shrank from {len(self)} to {size} bytes while being read")


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"file descriptor {fd}"


def file_span(view) -> tuple[FileMap, int] | None:
    """(map, file offset) of a C-contiguous view of a FileMap, else None."""
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
    return obj, offset


def read_exact(fd: int, dst, offset: int, path: str, error: type[FtwError] = SourceError) -> None:
    """pread file bytes [offset, offset + len(dst)) into dst (a writable buffer). A short read
    means the file shrank: `error` naming the file, never a partial buffer."""
    view = memoryview(dst).cast("B")
    while view:
        try:
            n = os.preadv(fd, [view], offset)
        except OSError as e:
            raise error(f"{path}: cannot read at byte {offset}: {e.strerror or e}") from None
        if n <= 0:
            raise error(f"{path}: file shrank while being read (no bytes at offset {offset})")
        view, offset = view[n:], offset + n


def read_span(view) -> np.ndarray | None:
    """The bytes of a FileMap view, read with pread into fresh memory (None for other arrays):
    for consumers that read every byte in user space (compression), so that a truncated
    source is a SourceError rather than a SIGBUS inside the map."""
    span = file_span(view)
    if span is None:
        return None
    fm, offset = span
    out = np.empty(memoryview(view).nbytes, dtype=np.uint8)
    read_exact(fm.source_fd, out, offset, fm.path)
    return out


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
