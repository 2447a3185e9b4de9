"""Mixtral: `block_sparse_moe.experts.e.{w1,w3,w2}` on disk; transformers 5 stacks under `mlp.experts`."""

from __future__ import annotations

from . import register
from .base import Family


@register
class Mixtral(Family):
    name = "mixtral"
    model_types = ("mixtral",)
    expert_blocks = ("block_sparse_moe.experts", "mlp.experts", "block_sparse_moe.switch_mlp")
    projections = (("w1", "w3", "w2"), ("gate_proj", "up_proj", "down_proj"))
    expert_count_keys = ("num_local_experts",)
    width_keys = ("intermediate_size",)
