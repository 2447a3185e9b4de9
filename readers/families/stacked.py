"""Stacked layers ([E, ...] tensors): transformers' fused experts (bf16, FP8) and mlx-lm's
`switch_mlp` (affine-quantized or bf16). Families with odd stacked layouts (gpt-oss) hook in
through ``Family.stacked``."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ftw.banks import LayerBanks
from ftw.errors import SourceError, UnsupportedError

from ..safetensors_index import SafetensorsIndex
from . import reference
from .base import Dims, ExpertGroup, Family
from .common import ROLES, cdiv, check_names, expect, fit_block, io_dims, make_layer, stacked_views


def stacked(family: Family, group: ExpertGroup, dims: Dims, index: SafetensorsIndex) -> LayerBanks:
    custom = family.stacked(group, dims, index)
    if custom is None:
        if any(rest.startswith(("gate_proj.", "up_proj.", "down_proj.")) for rest in group.names):
            custom = _switch_mlp(group, dims, index)
        else:
            custom = _fused_bf16(group, dims, index)
    lb = make_layer(family, group.layer, dims, *custom)
    lb.reference = reference.stacked(family.name, group, dims.I, index)
    return lb


def _fused_bf16(group: ExpertGroup, dims: Dims, index: SafetensorsIndex):
    """transformers 5's fused experts: gate_up_proj [E, 2I, H] (gate rows, then up rows), down_proj [E, H, I].

    Its FP8 form adds `*_scale_inv` [E, ceil(2I/bo), ceil(H/bi)]: gate's blocks then up's,
    which is the canonical fused scale exactly when I is a multiple of the block.
    """
    L, E, H, I = group.layer, dims.E, dims.H, dims.I
    gu, d = group.names.get("gate_up_proj"), group.names.get("down_proj")
    first = index.info(gu) if gu else None
    if first is not None and first.dtype == "f8_e4m3":
        return _fused_fp8(group, dims, index)
    check_names(group, ("gate_up_proj", "down_proj"))
    if first.dtype != "bf16":
        raise UnsupportedError(f"layer {L}: stacked expert tensor {gu!r} is {first.dtype}; stacked experts must be bf16 or F8_E4M3")
    expect(index, gu, L, "bf16", (E, 2 * I, H), " ([E, 2I, H]: gate rows then up rows)")
    expect(index, d, L, "bf16", (E, H, I), " ([E, H, I])")
    return "bf16", {}, {"gate_up": stacked_views(index, gu), "down": stacked_views(index, d)}


def _fused_fp8(group: ExpertGroup, dims: Dims, index: SafetensorsIndex):
    L, E, H, I = group.layer, dims.E, dims.H, dims.I
    keys = ("gate_up_proj", "gate_up_proj_scale_inv", "down_proj", "down_proj_scale_inv")
    check_names(group, keys)
    n = {k: group.names[k] for k in keys}
    ds = index.info(n["down_proj_scale_inv"]).shape
    if len(ds) != 3 or not ds[1] or not ds[2]:
        raise SourceError(f"layer {L}: {n['down_proj_scale_inv']!r} has shape {list(ds)}, expected [E, H/bo, I/bi]")
    bo, bi = fit_block([(H, ds[1])]), fit_block([(I, ds[2])])
    if bo is None or bi is None:
        raise SourceError(f"layer {L}: {n['down_proj_scale_inv']!r} has shape {list(ds)}: no block size fits H={H}, I={I}")
    if I % bo:
        raise UnsupportedError(
            f"layer {L}: fused FP8 scale {n['gate_up_proj_scale_inv']!r} mixes gate and up rows in one block "
            f"(I={I} is not a multiple of the block {bo})"
        )
    expect(index, n["gate_up_proj"], L, "f8_e4m3", (E, 2 * I, H))
    expect(index, n["down_proj"], L, "f8_e4m3", (E, H, I))
    expect(index, n["gate_up_proj_scale_inv"], L, "f32", (E, 2 * I // bo, cdiv(H, bi)), f" (block {bo}x{bi})")
    expect(index, n["down_proj_scale_inv"], L, "f32", (E, cdiv(H, bo), cdiv(I, bi)), f" (block {bo}x{bi})")
    return "fp8_block", {"block_size": [bo, bi]}, {
        "gate_up": stacked_views(index, n["gate_up_proj"]), "down": stacked_views(index, n["down_proj"]),
        "gate_up_scale": stacked_views(index, n["gate_up_proj_scale_inv"]),
        "down_scale": stacked_views(index, n["down_proj_scale_inv"]),
    }


def _switch_mlp(group: ExpertGroup, dims: Dims, index: SafetensorsIndex):
    """MLX `switch_mlp.{gate,up,down}_proj.{weight[,scales,biases]}`, each [E, out, ...].

    Quantized: weight u32 [E, out, in*bits/32] (an LSB-first bit stream per row), scales and
    biases [E, out, in/group_size] in the model dtype -> `affine` (w = scale * q + offset;
    MLX's "biases" become the offset banks). Unquantized bf16 -> `bf16`.
    """
    L, E, H, I = group.layer, dims.E, dims.H, dims.I
    projs = ("gate_proj", "up_proj", "down_proj")
    quant = "gate_proj.scales" in group.names
    if quant and "gate_proj.biases" not in group.names:
        return _switch_mlp_mx(group, dims, index)
    sfx = ("weight", "scales", "biases") if quant else ("weight",)
    check_names(group, [f"{p}.{s}" for p in projs for s in sfx])
    n = {(p, s): group.names[f"{p}.{s}"] for p in projs for s in sfx}
    if not quant:
        for p in projs:
            o, i = io_dims(dims, ROLES[projs.index(p)])
            expect(index, n[p, "weight"], L, "bf16", (E, o, i))
        return "bf16", {}, {
            "gate_up": _stacked_pair(index, n["gate_proj", "weight"], n["up_proj", "weight"]),
            "down": stacked_views(index, n["down_proj", "weight"]),
        }
    w0, s0 = index.info(n["gate_proj", "weight"]), index.info(n["gate_proj", "scales"])
    if w0.dtype != "u32" or len(w0.shape) != 3 or len(s0.shape) != 3 or s0.dtype not in ("bf16", "f16", "f32"):
        raise UnsupportedError(f"layer {L}: {w0.name!r} is {w0.dtype} {list(w0.shape)}; expected MLX affine u32 [E, out, packed]")
    bits, rem = divmod(w0.shape[2] * 32, H)
    gs = H // s0.shape[2] if s0.shape[2] else 0
    if rem or bits not in (2, 3, 4, 5, 6, 8) or not gs or H % gs or I % gs or (I * bits) % 32:
        raise UnsupportedError(f"layer {L}: {w0.name!r} {list(w0.shape)} with scales {list(s0.shape)} is not an MLX affine layout this reader handles")
    sd = s0.dtype
    for p in projs:
        o, i = io_dims(dims, ROLES[projs.index(p)])
        expect(index, n[p, "weight"], L, "u32", (E, o, i * bits // 32), f" ({bits}-bit affine, as gate_proj)")
        expect(index, n[p, "scales"], L, sd, (E, o, i // gs), f" (group size {gs}, as gate_proj)")
        expect(index, n[p, "biases"], L, sd, (E, o, i // gs), f" (group size {gs}, as gate_proj)")

    def pair(s: str):
        return _stacked_pair(index, n["gate_proj", s], n["up_proj", s])

    rows = {
        "gate_up": pair("weight"), "down": stacked_views(index, n["down_proj", "weight"]),
        "gate_up_scale": pair("scales"), "down_scale": stacked_views(index, n["down_proj", "scales"]),
        "gate_up_offset": pair("biases"), "down_offset": stacked_views(index, n["down_proj", "biases"]),
    }
    return "affine", {"bits": bits, "group_size": gs}, rows, {k: sd for k in rows if k.endswith(("_scale", "_offset"))}


def _switch_mlp_mx(group: ExpertGroup, dims: Dims, index: SafetensorsIndex):
    """MLX's microscaled switch_mlp (`mode="mxfp8"`): weight u32 [E, out, in/4], four e4m3 bytes
    per word in element order (little-endian), scales u8 E8M0 [E, out, in/32], no biases ->
    `mxfp8`; the words' bytes are the bank's rows as they are. MLX's mxfp4/nvfp4 modes (8
    values per word) have no ftw format yet."""
    L, E, H, I = group.layer, dims.E, dims.H, dims.I
    projs = ("gate_proj", "up_proj", "down_proj")
    check_names(group, [f"{p}.{s}" for p in projs for s in ("weight", "scales")])
    n = {(p, s): group.names[f"{p}.{s}"] for p in projs for s in ("weight", "scales")}
    w0, s0 = index.info(n["gate_proj", "weight"]), index.info(n["gate_proj", "scales"])
    if w0.dtype != "u32" or s0.dtype not in ("u8", "e8m0") or len(w0.shape) != 3 or w0.shape[2] * 4 != H:
        raise UnsupportedError(f"layer {L}: {w0.name!r} is {w0.dtype} {list(w0.shape)} with {s0.dtype} scales and no "
                               f"biases; ftw reads MLX's mxfp8 mode (u32 [E, out, in/4], u8 scales per 32)")
    if H % 32 or I % 32:
        raise SourceError(f"layer {L}: MLX mxfp8 experts need H and I multiples of 32 (H={H}, I={I})")
    for p in projs:
        o, i = io_dims(dims, ROLES[projs.index(p)])
        expect(index, n[p, "weight"], L, "u32", (E, o, i // 4), " (MLX mxfp8: four e4m3 bytes per word)")
        expect(index, n[p, "scales"], L, ("u8", "e8m0"), (E, o, i // 32), " (one E8M0 scale per 32)")

    def pair(s: str):
        return _stacked_pair(index, n["gate_proj", s], n["up_proj", s])

    return "mxfp8", {}, {"gate_up": pair("weight"), "down": stacked_views(index, n["down_proj", "weight"]),
                         "gate_up_scale": pair("scales"), "down_scale": stacked_views(index, n["down_proj", "scales"])}


def _stacked_pair(index: SafetensorsIndex, gate: str, up: str) -> Callable[[int], list[np.ndarray]]:
    return lambda e: [index.array(gate)[e], index.array(up)[e]]
