"""Per-expert layers (one tensor per expert and projection): the format comes from the
projections' tensor suffixes, and dtypes decide between look-alikes."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ftw.banks import LayerBanks
from ftw.errors import SourceError, UnsupportedError
from ftw.spec import decimal_index

from ..safetensors_index import SafetensorsIndex
from . import reference
from .base import Dims, ExpertGroup, Family, short
from .common import ROLES, cdiv, expect, fit_block, io_dims, make_layer, views

# per-expert suffixes that are activation calibration, not expert weights: dropped
IGNORED_SUFFIXES = {"input_scale", "input_global_scale", "activation_scale"}


# the tensor suffixes of one projection -> a source format; dtypes decide between look-alikes
SIGNATURES = {
    frozenset({"weight"}): "plain",
    frozenset({"weight", "weight_scale_inv"}): "fp8_block",
    frozenset({"weight", "scale"}): "scaled",  # deepseek_v4: fp8 block or int8-packed fp4
    frozenset({"weight", "weight_scale"}): "ct_fp8",  # compressed-tensors: fp8 block or mxfp8
    frozenset({"weight", "weight_scale", "weight_scale_2"}): "nvfp4_modelopt",
    frozenset({"weight_packed", "weight_scale", "weight_global_scale"}): "nvfp4_ct",
}


def per_expert(family: Family, group: ExpertGroup, dims: Dims, index: SafetensorsIndex) -> LayerBanks:
    L, E = group.layer, dims.E
    table, proj_names = _parse_per_expert(family, group, E)
    counts = Counter(frozenset(s) for per in table.values() for s in per.values())
    sig = counts.most_common(1)[0][0]
    kind = SIGNATURES.get(sig)
    if kind is None:
        some = next(n for n in group.names.values())
        raise UnsupportedError(
            f"layer {L}: expert tensors with suffixes {sorted(sig)} (e.g. {some!r}) are not a known format"
        )
    names: dict[str, dict[str, list[str]]] = {r: {s: [] for s in sig} for r in ROLES}
    for e in range(E):
        for r, proj in zip(ROLES, proj_names):
            have = table.get(e, {}).get(r, {})
            for s in sorted(sig):
                if s not in have:
                    raise SourceError(f"layer {L}: missing expert tensor {group.base}{e}.{proj}.{s!s} ({kind} layer)")
                names[r][s].append(have[s])
            for s in have:
                if s not in sig:
                    raise SourceError(
                        f"layer {L}: unexpected expert tensor {have[s]!r} (the layer's experts have {sorted(sig)})"
                    )
    build = {
        "plain": _plain,
        "fp8_block": _fp8,
        "scaled": _scaled,
        "ct_fp8": _ct_fp8,
        "nvfp4_modelopt": _nvfp4,
        "nvfp4_ct": _nvfp4,
    }[kind]
    lb = make_layer(family, L, dims, *build(names, dims, index, L, kind))
    lb.reference = reference.per_expert(kind, names, index)
    return lb


def _parse_per_expert(family: Family, group: ExpertGroup, E: int):
    """{e: {role: {suffix: name}}} and the (gate, up, down) projection names in use."""
    proj_names = None
    table: dict[int, dict[str, dict[str, str]]] = {}
    for rest, name in sorted(group.names.items()):
        parts = rest.split(".", 2)
        if len(parts) != 3 or not parts[0].isdigit():
            raise SourceError(f"layer {group.layer}: unexpected expert tensor {name!r} next to per-expert tensors")
        e, proj, suffix = decimal_index(parts[0]), parts[1], parts[2]
        if e is None:  # '00' next to '0', or an Arabic-Indic digit, would name one expert twice
            raise SourceError(f"layer {group.layer}: expert tensor {short(name)}: expert number "
                              f"{short(parts[0])} is not canonical decimal (ASCII digits, no leading zeros)")
        if proj_names is None:
            proj_names = next((p for p in family.projections if proj in p), None)
        if proj_names is None or proj not in proj_names:
            raise SourceError(f"layer {group.layer}: unexpected expert tensor {name!r} (unknown projection {proj!r})")
        if e >= E:
            raise SourceError(f"layer {group.layer}: unexpected expert tensor {name!r}: config has {E} experts")
        if suffix in IGNORED_SUFFIXES:
            continue
        table.setdefault(e, {}).setdefault(ROLES[proj_names.index(proj)], {})[suffix] = name
    if not table:
        raise SourceError(f"layer {group.layer}: no expert weights under {group.base!r}")
    return table, proj_names


def _pair(names: dict[str, dict[str, list[str]]], suffix: str) -> tuple[list[list[str]], list[list[str]]]:
    """Row names: gate_up = [gate_e, up_e] per expert; down = [down_e]."""
    gu = [list(p) for p in zip(names["gate"][suffix], names["up"][suffix])]
    return gu, [[n] for n in names["down"][suffix]]


def _plain(names, dims, index, L, kind):
    for r in ROLES:
        first = index.info(names[r]["weight"][0])
        if first.dtype != "bf16":
            raise UnsupportedError(
                f"layer {L}: expert tensor {first.name!r} is {first.dtype}; unscaled experts must be bf16"
            )
        for n in names[r]["weight"]:
            expect(index, n, L, "bf16", io_dims(dims, r))
    gu, d = _pair(names, "weight")
    return "bf16", {}, {"gate_up": views(index, gu), "down": views(index, d)}


def _block_size(index: SafetensorsIndex, names, dims: Dims, suffix: str, L: int) -> tuple[int, int]:
    """The block size that fits every projection's scale shape (scales, not config, are the truth)."""
    pairs = [(io_dims(dims, r), index.info(names[r][suffix][0]).shape) for r in ROLES]
    out = []
    for axis in (0, 1):
        b = fit_block([(io[axis], s[axis]) for io, s in pairs]) if all(len(s) == 2 for _, s in pairs) else None
        if b is None:
            raise SourceError(
                f"layer {L}: block scale {names['gate'][suffix][0]!r} has shape "
                f"{list(pairs[0][1])}: no block size fits the weight shape {list(pairs[0][0])}"
            )
        out.append(b)
    return out[0], out[1]


