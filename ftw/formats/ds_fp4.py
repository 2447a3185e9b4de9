"""DeepSeek-V4 FP4 experts: e2m1 pairs with one E8M0 scale per 32 values, no biases.

The bytes and their decoding are mxfp4's. DeepSeek-V4's GPU path quantizes activations to
e4m3 in blocks of act_block values before the product; scale_fmt (from the checkpoint's
quantization_config) says how a block's scale is formed (docs/FORMAT.md).
"""

from __future__ import annotations

from .base import ExpertFormat, Option, one_of, positive_int, register
from .mxfp4 import decode_fp4, decode_fp4_projection, fp4_banks


@register
class DsFp4(ExpertFormat):
    name = "ds_fp4"
    summary = "DeepSeek-V4 FP4: e2m1 pairs, E8M0 scale per 32 values; activations quantized per act_block"
    bank_names = ("gate_up", "down", "gate_up_scale", "down_scale")
    options = (
        Option("act_block", positive_int, "activation block for e4m3 activation quantization (128)"),
        Option("scale_fmt", one_of("ue8m0", "float"),
               "activation block scale rule: 'ue8m0' rounds amax/448 up to a power of two, 'float' keeps it"),
    )
    legacy_options = ("swiglu_limit",)

    @classmethod
    def banks(cls, H, I, options):
        return fp4_banks(H, I, packed_read_dtypes=("i8",))  # files before 0.2 copied the source's I8

    @classmethod
    def decode(cls, rows, H, I, options):
        return decode_fp4(rows, I)

    @classmethod
    def decode_projection(cls, parts, options):
        return decode_fp4_projection(parts)
