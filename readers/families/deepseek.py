"""DeepSeek-V3 naming and its relatives (glm4_moe, glm_moe_dsa, glm5_next), and DeepSeek-V4.

Leading dense layers come from first_k_dense_replace / mlp_layer_types; the MTP layer at
index num_hidden_layers is not a decoder layer and is skipped by the reader.
"""

from __future__ import annotations

from typing import Any

from . import register
from .base import Family, mlp_layer_types_moe


@register
class DeepseekV3(Family):
    name = "deepseek_v3"
    model_types = ("deepseek_v3",)
    expert_count_keys = ("n_routed_experts",)

    def moe_layers(self, num_layers: int) -> list[int]:
        first = self.text.get("first_k_dense_replace") or 0
        freq = self.text.get("moe_layer_freq") or 1
        return [i for i in range(first, num_layers) if i % freq == 0]


@register
class Glm4Moe(DeepseekV3):
    name = "glm4_moe"
    model_types = ("glm4_moe",)


@register
class GlmMoeDsa(DeepseekV3):
    name = "glm_moe_dsa"
    model_types = ("glm_moe_dsa",)

    def moe_layers(self, num_layers: int) -> list[int]:
        return mlp_layer_types_moe(self.text, num_layers, self.text.get("first_k_dense_replace") or 0)


@register
class Glm5Next(GlmMoeDsa):
    name = "glm5_next"
    model_types = ("glm5_next", "glm5_next_text")
    layer_prefixes = ("model.language_model.layers.", "model.layers.")

    def moe_layers(self, num_layers: int) -> list[int]:
        # transformers defaults to three dense layers when mlp_layer_types is absent
        return mlp_layer_types_moe(self.text, num_layers, self.text.get("first_k_dense_replace", 3))


@register
class DeepseekV4(Family):
    """Native names `layers.L.ffn.experts.e.w1/w3/w2.{weight,scale}`, and transformers' `model.` ones."""

    name = "deepseek_v4"
    model_types = ("deepseek_v4",)
    layer_prefixes = ("layers.", "model.layers.")
    expert_blocks = ("ffn.experts", "mlp.experts")
    projections = (("w1", "w3", "w2"), ("gate_proj", "up_proj", "down_proj"))
    expert_count_keys = ("n_routed_experts",)

    def moe_layers(self, num_layers: int) -> list[int]:
        # every V4 layer routes (hash_moe layers too: only the router differs)
        return mlp_layer_types_moe(self.text, num_layers, 0)

    def options(self, fmt: str) -> dict[str, Any]:
        # how the GPU path scales each block of activations it quantizes to e4m3
        q = self.text.get("quantization_config")
        scale_fmt = q.get("scale_fmt") if isinstance(q, dict) else None
        return {"scale_fmt": scale_fmt} if fmt == "ds_fp4" and scale_fmt is not None else {}

    def extra(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        q = self.text.get("quantization_config")
        dt = self.text.get("expert_dtype") or (q.get("expert_dtype") if isinstance(q, dict) else None)
        if dt:
            out["expert_dtype"] = dt
        return out
