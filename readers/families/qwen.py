"""Qwen MoE families: qwen3_moe (per-expert or stacked) and qwen3_5_moe (multimodal wrapper)."""

from __future__ import annotations

from . import register
from .base import Family


@register
class Qwen3Moe(Family):
    name = "qwen3_moe"
    model_types = ("qwen3_moe",)

    def moe_layers(self, num_layers: int) -> list[int]:
        # the rule of transformers' Qwen3MoeDecoderLayer
        only = set(self.text.get("mlp_only_layers") or [])
        step = self.text.get("decoder_sparse_step") or 1
        if self.get_int(self.expert_count_keys) == 0:
            return []
        return [i for i in range(num_layers) if i not in only and (i + 1) % step == 0]


@register
class Qwen3_5Moe(Family):
    name = "qwen3_5_moe"
    # the text-only checkpoint (qwen3_5_moe_text) drops the `language_model.` level
    model_types = ("qwen3_5_moe", "qwen3_5_moe_text")
    layer_prefixes = ("model.language_model.layers.", "model.layers.")

    def expected_first(self, base: str) -> str:
        return f"{base}gate_up_proj"


@register
class Qwen3Next(Qwen3Moe):
    """Same expert naming and MoE-layer rule as qwen3_moe (transformers' Qwen3NextDecoderLayer); MTP under `mtp.`."""

    name = "qwen3_next"
    model_types = ("qwen3_next",)
