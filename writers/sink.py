"""The writer's output stream: page-aligned staging buffers written with O_DIRECT.

The writer fills one buffer (pread of the source straight into it, computed bytes copied in)
while two threads write the others to the file, 8 MiB per pwrite(), bypassing the page
cache (two requests in flight were 10-30% faster than one on the development disk). The kernel neither allocates cache pages for the output nor copies the bytes into
them, and fsync has nothing left to flush: on the development machine a 3.5 GiB conversion
took 0.8-1.2 s of CPU this way, against 1.3-1.5 s for `cp`'s copy_file_range and 4-7 s for
buffered 1 MiB writes from the same kind of buffer (docs/BENCHMARKS.md). The output file is
not left in the page cache, as it would be after `cp`; a 1 TB conversion does not evict
everything else from it either.

Where the filesystem refuses O_DIRECT (tmpfs on older kernels, some FUSE mounts) the same
buffers are written with plain write(). The file is written strictly in order from offset 0,
so every direct write starts on a multiple of the buffer size; the last, partial block goes
through the page cache before the fsync of commit.
"""

from __future__ import annotations

import errno
import fcntl
import os
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ftw.errors import FtwError

from .atomic import AtomicFile

STAGE = 8 << 20  # bytes per write; 32 MiB was slower, 1 MiB pays per call
WRITERS = 2  # writes in flight
ALIGN = 4096  # buffer address, length and file offset of an O_DIRECT write (>= any logical block)
O_DIRECT = getattr(os, "O_DIRECT", 0)


def _aligned(nbytes: int) -> memoryview:
    """Private anonymous memory, page-aligned (a shared anonymous map made buffered writes 4x
    slower on the development machine)."""
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    skip = -raw.ctypes.data % ALIGN
    return memoryview(raw[skip : skip + nbytes])


class Sink:
    def __init__(self, file: AtomicFile):
        self._file = file
        self.path = file.path
        self._bufs = [_aligned(STAGE) for _ in range(WRITERS + 1)]
        self._pending: list[Future | None] = [None] * len(self._bufs)  # each buffer's write
        self._cur = 0  # the buffer being filled
        self._fill = 0
        self._offset = 0  # where the current buffer goes in the file
        self._writer = ThreadPoolExecutor(WRITERS, thread_name_prefix="ftw-write")
        self._direct = O_DIRECT != 0 and self._set_direct(True)

    # -- filling --------------------------------------------------------------------------
    def room(self, most: int) -> memoryview:
        """Up to `most` bytes of free space in the current buffer, to read into; then advance()."""
        return self._bufs[self._cur][self._fill : self._fill + most]

    def advance(self, n: int) -> None:
        self._fill += n
        if self._fill == STAGE:
            self._send()

    def write(self, data) -> None:
        view = memoryview(data).cast("B")
        while view:
            dst = self.room(len(view))
            dst[:] = view[: len(dst)]
            view = view[len(dst) :]
            self.advance(len(dst))

    # -- writing --------------------------------------------------------------------------
    def _send(self) -> None:
        """Hand the full buffer to a writer thread and go on with the next free one."""
        self._pending[self._cur] = self._writer.submit(self._write_out, self._bufs[self._cur], self._offset)
        self._offset += STAGE
        self._cur = (self._cur + 1) % len(self._bufs)
        self._fill = 0
        self._wait(self._cur)

    def _wait(self, i: int) -> None:
        pending, self._pending[i] = self._pending[i], None
        if pending is not None:
            pending.result()

    def _write_out(self, view: memoryview, offset: int) -> None:
        try:
            while view:
                try:
                    n = os.pwrite(self._file.fd, view, offset)
                except OSError as e:
                    if not (self._direct and e.errno == errno.EINVAL):
                        raise
                    # the filesystem took the flag but refuses the write: no bytes went out
                    self._direct = self._set_direct(False)
                    continue
                view, offset = view[n:], offset + n
        except OSError as e:
            raise FtwError(f"{self.path}: cannot write: {e.strerror or e}") from None

    def _set_direct(self, on: bool) -> bool:
        """Turn O_DIRECT on or off for the file; returns whether it is on."""
        try:
            flags = fcntl.fcntl(self._file.fd, fcntl.F_GETFL)
            fcntl.fcntl(self._file.fd, fcntl.F_SETFL, (flags | O_DIRECT) if on else (flags & ~O_DIRECT))
        except OSError:
            return False if on else self._direct
        return on

    def finish(self) -> None:
        """Write everything staged (the whole-block part direct, the tail through the page
        cache); the caller then fsyncs and commits."""
        for i in range(len(self._bufs)):
            self._wait(i)
        view = self._bufs[self._cur][: self._fill]
        whole = self._fill - self._fill % ALIGN
        if whole:
            self._write_out(view[:whole], self._offset)
        if self._fill > whole:
            if self._direct:
                self._direct = self._set_direct(False)
            self._write_out(view[whole:], self._offset + whole)
        self._fill = 0
        self.close()

    def close(self) -> None:
        """Stop the writer thread (after its current write); nothing more is written."""
        self._writer.shutdown(wait=True, cancel_futures=True)
        self._pending = [None] * len(self._bufs)
