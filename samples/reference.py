"""Float64 references for the samples, computed from the SOURCE files, never through ftw/readers.

    reference_dequant(sample_dir, entry=None) -> {layer: {"format", "gate", "up", "down", ...}}
        every MoE layer of any sample, dequantized by the LAYOUTS.md formulas from the raw
        safetensors bytes: gate/up [E, I, H], down [E, H, I] (float64, [out, in]); gpt-oss
        layers add gate_bias/up_bias [E, I] and down_bias [E, H].
    reference_dequant_library(sample_dir, entry=None) -> same keys, for the layers that
        a library can decode itself (compressed-tensors' NVFP4 and MXFP8 decompressors, its
        ModelOpt NVFP4 converter, its block-FP8 dequantizer; mlx's mx.dequantize for MLX
        affine and mxfp8 where mlx is installed): an outside check of the bytes and of the formulas.
    reference_experts(sample_dir) -> {layer: {param: float64}}
        the model's own in-memory fused expert parameters after transformers 5 loads the
        folder (from_pretrained, CPU): gate_up_proj [E, 2I, H] and down_proj [E, H, I]
        (gpt-oss: gate_up_proj [E, H, 2I] interleaved, down_proj [E, I, H], *_bias).
    load_manifest(root=samples/) / entry_for(sample_dir)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from samples import st_layouts as L

HERE = Path(__file__).resolve().parent


def load_manifest(root: str | Path = HERE) -> dict:
    return json.loads((Path(root) / "manifest.json").read_text())


def entry_for(sample_dir: str | Path) -> dict:
    """The manifest entry of a sample folder laid out as <root>/st/<name>."""
    d = Path(sample_dir).resolve()
    return load_manifest(d.parent.parent)["samples"][d.name]


# --------------------------------------------------------------------------- from the formulas


def _block_repeat(scale: np.ndarray, out: int, inn: int) -> np.ndarray:
    """Expand per-block scales [ceil(out/bo), ceil(in/bi)] to [out, in] (partial last blocks)."""
    bo, bi = 128, 128
    if scale.shape != (L.ceil_div(out, bo), L.ceil_div(inn, bi)):
        raise ValueError(f"block scale shape {scale.shape} does not fit [{out}, {inn}] with 128x128 blocks")
    return np.repeat(np.repeat(scale, bo, 0), bi, 1)[:out, :inn]


def _dequant_one(raw: L.RawTensors, base: str, fmt: str, entry: dict) -> np.ndarray:
    """One expert projection `base` (module name) -> float64 [out, in]."""
    if fmt == "bf16":
        return raw.float(base + ".weight")
    if fmt == "fp8_block":
        q = raw.get(base + ".weight")
        sname = base + (".scale" if entry["naming"].get("scale_suffix") == ".scale" else ".weight_scale_inv")
        s = raw.get(sname).astype(np.float64)
        return L.E4M3[q] * _block_repeat(s, *q.shape)  # the "inverse" scale multiplies
    if fmt == "nvfp4" and entry["naming"].get("nvfp4") == "compressed-tensors":
        v = L.unpack_fp4(raw.get(base + ".weight_packed"))
        s = L.E4M3[raw.get(base + ".weight_scale")]
        g = float(raw.get(base + ".weight_global_scale").reshape(-1)[0])
        return v * np.repeat(s, v.shape[1] // s.shape[1], 1) / g
    if fmt == "nvfp4":
        v = L.unpack_fp4(raw.get(base + ".weight"))
        s = L.E4M3[raw.get(base + ".weight_scale")]
        s2 = float(raw.get(base + ".weight_scale_2").reshape(-1)[0])
        return v * np.repeat(s, v.shape[1] // s.shape[1], 1) * s2
    if fmt == "mxfp8":  # compressed-tensors mxfp8-quantized: e4m3 * 2^(E8M0 byte - 127) per 32 inputs
        q = raw.get(base + ".weight")
        s = L.e8m0(raw.get(base + ".weight_scale"))
        return L.E4M3[q] * np.repeat(s, q.shape[1] // s.shape[1], 1)
    if fmt == "ds_fp4":
        v = L.unpack_fp4(raw.get(base + ".weight").view(np.uint8))
        s = L.e8m0(raw.get(base + ".scale"))
        return v * np.repeat(s, v.shape[1] // s.shape[1], 1)
    raise ValueError(f"{base}: no per-expert reference for {fmt}")


def _stacked(raw: L.RawTensors, pre: str, fmt: str, entry: dict) -> dict:
    gpt_oss = entry["family"] == "gpt_oss"
    if fmt == "bf16" and not gpt_oss:
        gu, down = raw.float(pre + ".gate_up_proj"), raw.float(pre + ".down_proj")
        I = gu.shape[1] // 2
        return {"gate": gu[:, :I], "up": gu[:, I:], "down": down}
    if fmt == "bf16":  # gpt-oss: x @ W with gate/up interleaved on the last axis
        gu = raw.float(pre + ".gate_up_proj").transpose(0, 2, 1)
        gub = raw.float(pre + ".gate_up_proj_bias")
        return {"gate": gu[:, 0::2], "up": gu[:, 1::2], "down": raw.float(pre + ".down_proj").transpose(0, 2, 1),
                "gate_bias": gub[:, 0::2], "up_bias": gub[:, 1::2], "down_bias": raw.float(pre + ".down_proj_bias")}
    if fmt == "mxfp4":
        def one(p):
            blocks = raw.get(f"{pre}.{p}_blocks")  # [E, out, in/32, 16]
            E, o, nb, _ = blocks.shape
            v = L.unpack_fp4(blocks.reshape(E, o, nb * 16))
            return v * np.repeat(L.e8m0(raw.get(f"{pre}.{p}_scales")), 32, axis=-1)

        gu, gub = one("gate_up_proj"), raw.float(pre + ".gate_up_proj_bias")
        return {"gate": gu[:, 0::2], "up": gu[:, 1::2], "down": one("down_proj"),
                "gate_bias": gub[:, 0::2], "up_bias": gub[:, 1::2], "down_bias": raw.float(pre + ".down_proj_bias")}
    if fmt == "affine":  # MLX switch_mlp: {gate,up,down}_proj.{weight, scales, biases}, each [E, out, ...]
        return {p: _affine(raw, f"{pre}.{name}", entry["I"] if p == "down" else entry["H"])
                for p, name in zip(L.PROJ, entry["naming"]["proj"])}
    if fmt == "mxfp8":  # MLX switch_mlp mode mxfp8: u32 words holding four e4m3 bytes, u8 E8M0 per 32
        out = {}
        for p, name in zip(L.PROJ, entry["naming"]["proj"]):
            q = raw.get(f"{pre}.{name}.weight").astype("<u4").view(np.uint8)  # [E, out, in]
            out[p] = L.E4M3[q] * np.repeat(L.e8m0(raw.get(f"{pre}.{name}.scales")), 32, axis=-1)
        return out
    raise ValueError(f"{pre}: no stacked reference for {fmt}")


def _affine(raw: L.RawTensors, base: str, n_in: int) -> np.ndarray:
    """MLX affine, by LAYOUTS.md: each row of the u32 weight is an LSB-first stream of `bits`-bit
    unsigned q; w = scale * q + bias per group; bits = weight.shape[-1] * 32 / in and
    group_size = in / scales.shape[-1]."""
    words, scales, biases = raw.get(base + ".weight"), raw.float(base + ".scales"), raw.float(base + ".biases")
    bits = words.shape[-1] * 32 // n_in
    stream = np.unpackbits(words.astype("<u4").view(np.uint8), axis=-1, bitorder="little")[..., : n_in * bits]
    q = (stream.reshape(*stream.shape[:-1], n_in, bits).astype(np.int64) << np.arange(bits)).sum(-1)
    g = n_in // scales.shape[-1]
    return q * np.repeat(scales, g, -1) + np.repeat(biases, g, -1)


def reference_dequant(sample_dir: str | Path, entry: dict | None = None) -> dict[int, dict]:
    entry = entry or entry_for(sample_dir)
    raw = L.RawTensors(sample_dir)
    out = {}
    for layer_s, fmt in entry["formats"].items():
        layer = int(layer_s)
        pre = L.expert_prefix(entry, layer)
        if entry["layout"] == "stacked":
            w = _stacked(raw, pre, fmt, entry)
        else:
            per = {p: [] for p in L.PROJ}
            for e in range(entry["E"]):
                for p, name in zip(L.PROJ, entry["naming"]["proj"]):
                    per[p].append(_dequant_one(raw, f"{pre}.{e}.{name}", fmt, entry))
            w = {p: np.stack(v) for p, v in per.items()}
        out[layer] = {"format": fmt, **w}
    return out


# --------------------------------------------------------------------------- through the libraries


def reference_dequant_library(sample_dir: str | Path, entry: dict | None = None) -> dict[int, dict]:
    """Quantized layers decoded by compressed-tensors' own code, where it has a decoder.

    nvfp4 (compressed-tensors): NVFP4PackedCompressor.decompress (returns bf16).
    nvfp4 (ModelOpt): ModelOptNvfp4Converter.process renames/inverts to the
        compressed-tensors convention, then the same decompress.
    fp8_block with weight_scale_inv: FP8BlockDequantizer.process (float32 output).
    mxfp8 (compressed-tensors): MXFP8QuantizationCompressor.decompress (returns bf16).
    affine and mxfp8 (MLX switch_mlp): mx.dequantize in float32, when mlx imports.
    Other layers (bf16, mxfp4, ds_fp4, V4's `.scale` fp8) are left out: no library here decodes
    them on a CPU.
    """
    import torch
    from compressed_tensors.compressors.mxfp8.base import MXFP8QuantizationCompressor
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer import FP8BlockDequantizer
    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import ModelOptNvfp4Converter
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import MXFP8, NVFP4
    from safetensors import safe_open

    entry = entry or entry_for(sample_dir)
    scheme = QuantizationScheme(targets=["Linear"], **NVFP4)
    ct = entry["naming"].get("nvfp4") == "compressed-tensors"
    handles = [safe_open(str(f), "pt") for f in L.shard_files(sample_dir)]

    def module(base: str) -> dict:
        return {k: h.get_tensor(k) for h in handles for k in h.keys() if k.rpartition(".")[0] == base}

    def one(base: str, fmt: str) -> np.ndarray | None:
        t = module(base)
        if fmt == "nvfp4":
            if not ct:
                t = ModelOptNvfp4Converter(targets=[base]).process(t)
            sd = {k: t[f"{base}.{k}"] for k in ("weight_packed", "weight_scale", "weight_global_scale")}
            return NVFP4PackedCompressor.decompress(sd, scheme)["weight"].to(torch.float64).numpy()
        if fmt == "mxfp8":
            sd = {k: t[f"{base}.{k}"] for k in ("weight", "weight_scale")}
            mx_scheme = QuantizationScheme(targets=["Linear"], **MXFP8)
            return MXFP8QuantizationCompressor.decompress(sd, mx_scheme)["weight"].to(torch.float64).numpy()
        if fmt == "fp8_block" and f"{base}.weight_scale_inv" in t:
            conv = FP8BlockDequantizer(targets=[base], dtype=torch.float32)
            return conv.process(t)[f"{base}.weight"].to(torch.float64).numpy()
        return None

    out = {}
    if entry["layout"] != "per_expert":
        return _mlx_layers(sample_dir, entry)
    for layer_s, fmt in entry["formats"].items():
        pre = L.expert_prefix(entry, int(layer_s))
        per = {p: [] for p in L.PROJ}
        for e in range(entry["E"]):
            for p, name in zip(L.PROJ, entry["naming"]["proj"]):
                per[p].append(one(f"{pre}.{e}.{name}", fmt))
        if per["gate"][0] is not None:
            out[int(layer_s)] = {"format": fmt, **{p: np.stack(v) for p, v in per.items()}}
    return out


def _mlx_layers(sample_dir: str | Path, entry: dict) -> dict[int, dict]:
    """MLX layers (affine, mxfp8) decoded by mlx itself (mx.dequantize, float32); {} without mlx."""
    try:
        import mlx.core as mx
    except ImportError:
        return {}
    raw = L.RawTensors(sample_dir)
    out = {}
    if not entry["writer"]["experts"].startswith("mlx"):
        return {}
    for layer_s, fmt in entry["formats"].items():
        pre = L.expert_prefix(entry, int(layer_s))
        w = {}
        for p, name in zip(L.PROJ, entry["naming"]["proj"]):
            q = mx.array(raw.get(f"{pre}.{name}.weight"))
            if fmt == "mxfp8":
                d = mx.dequantize(q, mx.array(raw.get(f"{pre}.{name}.scales")), mode="mxfp8")
            else:
                opts = entry["options"][layer_s]
                s, b = (mx.array(raw.float(f"{pre}.{name}.{k}").astype(np.float32)) for k in ("scales", "biases"))
                d = mx.dequantize(q, s, b, group_size=opts["group_size"], bits=opts["bits"])
            w[p] = np.array(d.astype(mx.float32)).astype(np.float64)
        out[int(layer_s)] = {"format": fmt, **w}
    return out


def reference_experts(sample_dir: str | Path) -> dict[int, dict[str, np.ndarray]]:
    """What transformers itself holds in memory for each MoE layer's experts after loading."""
    import contextlib
    import io
    import warnings

    import torch
    import transformers

    cfg = json.loads((Path(sample_dir) / "config.json").read_text())
    cls = getattr(transformers, cfg["architectures"][0])
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        model = cls.from_pretrained(str(sample_dir), dtype=torch.bfloat16)
    out: dict[int, dict[str, np.ndarray]] = {}
    for name, p in model.named_parameters():
        if ".experts." not in name or ".layers." not in name:
            continue
        layer = int(name.split(".layers.")[1].split(".")[0])
        out.setdefault(layer, {})[name.rsplit(".", 1)[1]] = p.detach().to(torch.float64).numpy()
    return out
