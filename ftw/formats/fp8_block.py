"""Block FP8 (DeepSeek-V3/R1, Qwen and GLM FP8 releases): e4m3 weights, one scale per block.

Despite the source name `weight_scale_inv`, the scale multiplies: w = e4m3 * scale[block].
gate_up's scales are gate's [ceil(I/bo), ceil(H/bi)] then up's, so row r of gate_up uses scale
row r // bo when r < I, else ceil(I/bo) + (r - I) // bo: right when I is not a multiple of bo.
"""

from __future__ import annotations

import numpy as np

from .base import BankSpec, ExpertFormat, Option, positive_int_pair, register, split_gate_up
from .codes import E4M3, cdiv, floats

SCALE_DTYPES = ("f32", "bf16")  # the source's precision is kept


@register
class Fp8Block(ExpertFormat):
    name = "fp8_block"
    summary = "e4m3 weights with one scale per [bo, bi] block (source precision)"
    bank_names = ("gate_up", "down", "gate_up_scale", "down_scale")
    options = (Option("block_size", positive_int_pair, "[bo, bi], the scale block (default [128, 128])"),)

    @staticmethod
    def block(options) -> tuple[int, int]:
        bo, bi = options.get("block_size", [128, 128])
        return bo, bi

    @classmethod
    def banks(cls, H, I, options):
        bo, bi = cls.block(options)
        return {
            "gate_up": BankSpec("gate_up", ("f8_e4m3",), (2 * I, H)),
            "down": BankSpec("down", ("f8_e4m3",), (H, I)),
            "gate_up_scale": BankSpec("gate_up_scale", SCALE_DTYPES, (2 * cdiv(I, bo), cdiv(H, bi))),
            "down_scale": BankSpec("down_scale", SCALE_DTYPES, (cdiv(H, bo), cdiv(I, bi))),
        }

    @classmethod
    def decode(cls, rows, H, I, options):
        bo, bi = cls.block(options)

        def one(w: np.ndarray, scale: np.ndarray, scale_row: np.ndarray) -> np.ndarray:
            s = floats(scale)[scale_row][:, np.arange(w.shape[1]) // bi]
            return E4M3[w] * s

        r = np.arange(2 * I)
        gu_scale_row = np.where(r < I, r // bo, cdiv(I, bo) + (r - I) // bo)
        d = rows["down"]
        return split_gate_up(one(rows["gate_up"], rows["gate_up_scale"], gu_scale_row), I,
                             one(d, rows["down_scale"], np.arange(d.shape[0]) // bo))

    @classmethod
    def decode_projection(cls, parts, options):
        w = E4M3[np.asarray(parts["weight"]).view(np.uint8)]
        bo, bi = cls.block(options)
        s = floats(parts["scale"])
        return w * np.repeat(np.repeat(s, bo, axis=0), bi, axis=1)[: w.shape[0], : w.shape[1]]
