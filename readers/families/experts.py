"""Expert-bank machinery shared by every family: find a layer's expert tensors, detect its
format from suffixes and dtypes, check every name, dtype and shape, and describe the banks.

Nothing here reads tensor data: a BankSource's row function fetches zero-copy views of the
memory map when the writer asks for expert e, so planning a layer costs header lookups only.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Callable, Sequence

import numpy as np

from ftw.banks import BankSource, LayerBanks
from ftw.errors import SourceError, UnsupportedError
from ftw.formats import LayerFormat

from ..safetensors_index import SafetensorsIndex
from .base import Dims, ExpertGroup, Family

# per-expert suffixes that are activation calibration, not expert weights: dropped
IGNORED_SUFFIXES = {"input_scale", "input_global_scale", "activation_scale"}

ROLES = ("gate", "up", "down")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# -- finding the expert tensors -----------------------------------------------------------


def layer_pattern(family: Family) -> re.Pattern:
    prefixes = "|".join(re.escape(p) for p in family.layer_prefixes)
    blocks = "|".join(re.escape(b) for b in family.expert_blocks)
    return re.compile(rf"^((?:{prefixes})(\d+)\.(?:{blocks})\.)(.+)$")


def scan(family: Family, names: Sequence[str]) -> dict[int, ExpertGroup]:
    """Group expert tensor names by layer; a layer named two ways (two prefixes) is an error."""
    pat = layer_pattern(family)
    groups: dict[int, ExpertGroup] = {}
    for name in names:
        m = pat.match(name)
        if not m:
            continue
        base, layer, rest = m.group(1), int(m.group(2)), m.group(3)
        g = groups.setdefault(layer, ExpertGroup(layer, base, {}))
        if g.base != base:
            raise SourceError(f"layer {layer}: expert tensors under both {g.base!r} and {base!r}")
        g.names[rest] = name
    return groups


# -- checks -------------------------------------------------------------------------------


def expect(
    index: SafetensorsIndex,
    name: str,
    layer: int,
    dtypes: str | tuple[str, ...],
    shapes: tuple | list[tuple],
    why: str = "",
) -> None:
    info = index.info(name)
    dtypes = (dtypes,) if isinstance(dtypes, str) else dtypes
    shapes = shapes if isinstance(shapes, list) else [shapes]
    if info.dtype not in dtypes or info.shape not in [tuple(s) for s in shapes]:
        want = "/".join(dtypes) + " " + " or ".join(str(list(s)) for s in shapes)
        raise SourceError(
            f"layer {layer}: tensor {name!r} ({info.shard}) is {info.dtype} {list(info.shape)}, "
            f"expected {want}{why}"
        )


def views(index: SafetensorsIndex, names: list[list[str]]) -> Callable[[int], list[np.ndarray]]:
    return lambda e: [index.array(n) for n in names[e]]


# -- per-expert layers --------------------------------------------------------------------

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
    fmt, options, banks = build(names, dims, index, L, kind)
    return LayerBanks(L, LayerFormat.of(fmt, {**options, **family.options(fmt)}), banks)


def _parse_per_expert(family: Family, group: ExpertGroup, E: int):
    """{e: {role: {suffix: name}}} and the (gate, up, down) projection names in use."""
    proj_names = None
    table: dict[int, dict[str, dict[str, str]]] = {}
    for rest, name in sorted(group.names.items()):
        parts = rest.split(".", 2)
        if len(parts) != 3 or not parts[0].isdigit():
            raise SourceError(f"layer {group.layer}: unexpected expert tensor {name!r} next to per-expert tensors")
        e, proj, suffix = int(parts[0]), parts[1], parts[2]
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


def _io(dims: Dims, role: str) -> tuple[int, int]:
    return (dims.I, dims.H) if role != "down" else (dims.H, dims.I)


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
            expect(index, n, L, "bf16", _io(dims, r))
    gu, d = _pair(names, "weight")
    E, H, I = dims.E, dims.H, dims.I
    return "bf16", {}, {
        "gate_up": BankSource("bf16", (2 * I, H), E, views(index, gu)),
        "down": BankSource("bf16", (H, I), E, views(index, d)),
    }


def fit_block(pairs: list[tuple[int, int]]) -> int | None:
    """The block b with ceil(dim / b) == count for every (dim, count); 128 first: it is everyone's."""
    for b in [128] + [1 << k for k in range(13)]:
        if all(cdiv(dim, b) == count for dim, count in pairs):
            return b
    return None


