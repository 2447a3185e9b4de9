"""NVFP4 (ModelOpt and compressed-tensors): e2m1 pairs, an e4m3 scale per 16, a per-row global.

w = e2m1 * e4m3(scale) * global. The global is one float32 per row: gate rows carry gate's
global, up rows up's. compressed-tensors stores the inverse; its reader stores the reciprocal
(the one lossy step of any reader, <= 2^-24 relative; docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import numpy as np

from .base import BankSpec, ExpertFormat, register, split_gate_up
from .codes import E4M3, fp4, repeat_blocks


@register
class Nvfp4(ExpertFormat):
    name = "nvfp4"
    summary = "e2m1 pairs (low nibble first), e4m3 scale per 16 values, float32 global per row"
    bank_names = ("gate_up", "down", "gate_up_scale", "down_scale", "gate_up_global", "down_global")

    @classmethod
    def banks(cls, H, I, options):
        return {
            "gate_up": BankSpec("gate_up", ("u8",), (2 * I, H // 2)),
            "down": BankSpec("down", ("u8",), (H, I // 2)),
            "gate_up_scale": BankSpec("gate_up_scale", ("f8_e4m3",), (2 * I, H // 16)),
            "down_scale": BankSpec("down_scale", ("f8_e4m3",), (H, I // 16)),
            "gate_up_global": BankSpec("gate_up_global", ("f32",), (2 * I,)),
            "down_global": BankSpec("down_global", ("f32",), (H,)),
        }

    @classmethod
    def decode(cls, rows, H, I, options):
        def one(p: str):
            v = fp4(rows[p])
            return v * repeat_blocks(E4M3[rows[p + "_scale"]], v.shape[-1]) * rows[p + "_global"].astype(float)[:, None]

        return split_gate_up(one("gate_up"), I, one("down"))

    @classmethod
    def decode_projection(cls, parts, options):
        """ModelOpt: w = e2m1 * scale * weight_scale_2; compressed-tensors: w = e2m1 * scale / global."""
        v = fp4(np.asarray(parts["weight"]).reshape(len(parts["weight"]), -1))
        s = repeat_blocks(E4M3[np.asarray(parts["scale"]).view(np.uint8)], v.shape[-1])
        if "global_inverse" in parts:
            return v * s / float(np.asarray(parts["global_inverse"]).reshape(-1)[0])
        return v * s * float(np.asarray(parts["global"]).reshape(-1)[0])
