"""bf16 experts: the source's bf16 weights, re-laid only (gpt-oss's transpose and interleave undone)."""

from __future__ import annotations

from .base import BankSpec, ExpertFormat, add_biases, bias_banks, register, split_gate_up
from .codes import bf16


@register
class Bf16(ExpertFormat):
    name = "bf16"
    summary = "bf16 weights; expert biases where the model has them (gpt-oss)"
    bank_names = ("gate_up", "down", "gate_up_bias", "down_bias")
    legacy_options = ("swiglu_limit", "swiglu_alpha", "activation")

    @classmethod
    def banks(cls, H, I, options):
        return {
            "gate_up": BankSpec("gate_up", ("bf16",), (2 * I, H)),
            "down": BankSpec("down", ("bf16",), (H, I)),
            **bias_banks(H, I, ("bf16",), optional=True),
        }

    @classmethod
    def decode(cls, rows, H, I, options):
        return add_biases(split_gate_up(bf16(rows["gate_up"]), I, bf16(rows["down"])), rows, I, bf16)

    @classmethod
    def decode_projection(cls, parts, options):
        return bf16(parts["weight"])
