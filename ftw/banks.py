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
from typing import Callable, Mapping, Sequence

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
    # expert -> the source's own projections {"gate": parts, "up": ..., "down": ..., biases},
    # taken from the checkpoint's tensors without the bank builders' re-laying: `ftw check`
    # decodes it with the format's decode_projection as an independent reference
    reference: Callable[[int], dict] | None = None

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.banks.values())

    @classmethod
    def build(cls, layer: int, fmt: LayerFormat, H: int, I: int, E: int,  # noqa: E741
              rows: Mapping[str, RowPieces], dtypes: Mapping[str, str] | None = None) -> "LayerBanks":
        """A layer's banks with dtypes and row shapes from its format: a reader says only
        where each bank's rows come from (and a dtype where the format allows several)."""
        specs = fmt.banks(H, I)
        banks = {}
        for name, row in rows.items():
            s = specs.get(name)
            dtype = (dtypes or {}).get(name, s.dtypes[0] if s else "u8")
            banks[name] = BankSource(dtype, s.row_shape if s else (0,), E, row)
        out = cls(layer, fmt, banks)
        out.check(H, I, f"layer {layer}")
        return out

    def dims(self) -> tuple[int, int]:
        """(H, I) as the banks' row shapes give them."""
        return self.format.format.infer_dims({n: b.row_shape for n, b in self.banks.items()}, self.format.options)

    def decode_expert(self, e: int) -> dict[str, np.ndarray]:
        """Expert e's float64 weights through the format's reference decoder."""
        return self.format.decode({n: b.row_array(e) for n, b in self.banks.items()}, *self.dims())

    def reference_expert(self, e: int) -> dict[str, np.ndarray] | None:
        """Expert e's float64 weights decoded from the source's own tensors, per projection."""
        if self.reference is None:
            return None
        from .formats.codes import floats

        src = self.reference(e)
        fmt, options = self.format.format, self.format.options
        out = {role: fmt.decode_projection(src[role], options) for role in ("gate", "up", "down")}
        for k in ("gate_bias", "up_bias", "down_bias"):
            if k in src:
                out[k] = floats(src[k])
        return out

    def check(self, H: int, I: int, where: str) -> None:  # noqa: E741
        """Every bank against the format: FormatError naming the layer and bank."""
        shapes = {n: (b.dtype, b.row_shape) for n, b in self.banks.items()}
        self.format.format.check_banks(shapes, H, I, self.format.options, where)


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