def _fp8(names, dims, index, L, kind, suffix="weight_scale_inv"):
    bo, bi = _block_size(index, names, dims, suffix, L)
    for r in ROLES:
        o, i = io_dims(dims, r)
        for n in names[r]["weight"]:
            expect(index, n, L, "f8_e4m3", (o, i))
        for n in names[r][suffix]:
            expect(index, n, L, "f32", (cdiv(o, bo), cdiv(i, bi)), " (float32 block scales)")
    gu, d = _pair(names, "weight")
    gus, ds = _pair(names, suffix)
    return "fp8_block", {"block_size": [bo, bi]}, {
        "gate_up": views(index, gu), "down": views(index, d),
        "gate_up_scale": views(index, gus), "down_scale": views(index, ds),
    }


def _scaled(names, dims, index, L, kind):
    """DeepSeek-V4 `.weight` + `.scale`: F8_E4M3 weights are block FP8, int8-packed ones FP4."""
    first = index.info(names["gate"]["weight"][0])
    if first.dtype == "f8_e4m3":
        return _fp8(names, dims, index, L, kind, suffix="scale")
    if first.dtype not in ("i8", "u8"):
        raise UnsupportedError(f"layer {L}: expert tensor {first.name!r} is {first.dtype}; expected I8 (packed FP4) or F8_E4M3")
    return "ds_fp4", {"act_block": 128}, _e8m0_per32(
        names, dims, index, L, what="FP4", weight_dtypes=("i8", "u8"), values_per_byte=2, scale="scale"
    )


