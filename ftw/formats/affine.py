"""MLX affine quantization: `bits`-bit unsigned values as an LSB-first bit stream per row,
with a scale and an offset per `group_size` inputs: w = scale * q + offset.

MLX calls the offset "biases"; in ftw a bias is always an additive output bias, so the
affine term has its own name (gate_up_offset, down_offset).
"""

from __future__ import annotations

import numpy as np

from .base import BankSpec, ExpertFormat, Option, one_of, positive_int, register, split_gate_up
from .codes import floats, repeat_blocks

SCALE_DTYPES = ("bf16", "f16", "f32")  # the model dtype


def unpack_bits(words: np.ndarray, bits: int) -> np.ndarray:
    """Each row is an LSB-first bit stream of `bits`-bit unsigned values -> float64."""
    b = np.ascontiguousarray(words).view(np.uint8)
    stream = np.unpackbits(b, axis=-1, bitorder="little")
    vals = stream.reshape(*stream.shape[:-1], -1, bits).astype(np.int64)
    return (vals << np.arange(bits)).sum(-1).astype(np.float64)


@register
class Affine(ExpertFormat):
    name = "affine"
    summary = "MLX affine: bits-bit values (LSB-first u32 stream), scale and offset per group"
    bank_names = ("gate_up", "down", "gate_up_scale", "down_scale", "gate_up_offset", "down_offset")
    options = (
        Option("bits", one_of(2, 3, 4, 5, 6, 8), "bits per value", required=True),
        Option("group_size", positive_int, "inputs per scale and offset", required=True),
    )

    @classmethod
    def banks(cls, H, I, options):
        bits, gs = options["bits"], options["group_size"]
        banks = {}
        for p, (rows, cols) in (("gate_up", (2 * I, H)), ("down", (H, I))):
            banks[p] = BankSpec(p, ("u32",), (rows, cols * bits // 32))
            banks[f"{p}_scale"] = BankSpec(f"{p}_scale", SCALE_DTYPES, (rows, cols // gs))
            banks[f"{p}_offset"] = BankSpec(f"{p}_offset", SCALE_DTYPES, (rows, cols // gs))
        return {n: banks[n] for n in cls.bank_names}

    @classmethod
    def decode(cls, rows, H, I, options):
        bits = options["bits"]

        def one(p: str):
            q = unpack_bits(rows[p], bits)
            cols = q.shape[-1]
            return q * repeat_blocks(floats(rows[p + "_scale"]), cols) + repeat_blocks(floats(rows[p + "_offset"]), cols)

        return split_gate_up(one("gate_up"), I, one("down"))

    @classmethod
    def decode_projection(cls, parts, options):
        q = unpack_bits(parts["weight"], options["bits"])
        cols = q.shape[-1]
        return q * repeat_blocks(floats(parts["scale"]), cols) + repeat_blocks(floats(parts["offset"]), cols)
