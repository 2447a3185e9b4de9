"""MXFP8 (MLX mxfp8, compressed-tensors mxfp8-quantized): e4m3 weights, E8M0 scale per 32."""

from __future__ import annotations

import numpy as np

from .base import BankSpec, ExpertFormat, register, split_gate_up
from .codes import E4M3, E8M0, repeat_blocks


@register
class Mxfp8(ExpertFormat):
    name = "mxfp8"
    summary = "e4m3 weights, E8M0 scale per 32 values"
    bank_names = ("gate_up", "down", "gate_up_scale", "down_scale")

    @classmethod
    def banks(cls, H, I, options):
        return {
            "gate_up": BankSpec("gate_up", ("f8_e4m3",), (2 * I, H)),
            "down": BankSpec("down", ("f8_e4m3",), (H, I)),
            "gate_up_scale": BankSpec("gate_up_scale", ("e8m0",), (2 * I, H // 32)),
            "down_scale": BankSpec("down_scale", ("e8m0",), (H, I // 32)),
        }

    @classmethod
    def decode(cls, rows, H, I, options):
        def one(p: str):
            v = E4M3[rows[p]]
            return v * repeat_blocks(E8M0[rows[p + "_scale"]], v.shape[-1])

        return split_gate_up(one("gate_up"), I, one("down"))

    @classmethod
    def decode_projection(cls, parts, options):
        v = E4M3[np.asarray(parts["weight"]).view(np.uint8)]
        return v * repeat_blocks(E8M0[np.asarray(parts["scale"]).view(np.uint8)], v.shape[-1])