def _block_size(index: SafetensorsIndex, names, dims: Dims, suffix: str, L: int) -> tuple[int, int]:
    """The block size that fits every projection's scale shape (scales, not config, are the truth)."""
    pairs = [(_io(dims, r), index.info(names[r][suffix][0]).shape) for r in ROLES]
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
        o, i = _io(dims, r)
        for n in names[r]["weight"]:
            expect(index, n, L, "f8_e4m3", (o, i))
        for n in names[r][suffix]:
            expect(index, n, L, "f32", (cdiv(o, bo), cdiv(i, bi)), " (float32 block scales)")
    gu, d = _pair(names, "weight")
    gus, ds = _pair(names, suffix)
    E, H, I = dims.E, dims.H, dims.I
    return "fp8_block", {"block_size": [bo, bi]}, {
        "gate_up": BankSource("f8_e4m3", (2 * I, H), E, views(index, gu)),
        "down": BankSource("f8_e4m3", (H, I), E, views(index, d)),
        "gate_up_scale": BankSource("f32", (2 * cdiv(I, bo), cdiv(H, bi)), E, views(index, gus)),
        "down_scale": BankSource("f32", (cdiv(H, bo), cdiv(I, bi)), E, views(index, ds)),
    }


def _scaled(names, dims, index, L, kind):
    """DeepSeek-V4 `.weight` + `.scale`: F8_E4M3 weights are block FP8, int8-packed ones FP4."""
    first = index.info(names["gate"]["weight"][0])
    if first.dtype == "f8_e4m3":
        return _fp8(names, dims, index, L, kind, suffix="scale")
    if first.dtype not in ("i8", "u8"):
        raise UnsupportedError(f"layer {L}: expert tensor {first.name!r} is {first.dtype}; expected I8 (packed FP4) or F8_E4M3")
    E, H, I = dims.E, dims.H, dims.I
    if H % 32 or I % 32:
        raise SourceError(f"layer {L}: FP4 experts need H and I multiples of 32 (H={H}, I={I})")
    for r in ROLES:
        o, i = _io(dims, r)
        for n in names[r]["weight"]:
            expect(index, n, L, ("i8", "u8"), (o, i // 2), " (two FP4 values per byte)")
        for n in names[r]["scale"]:
            expect(index, n, L, ("e8m0", "u8"), (o, i // 32), " (one E8M0 scale per 32)")
    gu, d = _pair(names, "weight")
    gus, ds = _pair(names, "scale")
    return "ds_fp4", {"act_block": 128}, {
        "gate_up": BankSource("i8", (2 * I, H // 2), E, views(index, gu)),
        "down": BankSource("i8", (H, I // 2), E, views(index, d)),
        "gate_up_scale": BankSource("e8m0", (2 * I, H // 32), E, views(index, gus)),
        "down_scale": BankSource("e8m0", (H, I // 32), E, views(index, ds)),
    }


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
    E, H, I = dims.E, dims.H, dims.I
    if H % 32 or I % 32:
        raise SourceError(f"layer {L}: MXFP8 experts need H and I multiples of 32 (H={H}, I={I})")
    for r in ROLES:
        o, i = _io(dims, r)
        for n in names[r]["weight"]:
            expect(index, n, L, "f8_e4m3", (o, i))
        for n in names[r]["weight_scale"]:
            expect(index, n, L, ("u8", "e8m0"), (o, i // 32), " (one E8M0 scale per 32)")
    gu, d = _pair(names, "weight")
    gus, ds = _pair(names, "weight_scale")
    return "mxfp8", {}, {
        "gate_up": BankSource("f8_e4m3", (2 * I, H), E, views(index, gu)),
        "down": BankSource("f8_e4m3", (H, I), E, views(index, d)),
        "gate_up_scale": BankSource("e8m0", (2 * I, H // 32), E, views(index, gus)),
        "down_scale": BankSource("e8m0", (H, I // 32), E, views(index, ds)),
    }


def _nvfp4(names, dims, index, L, kind):
    """ModelOpt and compressed-tensors NVFP4 -> one bank layout; the global becomes a per-row multiplier.

    compressed-tensors stores the global scale inverted (w = q * s / g); the bank stores
    float32(1.0 / float64(g)). That is the one lossy step of any reader: the reciprocal is
    rounded once to float32, a relative error of at most 2^-24 per global.
    """
    ct = kind == "nvfp4_ct"
    w_sfx, g_sfx = ("weight_packed", "weight_global_scale") if ct else ("weight", "weight_scale_2")
    E, H, I = dims.E, dims.H, dims.I
    if H % 16 or I % 16:
        raise SourceError(f"layer {L}: NVFP4 experts need H and I multiples of 16 (H={H}, I={I})")
    for r in ROLES:
        o, i = _io(dims, r)
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
        "gate_up": BankSource("u8", (2 * I, H // 2), E, views(index, gu)),
        "down": BankSource("u8", (H, I // 2), E, views(index, d)),
        "gate_up_scale": BankSource("f8_e4m3", (2 * I, H // 16), E, views(index, gus)),
        "down_scale": BankSource("f8_e4m3", (H, I // 16), E, views(index, ds)),
        "gate_up_global": BankSource("f32", (2 * I,), E, globals_of(("gate", "up"), (I, I))),
        "down_global": BankSource("f32", (H,), E, globals_of(("down",), (H,))),
    }


# -- stacked layers -----------------------------------------------------------------------


def stacked_views(index: SafetensorsIndex, name: str) -> Callable[[int], list[np.ndarray]]:
    return lambda e: [index.array(name)[e]]


def stacked(family: Family, group: ExpertGroup, dims: Dims, index: SafetensorsIndex) -> LayerBanks:
    custom = family.stacked(group, dims, index)
    if custom is None:
        if any(rest.startswith(("gate_proj.", "up_proj.", "down_proj.")) for rest in group.names):
            custom = _switch_mlp(group, dims, index)
        else:
            custom = _fused_bf16(group, dims, index)
    fmt, options, banks = custom
    return LayerBanks(group.layer, LayerFormat.of(fmt, {**options, **family.options(fmt)}), banks)


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
    return "bf16", {}, {
        "gate_up": BankSource("bf16", (2 * I, H), E, stacked_views(index, gu)),
        "down": BankSource("bf16", (H, I), E, stacked_views(index, d)),
    }


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
        "gate_up": BankSource("f8_e4m3", (2 * I, H), E, stacked_views(index, n["gate_up_proj"])),
        "down": BankSource("f8_e4m3", (H, I), E, stacked_views(index, n["down_proj"])),
        "gate_up_scale": BankSource("f32", (2 * I // bo, cdiv(H, bi)), E, stacked_views(index, n["gate_up_proj_scale_inv"])),
        "down_scale": BankSource("f32", (cdiv(H, bo), cdiv(I, bi)), E, stacked_views(index, n["down_proj_scale_inv"])),
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
    sfx = ("weight", "scales", "biases") if quant else ("weight",)
    check_names(group, [f"{p}.{s}" for p in projs for s in sfx])
    n = {(p, s): group.names[f"{p}.{s}"] for p in projs for s in sfx}
    if not quant:
        for p in projs:
            o, i = _io(dims, ROLES[projs.index(p)])
            expect(index, n[p, "weight"], L, "bf16", (E, o, i))
        return "bf16", {}, {
            "gate_up": BankSource("bf16", (2 * I, H), E, _stacked_pair(index, n["gate_proj", "weight"], n["up_proj", "weight"])),
            "down": BankSource("bf16", (H, I), E, stacked_views(index, n["down_proj", "weight"])),
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
        o, i = _io(dims, ROLES[projs.index(p)])
        expect(index, n[p, "weight"], L, "u32", (E, o, i * bits // 32), f" ({bits}-bit affine, as gate_proj)")
        expect(index, n[p, "scales"], L, sd, (E, o, i // gs), f" (group size {gs}, as gate_proj)")
        expect(index, n[p, "biases"], L, sd, (E, o, i // gs), f" (group size {gs}, as gate_proj)")

    def pair(s: str):
        return _stacked_pair(index, n["gate_proj", s], n["up_proj", s])

    return "affine", {"bits": bits, "group_size": gs}, {
        "gate_up": BankSource("u32", (2 * I, H * bits // 32), E, pair("weight")),
        "down": BankSource("u32", (H, I * bits // 32), E, stacked_views(index, n["down_proj", "weight"])),
        "gate_up_scale": BankSource(sd, (2 * I, H // gs), E, pair("scales")),
        "down_scale": BankSource(sd, (H, I // gs), E, stacked_views(index, n["down_proj", "scales"])),
        "gate_up_offset": BankSource(sd, (2 * I, H // gs), E, pair("biases")),
        "down_offset": BankSource(sd, (H, I // gs), E, stacked_views(index, n["down_proj", "biases"])),
    }


def _stacked_pair(index: SafetensorsIndex, gate: str, up: str) -> Callable[[int], list[np.ndarray]]:
    return lambda e: [index.array(gate)[e], index.array(up)[e]]


def check_names(group: ExpertGroup, need: Sequence[str], optional: Sequence[str] = ()) -> None:
    for k in need:
        if k not in group.names:
            raise SourceError(f"layer {group.layer}: missing expert tensor {group.base}{k}")
    for rest, name in sorted(group.names.items()):
        if rest not in need and rest not in optional:
            raise SourceError(f"layer {group.layer}: unexpected expert tensor {name!r} (expected {', '.join(need)})")


def layer_banks(family: Family, group: ExpertGroup, dims: Dims, index: SafetensorsIndex) -> LayerBanks:
    """Detect the layer's layout (stacked or per-expert) and resolve it; reads no tensor data."""
    per = any(rest.split(".", 1)[0].isdigit() for rest in group.names)
    if per:
        return per_expert(family, group, dims, index)
    return stacked(family, group, dims, index)
