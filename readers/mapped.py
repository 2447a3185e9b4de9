"""Memory maps of source files: what readers share about them."""

from __future__ import annotations

import mmap


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
