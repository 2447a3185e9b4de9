"""Tiny safetensors checkpoints written by hand, and float64 references from LAYOUTS.md.

The references decode with torch's own float8/bfloat16 casts and the E2M1 table, so they
share no code with ftw.dequant or the readers. Data is fresh random bytes every call.
"""

from __future__ import annotations

import json
import os
from math import ceil

import numpy as np

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])

# the ftw dtype of each safetensors dtype, for numpy arrays built here
NP = {"BF16": np.uint16, "F32": np.float32, "F8_E4M3": np.uint8, "F8_E8M0": np.uint8, "U8": np.uint8, "I8": np.int8}


def save(path: str, tensors: dict[str, tuple[str, np.ndarray]], pad: int = 8) -> None:
    """A safetensors file with any dtype spelling (the library cannot write F8_E8M0 from numpy)."""
    header, blobs, off = {}, [], 0
    for name, (st, arr) in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": st, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % pad)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def save_sharded(folder: str, tensors: dict, nshards: int, index: bool = True) -> list[str]:
    """Split tensors over shards in order; write model.safetensors.index.json when asked."""
    names = list(tensors)
    per = ceil(len(names) / nshards)
    files, weight_map = [], {}
    for s in range(nshards):
        chunk = names[s * per : (s + 1) * per]
        fn = f"model-{s + 1:05d}-of-{nshards:05d}.safetensors"
        save(os.path.join(folder, fn), {n: tensors[n] for n in chunk})
        weight_map.update({n: fn for n in chunk})
        files.append(fn)
    if index:
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return files


def write_ckpt(folder: str, config: dict, tensors: dict, nshards: int = 1, extra_files: dict | None = None) -> str:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    for name, data in (extra_files or {}).items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(data)
    if nshards == 1:
        save(os.path.join(folder, "model.safetensors"), tensors)
    else:
        save_sharded(folder, tensors, nshards)
    return folder


# -- random source data -------------------------------------------------------------------


