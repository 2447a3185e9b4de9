"""Rows that readers compute rather than hand out as views (gpt-oss: transposed and
de-interleaved), made at memory speed.

numpy's copy of a transposed view walks the source a column at a time: for a [2048, 1536]
bf16 slab every element is on another page, and the copy runs at 0.1-0.3 GB/s. Copying 64
source rows at a time keeps the pages of one block in the TLB and its lines in L2: 0.9-1.1
GB/s on the development machine, 4-9x faster (bench/bench_convert.py --layout gpt_oss_bf16).
"""

from __future__ import annotations

import numpy as np

BLOCK_ROWS = 64  # 32 and 128 were 1.5-2x slower for bf16 slabs of H=2048 (measured)


def transposed(a: np.ndarray) -> np.ndarray:
    """a.T as a new C-contiguous array (a 2-D array, any strides), copied in row blocks."""
    if a.ndim != 2:
        raise ValueError(f"transposed() takes a 2-D array, got shape {a.shape}")
    n, m = a.shape
    out = np.empty((m, n), dtype=a.dtype)
    for i in range(0, n, BLOCK_ROWS):
        out[:, i : i + BLOCK_ROWS] = a[i : i + BLOCK_ROWS].T
    return out
