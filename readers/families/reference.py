"""The source's own projections of one expert, for `ftw check`'s independent reference.

The bank builders (per_expert.py, stacked.py, families' hooks) re-lay the source into banks:
fuse gate and up, undo gpt-oss's interleave and transpose, pair scales and globals with rows.
A mistake there is invisible to a check that decodes the banks twice. Here each projection
(gate, up, down) is taken separately, straight from the tensors as the checkpoint names and
lays them out (LAYOUTS.md), with no code shared with the builders; the format's
`decode_projection` then decodes it. `ftw check` compares that with the decoded FTW rows.

A reference is `expert -> {"gate": parts, "up": parts, "down": parts[, "gate_bias", "up_bias",
"down_bias"]}` where parts is {"weight", "scale", "global" | "global_inverse", "offset"}.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..safetensors_index import SafetensorsIndex
from .base import ExpertGroup

Reference = Callable[[int], dict]

# per-expert tensor suffix -> part, per source kind (per_expert.SIGNATURES)
PER_EXPERT_PARTS = {
    "plain": {"weight": "weight"},
    "fp8_block": {"weight": "weight", "weight_scale_inv": "scale"},
    "scaled": {"weight": "weight", "scale": "scale"},
    "ct_fp8": {"weight": "weight", "weight_scale": "scale"},
    "nvfp4_modelopt": {"weight": "weight", "weight_scale": "scale", "weight_scale_2": "global"},
    "nvfp4_ct": {"weight_packed": "weight", "weight_scale": "scale", "weight_global_scale": "global_inverse"},
}


def per_expert(kind: str, names: dict[str, dict[str, list[str]]], index: SafetensorsIndex) -> Reference:
    """names[role][suffix][e] is expert e's tensor of that projection."""
    parts = PER_EXPERT_PARTS[kind]

    def ref(e: int) -> dict:
        return {role: {parts[sfx]: index.array(per[sfx][e]) for sfx in per} for role, per in names.items()}

    return ref


def stacked(family: str, group: ExpertGroup, I: int, index: SafetensorsIndex) -> Reference:  # noqa: E741
    """[E, ...] tensors: transformers' fused experts, mlx-lm's switch_mlp, gpt-oss's layouts."""
    n = group.names
    full = {k: group.base + k for k in n}

    def a(key: str) -> np.ndarray:
        return index.array(full[key])

    if "gate_up_proj_blocks" in n:  # gpt-oss MXFP4: rows interleaved, even = gate, odd = up
        def ref(e: int) -> dict:
            blocks, scales, bias = a("gate_up_proj_blocks")[e], a("gate_up_proj_scales")[e], a("gate_up_proj_bias")[e]
            return {
                "gate": {"weight": blocks[0::2], "scale": scales[0::2]},
                "up": {"weight": blocks[1::2], "scale": scales[1::2]},
                "down": {"weight": a("down_proj_blocks")[e], "scale": a("down_proj_scales")[e]},
                "gate_bias": bias[0::2], "up_bias": bias[1::2], "down_bias": a("down_proj_bias")[e],
            }
        return ref

    if family == "gpt_oss":  # bf16 [E, H, 2I] used as x @ W, interleaved on the last axis
        def ref(e: int) -> dict:
            w = a("gate_up_proj")[e]
            out = {"gate": {"weight": w[:, 0::2].T}, "up": {"weight": w[:, 1::2].T},
                   "down": {"weight": a("down_proj")[e].T}}
            if "gate_up_proj_bias" in n:
                b = a("gate_up_proj_bias")[e]
                out.update(gate_bias=b[0::2], up_bias=b[1::2], down_bias=a("down_proj_bias")[e])
            return out
        return ref

    if "gate_up_proj" in n:  # transformers' fused: rows [0, I) gate, [I, 2I) up; FP8 scales likewise
        def ref(e: int) -> dict:
            w = a("gate_up_proj")[e]
            out = {"gate": {"weight": w[:I]}, "up": {"weight": w[I:]}, "down": {"weight": a("down_proj")[e]}}
            if "gate_up_proj_scale_inv" in n:
                s = a("gate_up_proj_scale_inv")[e]
                half = s.shape[0] // 2
                out["gate"]["scale"], out["up"]["scale"] = s[:half], s[half:]
                out["down"]["scale"] = a("down_proj_scale_inv")[e]
            return out
        return ref

    # mlx-lm switch_mlp: {gate,up,down}_proj.{weight[,scales,biases]}; MLX "biases" are the offsets
    parts = {"weight": "weight", "scales": "scale", "biases": "offset"}

    def ref(e: int) -> dict:
        return {role: {parts[s]: a(f"{role}_proj.{s}")[e] for s in parts if f"{role}_proj.{s}" in n}
                for role in ("gate", "up", "down")}

    return ref