def _e8m0_per32(names, dims, index, L, *, what, weight_dtypes, values_per_byte, scale):
    """Experts with one E8M0 scale per 32 inputs (DeepSeek-V4 FP4, MXFP8): checks, then banks."""
    H, I = dims.H, dims.I
    if H % 32 or I % 32:
        raise SourceError(f"layer {L}: {what} experts need H and I multiples of 32 (H={H}, I={I})")
    why = " (two FP4 values per byte)" if values_per_byte == 2 else ""
    for r in ROLES:
        o, i = io_dims(dims, r)
        for n in names[r]["weight"]:
            expect(index, n, L, weight_dtypes, (o, i // values_per_byte), why)
        for n in names[r][scale]:
            expect(index, n, L, ("e8m0", "u8"), (o, i // 32), " (one E8M0 scale per 32)")
    gu, d = _pair(names, "weight")
    gus, ds = _pair(names, scale)
    return {"gate_up": views(index, gu), "down": views(index, d), "gate_up_scale": views(index, gus),
            "down_scale": views(index, ds)}


def _ct_fp8(names, dims, index, L, kind):
    """compressed-tensors e4m3 weights with `weight_scale`: per-32 E8M0 bytes (mxfp8) or 2-D block scales."""
    w, sc = index.info(names["gate"]["weight"][0]), index.info(names["gate"]["weight_scale"][0])
    if w.dtype != "f8_e4m3":
        raise UnsupportedError(f"layer {L}: expert tensor {w.name!r} is {w.dtype}; expected F8_E4M3 next to weight_scale")
    if sc.dtype == "f32":  # block scales; a per-channel [out, 1] one is the block (1, >= in)
        return _fp8(names, dims, index, L, kind, suffix="weight_scale")
    if sc.dtype not in ("u8", "e8m0"):
        raise UnsupportedError(
            f"layer {L}: expert tensor {sc.name!r} is {sc.dtype} {list(sc.shape)}; ftw reads FP8 experts with "
            f"float32 block scales or E8M0 per-32 scales (per-tensor/per-channel FP8 is not handled)"
        )
    return "mxfp8", {}, _e8m0_per32(
        names, dims, index, L, what="MXFP8", weight_dtypes="f8_e4m3", values_per_byte=1, scale="weight_scale"
    )


def _nvfp4(names, dims, index, L, kind):
    """ModelOpt and compressed-tensors NVFP4 -> one bank layout; the global becomes a per-row multiplier.

    compressed-tensors stores the global scale inverted (w = q * s / g); the bank stores
    float32(1.0 / float64(g)). That is the one lossy step of any reader: the reciprocal is
    rounded once to float32, a relative error of at most 2^-24 per global.
    """
    ct = kind == "nvfp4_ct"
    w_sfx, g_sfx = ("weight_packed", "weight_global_scale") if ct else ("weight", "weight_scale_2")
    H, I = dims.H, dims.I
    if H % 16 or I % 16:
        raise SourceError(f"layer {L}: NVFP4 experts need H and I multiples of 16 (H={H}, I={I})")
    for r in ROLES:
        o, i = io_dims(dims, r)
        for n in names[r][w_sfx]:
            expect(index, n, L, "u8", (o, i // 2), " (two FP4 values per byte)")
        for n in names[r]["weight_scale"]:
            expect(index, n, L, "f8_e4m3", (o, i // 16), " (one E4M3 scale per 16)")
        for n in names[r][g_sfx]:
            expect(index, n, L, "f32", [(), (1,)], " (a float32 global scale)")

    def multiplier(name: str) -> np.float32:
        g = index.array(name).reshape(-1)[0]
        return np.float32(1.0 / np.float64(g)) if ct else np.float32(g)

    def globals_of(roles: tuple[str, ...], rows: tuple[int, ...]):
        return lambda e: [np.full(n, multiplier(names[r][g_sfx][e]), dtype=np.float32) for r, n in zip(roles, rows)]

    gu, d = _pair(names, w_sfx)
    gus, ds = _pair(names, "weight_scale")
    return "nvfp4", {}, {
        "gate_up": views(index, gu), "down": views(index, d),
        "gate_up_scale": views(index, gus), "down_scale": views(index, ds),
        "gate_up_global": globals_of(("gate", "up"), (I, I)), "down_global": globals_of(("down",), (H,)),
    }
