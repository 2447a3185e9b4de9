"""gpt-oss MXFP4: e2m1 pairs with one E8M0 scale per 32 values, and bf16 expert biases.

w = e2m1 * 2^(scale - 127); packed bytes hold the low nibble first. ds_fp4 shares the banks
and the decoder (fp4_banks, decode_fp4) and differs in options and biases."""

from __future__ import annotations

import numpy as np

from .base import (BankSpec, ExpertFormat, add_biases, bias_banks,
                   register, split_gate_up)
from .codes import E8M0, bf16, fp4, repeat_blocks


def fp4_banks(H: int, I: int, packed_read_dtypes: tuple[str, ...] = ()) -> dict[str, BankSpec]:  # noqa: E741
    return {
        "gate_up": BankSpec("gate_up", ("u8",), (2 * I, H // 2), read_dtypes=packed_read_dtypes),
        "down": BankSpec("down", ("u8",), (H, I // 2), read_dtypes=packed_read_dtypes),
        "gate_up_scale": BankSpec("gate_up_scale", ("e8m0",), (2 * I, H // 32)),
        "down_scale": BankSpec("down_scale", ("e8m0",), (H, I // 32)),
    }


def decode_fp4(rows, I):  # noqa: E741
    def one(p: str):
        v = fp4(rows[p])
        return v * repeat_blocks(E8M0[rows[p + "_scale"]], v.shape[-1])

    return split_gate_up(one("gate_up"), I, one("down"))


def decode_fp4_projection(parts) -> np.ndarray:
    """e2m1 bytes as stored ([out, in/2], or gpt-oss's [out, in/32, 16]) with E8M0 scales per 32."""
    w = np.asarray(parts["weight"])
    v = fp4(w.reshape(w.shape[0], -1))
    return v * repeat_blocks(E8M0[np.asarray(parts["scale"]).view(np.uint8).reshape(w.shape[0], -1)], v.shape[-1])


@register
class Mxfp4(ExpertFormat):
    name = "mxfp4"
    summary = "gpt-oss MXFP4: e2m1 pairs, E8M0 scale per 32 values, bf16 expert biases"
    bank_names = ("gate_up", "down", "gate_up_scale", "down_scale", "gate_up_bias", "down_bias")
    legacy_options = ("swiglu_limit", "swiglu_alpha")

    @classmethod
    def banks(cls, H, I, options):
        return {**fp4_banks(H, I), **bias_banks(H, I, ("bf16",), optional=False)}

    @classmethod
    def decode(cls, rows, H, I, options):
        return add_biases(decode_fp4(rows, I), rows, I, bf16)

    @classmethod
    def decode_projection(cls, parts, options):
        return decode_fp4_projection(parts)