def rand_bf16(rng, shape):
    return (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def rand_e4m3(rng, shape, positive=False):
    b = rng.integers(0, 256, size=shape, dtype=np.uint8)
    b[(b & 0x7F) == 0x7F] = 0x3F  # no NaN
    if positive:
        b &= 0x7F
        b[b == 0] = 0x38
    return b


def rand_f32(rng, shape, lo=0.5, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def rand_bytes(rng, shape, dtype=np.uint8):
    return rng.integers(0, 256, size=shape, dtype=np.uint8).view(dtype)


def rand_e8m0(rng, shape):
    return rng.integers(110, 140, size=shape, dtype=np.uint8)


# -- references (LAYOUTS.md formulas), float64 --------------------------------------------


def torch_decode(arr, torch_dtype: str) -> np.ndarray:
    import torch

    t = torch.from_numpy(np.ascontiguousarray(arr).view(np.uint8).copy())
    return t.view(getattr(torch, torch_dtype)).to(torch.float64).numpy().reshape(arr.shape)


def dec_bf16(u16):
    return torch_decode(np.asarray(u16, dtype=np.uint16), "bfloat16")


def dec_e4m3(b):
    return torch_decode(np.asarray(b, dtype=np.uint8), "float8_e4m3fn")


def dec_fp4(packed):
    b = np.asarray(packed).view(np.uint8)
    out = np.empty(b.shape[:-1] + (2 * b.shape[-1],))
    out[..., 0::2] = E2M1[b & 0xF]
    out[..., 1::2] = E2M1[b >> 4]
    return out


def group(scale, cols):
    return np.repeat(scale, cols // scale.shape[-1], axis=-1)


# per-projection source tensors and references: fmt -> (tensors of one projection, decode)


def projection(rng, fmt: str, out: int, inp: int, block=(128, 128)):
    """{suffix: (st_dtype, array)} for one [out, in] projection, and its float64 value."""
    if fmt == "bf16":
        w = rand_bf16(rng, (out, inp))
        return {"weight": ("BF16", w)}, dec_bf16(w)
    if fmt in ("fp8_block", "fp8_v4"):
        bo, bi = block
        w = rand_e4m3(rng, (out, inp))
        s = rand_f32(rng, (ceil(out / bo), ceil(inp / bi)))
        ref = dec_e4m3(w) * s.astype(np.float64)[np.arange(out) // bo][:, np.arange(inp) // bi]
        return {"weight": ("F8_E4M3", w), ("scale" if fmt == "fp8_v4" else "weight_scale_inv"): ("F32", s)}, ref
    if fmt == "nvfp4_modelopt":
        w, s, g = rand_bytes(rng, (out, inp // 2)), rand_e4m3(rng, (out, inp // 16), True), rand_f32(rng, ())
        ref = dec_fp4(w) * group(dec_e4m3(s), inp) * np.float64(g)
        t = {"weight": ("U8", w), "weight_scale": ("F8_E4M3", s), "weight_scale_2": ("F32", g)}
        t["input_scale"] = ("F32", rand_f32(rng, ()))
        return t, ref
    if fmt == "nvfp4_ct":
        w, s, g = rand_bytes(rng, (out, inp // 2)), rand_e4m3(rng, (out, inp // 16), True), rand_f32(rng, (1,), 100, 3000)
        ref = dec_fp4(w) * group(dec_e4m3(s), inp) / np.float64(g[0])
        return {"weight_packed": ("U8", w), "weight_scale": ("F8_E4M3", s), "weight_global_scale": ("F32", g)}, ref
    if fmt == "fp8_ct":  # compressed-tensors block FP8: `weight_scale`, not `weight_scale_inv`
        t, ref = projection(rng, "fp8_block", out, inp, block)
        return {"weight": t["weight"], "weight_scale": t["weight_scale_inv"]}, ref
    if fmt == "mxfp8":
        w, s = rand_e4m3(rng, (out, inp)), rand_e8m0(rng, (out, inp // 32))
        return {"weight": ("F8_E4M3", w), "weight_scale": ("U8", s)}, dec_e4m3(w) * group(np.exp2(s.astype(np.float64) - 127), inp)
    if fmt == "ds_fp4":
        w, s = rand_bytes(rng, (out, inp // 2), np.int8), rand_e8m0(rng, (out, inp // 32))
        ref = dec_fp4(w) * group(np.exp2(s.astype(np.float64) - 127), inp)
        return {"weight": ("I8", w), "scale": ("F8_E8M0", s)}, ref
    raise ValueError(fmt)


CANON = {"bf16": "bf16", "fp8_block": "fp8_block", "fp8_v4": "fp8_block", "fp8_ct": "fp8_block", "mxfp8": "mxfp8",
         "nvfp4_modelopt": "nvfp4",
         "nvfp4_ct": "nvfp4", "ds_fp4": "ds_fp4"}


def per_expert_layer(rng, base, fmt, E, H, I, proj=("gate_proj", "up_proj", "down_proj")):
    """Tensors of one per-expert MoE layer and, per expert, {'gate','up','down'} references plus sources."""
    tensors, refs = {}, []
    for e in range(E):
        ref = {}
        for role, p, (o, i) in zip(("gate", "up", "down"), proj, ((I, H), (I, H), (H, I))):
            t, r = projection(rng, fmt, o, i)
            ref[role] = r
            ref[role + "_src"] = {k: v[1] for k, v in t.items()}
            for sfx, v in t.items():
                tensors[f"{base}{e}.{p}.{sfx}"] = v
        refs.append(ref)
    return tensors, refs


def stacked_bf16_layer(rng, base, E, H, I):
    gu, d = rand_bf16(rng, (E, 2 * I, H)), rand_bf16(rng, (E, H, I))
    refs = [{"gate": dec_bf16(gu[e, :I]), "up": dec_bf16(gu[e, I:]), "down": dec_bf16(d[e])} for e in range(E)]
    return {f"{base}gate_up_proj": ("BF16", gu), f"{base}down_proj": ("BF16", d)}, refs


def gpt_oss_layer(rng, base, fmt, E, H, I):
    if fmt == "mxfp4":
        gub, gus = rand_bytes(rng, (E, 2 * I, H // 32, 16)), rand_e8m0(rng, (E, 2 * I, H // 32))
        db, ds = rand_bytes(rng, (E, H, I // 32, 16)), rand_e8m0(rng, (E, H, I // 32))
        gbias, dbias = rand_bf16(rng, (E, 2 * I)), rand_bf16(rng, (E, H))
        t = {f"{base}gate_up_proj_blocks": ("U8", gub), f"{base}gate_up_proj_scales": ("U8", gus),
             f"{base}gate_up_proj_bias": ("BF16", gbias), f"{base}down_proj_blocks": ("U8", db),
             f"{base}down_proj_scales": ("U8", ds), f"{base}down_proj_bias": ("BF16", dbias)}
        refs = []
        for e in range(E):
            gu = dec_fp4(gub[e].reshape(2 * I, H // 2)) * group(np.exp2(gus[e].astype(np.float64) - 127), H)
            dn = dec_fp4(db[e].reshape(H, I // 2)) * group(np.exp2(ds[e].astype(np.float64) - 127), I)
            b = dec_bf16(gbias[e])
            refs.append({"gate": gu[0::2], "up": gu[1::2], "down": dn, "gate_bias": b[0::2],
                         "up_bias": b[1::2], "down_bias": dec_bf16(dbias[e])})
        return t, refs
    gu, d = rand_bf16(rng, (E, H, 2 * I)), rand_bf16(rng, (E, I, H))
    gbias, dbias = rand_bf16(rng, (E, 2 * I)), rand_bf16(rng, (E, H))
    t = {f"{base}gate_up_proj": ("BF16", gu), f"{base}gate_up_proj_bias": ("BF16", gbias),
         f"{base}down_proj": ("BF16", d), f"{base}down_proj_bias": ("BF16", dbias)}
    refs = []
    for e in range(E):
        w = dec_bf16(gu[e])
        b = dec_bf16(gbias[e])
        refs.append({"gate": w[:, 0::2].T, "up": w[:, 1::2].T, "down": dec_bf16(d[e]).T,
                     "gate_bias": b[0::2], "up_bias": b[1::2], "down_bias": dec_bf16(dbias[e])})
    return t, refs


def plain(rng, shape):
    return ("BF16", rand_bf16(rng, shape))


# -- whole checkpoints per family ---------------------------------------------------------

GUD = ("gate_proj", "up_proj", "down_proj")
W132 = ("w1", "w3", "w2")
NAMING = {  # family -> (layer prefix, expert block, per-expert projection names)
    "qwen3_moe": ("model.layers.", "mlp.experts", GUD),
    "qwen3_next": ("model.layers.", "mlp.experts", GUD),
    "qwen3_5_moe": ("model.language_model.layers.", "mlp.experts", GUD),
    "deepseek_v3": ("model.layers.", "mlp.experts", GUD),
    "glm4_moe": ("model.layers.", "mlp.experts", GUD),
    "glm_moe_dsa": ("model.layers.", "mlp.experts", GUD),
    "glm5_next": ("model.language_model.layers.", "mlp.experts", GUD),
    "mixtral": ("model.layers.", "block_sparse_moe.experts", W132),
    "gpt_oss": ("model.layers.", "mlp.experts", GUD),
    "deepseek_v4": ("layers.", "ffn.experts", W132),
}


def family_config(family: str, fmts: list, E: int, H: int, I: int) -> dict:
    n = len(fmts)
    dense = [i for i, f in enumerate(fmts) if f is None]
    leading = len(dense)
    assert family in ("qwen3_moe", "qwen3_next") or dense == list(range(leading)), "dense layers must lead"
    c = {"model_type": family, "hidden_size": H, "num_hidden_layers": n, "num_experts_per_tok": 2,
         "hidden_act": "silu", "intermediate_size": 4 * I}
    if family in ("qwen3_moe", "qwen3_next"):
        c.update(num_experts=E, moe_intermediate_size=I, mlp_only_layers=dense, decoder_sparse_step=1)
    elif family in ("qwen3_5_moe", "glm5_next"):
        tc = dict(c, num_experts=E, n_routed_experts=E, moe_intermediate_size=I,
                  model_type=family + "_text", mlp_layer_types=["dense" if f is None else "sparse" for f in fmts])
        c = {"model_type": family, "text_config": tc}
    elif family in ("deepseek_v3", "glm4_moe", "glm_moe_dsa"):
        c.update(n_routed_experts=E, moe_intermediate_size=I, first_k_dense_replace=leading)
        if family == "glm_moe_dsa":
            c["mlp_layer_types"] = ["dense" if f is None else "sparse" for f in fmts]
            c["first_k_dense_replace"] = 99  # mlp_layer_types wins
    elif family in ("mixtral", "gpt_oss"):
        c.update(num_local_experts=E, intermediate_size=I)
        if family == "gpt_oss":
            c["swiglu_limit"] = 7.0
    elif family == "deepseek_v4":
        c.update(n_routed_experts=E, moe_intermediate_size=I, swiglu_limit=10.0,
                 mlp_layer_types=["hash_moe" if i < 1 else "moe" for i in range(n)])
    return c


def build(folder, family, fmts, E=4, H=64, I=32, nshards=1, seed=None, mtp=False, naming=None):
    """A checkpoint of len(fmts) layers; fmts[L] is a layer's source format, None for dense.

    Returns (folder, refs) with refs[L][e] = {'gate','up','down', ...} float64 references.
    """
    rng = np.random.default_rng(seed)
    prefix, block, proj = naming or NAMING[family]
    t = {"model.embed_tokens.weight": plain(rng, (16, H))}
    refs = {}
    for L, fmt in enumerate(fmts + (["bf16"] if mtp else [])):
        p = f"{prefix}{L}."
        t[p + "input_layernorm.weight"] = plain(rng, (H,))
        if fmt is None:
            t[p + "mlp.gate_proj.weight"] = plain(rng, (4 * I, H))
            continue
        t[p + "mlp.gate.weight"] = plain(rng, (E, H))
        base = f"{p}{block}."
        if fmt == "stacked":
            lt, r = stacked_bf16_layer(rng, base, E, H, I)
        elif family == "gpt_oss":
            lt, r = gpt_oss_layer(rng, base, fmt, E, H, I)
        else:
            lt, r = per_expert_layer(rng, base, fmt, E, H, I, proj)
        t.update(lt)
        if L < len(fmts):
            refs[L] = r
    if mtp:
        t["mtp.0.norm.weight"] = plain(rng, (H,))
    t["lm_head.weight"] = plain(rng, (16, H))
    config = family_config(family, fmts, E, H, I)
    if mtp:  # the MTP layer numbered after the decoder layers, declared as DeepSeek does
        (config.get("text_config") or config)["num_nextn_predict_layers"] = 1
    write_ckpt(os.fspath(folder), config, t, nshards,
               {"tokenizer.json": "{}", "generation_config.json": "{}"})
    return os.fspath(folder), refs
