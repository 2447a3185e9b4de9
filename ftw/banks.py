"""Banks as readers hand them to the writer: a per-expert row layout plus a way to fetch a row.

A bank is one kind of per-expert array (gate_up, down_scale, ...). In a layer, bank k is
[E, *row_shape]: expert e's data is one contiguous row. Readers describe a bank without
reading it (dtype, row shape) and fetch one expert's row on demand as a few array pieces
whose C-order bytes, concatenated, ARE the row (gate rows then up rows, say). Pieces are
zero-copy views of the source where the source already has the bytes in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Callable, Sequence

import numpy as np

from . import spec
from .formats import LayerFormat

RowPieces = Callable[[int], Sequence[np.ndarray]]


@dataclass
class BankSource:
    dtype: str  # an ftw dtype name (spec.DTYPES)
    row_shape: tuple[int, ...]  # one expert's shape, e.g. (2 * I, H)
    num_experts: int
    row: RowPieces  # expert e -> pieces of its row

    @property
    def row_nbytes(self) -> int:
        return prod(self.row_shape) * spec.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return self.row_nbytes * self.num_experts

    def row_array(self, e: int) -> np.ndarray:
        """Expert e's row as one array of the bank's dtype (copies when the row has pieces)."""
        pieces = [np.ascontiguousarray(p).reshape(-1).view(np.uint8) for p in self.row(e)]
        flat = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        return flat.view(spec.numpy_dtype(self.dtype)).reshape(self.row_shape)


@dataclass
class LayerBanks:
    """One MoE layer's banks in its format, resolved (every shape checked) but not yet read."""

    layer: int
    format: LayerFormat
    banks: dict[str, BankSource]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.banks.values())


@dataclass
class SourceTensor:
    """A non-expert tensor carried byte for byte (attention, norms, router, shared experts...)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: Callable[[], np.ndarray]  # fetched lazily: bytes in C order
    meta: dict | None = None  # format specifics worth keeping (a GGUF tensor's ggml type)

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * spec.dtype(self.dtype).itemsize
