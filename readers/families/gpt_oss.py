"""gpt-oss: stacked experts only, gate/up interleaved on the output axis, expert biases.

MXFP4 (`*_blocks` + `*_scales` + `*_bias`) -> mxfp4; bf16 (`gate_up_proj` [E, H, 2I], i.e.
x @ W, interleaved) -> bf16 with biases. Both need a per-expert copy to undo the interleave
(and, for bf16, the transpose): the only readers that do not hand out views of the map.
"""

from __future__ import annotations

import numpy as np

from ftw.errors import SourceError, UnsupportedError
from ftw.formats import Activation

from . import register
from ..rows import transposed
from .base import Family
from .common import check_names, expect, stacked_views

ALPHA = 1.702  # fixed in gpt-oss's activation; the config does not carry it


def _deinterleave(index, name: str, last: bool = False):
    """Row e of a stacked tensor as [gate part, up part] copies (even entries gate, odd up)."""

    def row(e: int) -> list[np.ndarray]:
        # read with pread, not through the map: every byte is computed on, and a shard cut
        # short must be a SourceError, not a SIGBUS
        a = index.slab(name, e)
        if last:  # bf16 [H, 2I]: the interleave is on the last axis, and rows are transposed
            return [transposed(a[:, 0::2]), transposed(a[:, 1::2])]
        return [np.ascontiguousarray(a[0::2]), np.ascontiguousarray(a[1::2])]

    return row


@register
class GptOss(Family):
    name = "gpt_oss"
    model_types = ("gpt_oss",)
    expert_blocks = ("mlp.experts",)
    expert_count_keys = ("num_local_experts",)
    width_keys = ("intermediate_size",)

    def activation(self) -> Activation:
        return Activation("swiglu_oai", alpha=ALPHA, limit=self.swiglu_limit(7.0))

    def expected_first(self, base: str) -> str:
        return f"{base}gate_up_proj_blocks"

    def stacked(self, group, dims, index):
        E, H, I, L = dims.E, dims.H, dims.I, group.layer
        n = {k: f"{group.base}{k}" for k in group.names}
        if "gate_up_proj_blocks" in group.names:
            check_names(group, [f"{p}_{s}" for p in ("gate_up_proj", "down_proj") for s in ("blocks", "scales", "bias")])
            if H % 32 or I % 32:
                raise SourceError(f"layer {L}: MXFP4 experts need H and I multiples of 32 (H={H}, I={I})")
            expect(index, n["gate_up_proj_blocks"], L, "u8", (E, 2 * I, H // 32, 16))
            expect(index, n["gate_up_proj_scales"], L, ("u8", "e8m0"), (E, 2 * I, H // 32))
            expect(index, n["gate_up_proj_bias"], L, "bf16", (E, 2 * I))
            expect(index, n["down_proj_blocks"], L, "u8", (E, H, I // 32, 16))
            expect(index, n["down_proj_scales"], L, ("u8", "e8m0"), (E, H, I // 32))
            expect(index, n["down_proj_bias"], L, "bf16", (E, H))
            gub = _deinterleave(index, n["gate_up_proj_blocks"])
            down = n["down_proj_blocks"]
            return "mxfp4", {}, {
                "gate_up": lambda e: [p.reshape(I, H // 2) for p in gub(e)],
                "down": lambda e: [index.array(down)[e].reshape(H, I // 2)],
                "gate_up_scale": _deinterleave(index, n["gate_up_proj_scales"]),
                "down_scale": stacked_views(index, n["down_proj_scales"]),
                "gate_up_bias": _deinterleave(index, n["gate_up_proj_bias"]),
                "down_bias": stacked_views(index, n["down_proj_bias"]),
            }
        check_names(group, ["gate_up_proj", "down_proj"], ["gate_up_proj_bias", "down_proj_bias"])
        first = index.info(n["gate_up_proj"])
        if first.dtype != "bf16":
            raise UnsupportedError(f"layer {L}: stacked expert tensor {first.name!r} is {first.dtype}; expected bf16 or MXFP4")
        expect(index, n["gate_up_proj"], L, "bf16", (E, H, 2 * I), " ([E, H, 2I], gate/up interleaved)")
        expect(index, n["down_proj"], L, "bf16", (E, I, H), " ([E, I, H])")
        down = n["down_proj"]
        banks = {
            "gate_up": _deinterleave(index, n["gate_up_proj"], last=True),
            "down": lambda e: [transposed(index.slab(down, e))],
        }
        if "gate_up_proj_bias" in n or "down_proj_bias" in n:
            check_names(group, ["gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias"])
            expect(index, n["gate_up_proj_bias"], L, "bf16", (E, 2 * I))
            expect(index, n["down_proj_bias"], L, "bf16", (E, H))
            banks["gate_up_bias"] = _deinterleave(index, n["gate_up_proj_bias"])
            banks["down_bias"] = stacked_views(index, n["down_proj_bias"])
        return "bf16", {}, banks
