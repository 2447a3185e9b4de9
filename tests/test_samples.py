"""The committed samples: deterministic, as the manifest says, and numerically sane.

Nothing here imports readers/ or ftw/: the samples and their references are the independent
side the readers are checked against.

Tolerances (quantized weights vs the floats they were made from, per quantization block):
  fp8_block   |err| <= block_absmax / 16        (e4m3: 3 mantissa bits, half-ulp 2^-4)
  nvfp4       |err| <= 0.18 * block16_absmax    (E2M1 half-gap is at most 1 unit of the block
                                                 scale ~ absmax/6, scale rounded to e4m3: x17/16)
  mxfp4/ds_fp4 |err| <= absmax32 / 3            (power-of-two scale in [absmax/6, absmax/3))
  mxfp8       |err| <= absmax32 / 16            (e4m3 half-ulp 2^-4; the MX scale keeps the
                                                 block max below 448, so nothing saturates)
  affine      |err| <= step + absmax_g / 256    (step = group range / (2^bits - 1): mlx puts
                                                 the group's larger-magnitude end on the grid,
                                                 which can cost up to a step at the other end;
                                                 scale and bias are rounded to bf16)
Library decoders vs the formula references: fp8 exact to float32 (rtol 1e-6); NVFP4 and
MXFP8 to rtol 2^-7, since compressed-tensors' decompressors compute and return bf16; MLX
affine (mx.dequantize, float32) to rtol 1e-6.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from samples import make_samples as M  # noqa: E402
from samples import st_layouts as L  # noqa: E402
from samples.reference import (  # noqa: E402
    load_manifest,
    reference_dequant,
    reference_dequant_library,
    reference_experts,
)

MANIFEST = load_manifest()["samples"]
NAMES = sorted(MANIFEST)
TF_BF16 = [n for n in NAMES if MANIFEST[n]["writer"]["experts"].startswith("transformers")]
QUANTIZED = [n for n in NAMES if any(f != "bf16" for f in MANIFEST[n]["formats"].values())]


def _dir(name: str) -> Path:
    return ROOT / "samples" / MANIFEST[name]["path"]


def _hashes(d: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir())}


# --------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("name", ["qwen3_moe_bf16", "qwen3_moe_nvfp4_ct", "mixed_fp8_nvfp4", "mixtral_affine_mixed"])
def test_same_seed_same_bytes(tmp_path, name):
    if MANIFEST[name]["writer"]["experts"].startswith("mlx"):
        pytest.importorskip("mlx.core", reason="the MLX samples are written by mlx (dev extra)")
    a = M.make_sample(name, tmp_path / "a", seed=7)
    b = M.make_sample(name, tmp_path / "b", seed=7)
    assert _hashes(tmp_path / "a" / a.entry["path"]) == _hashes(tmp_path / "b" / b.entry["path"])
    c = M.make_sample(name, tmp_path / "c", seed=8)
    assert _hashes(tmp_path / "c" / c.entry["path"]) != _hashes(tmp_path / "a" / a.entry["path"])


@pytest.mark.parametrize("name", ["qwen3_moe_bf16", "gpt_oss_mxfp4", "deepseek_v4_fp4", "qwen3_moe_mxfp8_ct",
                                  "mixtral_affine_mixed"])
def test_committed_bytes_are_seed_zero(tmp_path, name):
    """The committed files are exactly what the script writes with the manifest's seed."""
    if M.made_with() != load_manifest()["made_with"]:
        pytest.skip(f"samples were made with {load_manifest()['made_with']}, this is {M.made_with()}")
    made = M.make_sample(name, tmp_path, seed=load_manifest()["seed"])
    assert _hashes(tmp_path / made.entry["path"]) == _hashes(_dir(name))
    assert made.entry["formats"] == MANIFEST[name]["formats"]


# --------------------------------------------------------------------------- manifest vs files


def test_manifest_covers_every_layout():
    fams = {e["family"] for e in MANIFEST.values()}
    assert {"qwen3_moe", "qwen3_5_moe", "deepseek_v3", "deepseek_v4", "glm_moe_dsa", "glm4_moe", "gpt_oss",
            "mixtral", "glm5_next"} <= fams
    fmts = {f for e in MANIFEST.values() for f in e["formats"].values()}
    assert {"bf16", "fp8_block", "nvfp4", "mxfp4", "ds_fp4", "mxfp8", "affine"} <= fmts
    mixed = [n for n, e in MANIFEST.items() if len(set(e["formats"].values())) > 1]
    assert len(mixed) >= 3
    for fam in ("qwen3_moe", "mixtral"):
        layouts = {e["layout"] for e in MANIFEST.values() if e["family"] == fam and e["writer"]["experts"].startswith("transformers")}
        assert layouts == {"per_expert", "stacked"}, fam


def test_sizes():
    total = 0
    for name in NAMES:
        d = _dir(name)
        files = {f.name: f.stat().st_size for f in sorted(d.iterdir())}
        assert files == MANIFEST[name]["files"], name
        assert sum(files.values()) < 2.1e6, name
        total += sum(files.values())
    assert total < 15e6


@pytest.mark.parametrize("name", NAMES)
def test_expert_tensors_match_manifest(name):
    e = MANIFEST[name]
    d = _dir(name)
    assert (d / "config.json").exists()
    heads = L.tensor_headers(d)
    want = L.expected_expert_tensors(e)
    for k, (dtype, shape) in want.items():
        assert k in heads, f"{name}: missing {k}"
        assert (heads[k]["dtype"], heads[k]["shape"]) == (dtype, shape), f"{name}: {k}"
    # nothing else in the MoE layers' expert namespaces
    prefixes = tuple(L.expert_prefix(e, int(l)) + "." for l in e["formats"])
    extra = [k for k in heads if k.startswith(prefixes) and k not in want]
    assert not extra, f"{name}: unexpected expert tensors {extra[:3]}"
    # index files name only shards that exist, each tensor once
    idx = d / "model.safetensors.index.json"
    if idx.exists():
        wm = json.loads(idx.read_text())["weight_map"]
        assert set(wm) == set(heads)
        assert all(heads[k]["file"] == f for k, f in wm.items())


@pytest.mark.parametrize("name", NAMES)
def test_non_expert_tensors_present(name):
    e = MANIFEST[name]
    heads = L.tensor_headers(_dir(name))
    layer_pre = e["naming"]["layers"]
    embed = [k for k in heads if "embed" in k]
    assert embed, "embeddings"
    assert any(k.endswith("head.weight") for k in heads), "lm head"
    for l in e["moe_layers"]:
        own = [k for k in heads if k.startswith(f"{layer_pre}{l}.")]
        assert any("norm" in k for k in own), f"layer {l} norms"
        assert any(("attn" in k) for k in own), f"layer {l} attention"
        router = [k for k in own if k.endswith(("mlp.gate.weight", "ffn.gate.weight", "mlp.router.weight",
                                                "block_sparse_moe.gate.weight"))]
        assert router, f"layer {l} router"


def test_quant_configs():
    cfg = lambda n: json.loads((_dir(n) / "config.json").read_text())  # noqa: E731
    q = cfg("deepseek_v3_fp8")["quantization_config"]
    assert q["quant_method"] == "fp8" and q["weight_block_size"] == [128, 128]
    assert cfg("deepseek_v3_fp8")["num_hidden_layers"] == 3  # MTP layer 3 is beyond it
    assert cfg("gpt_oss_mxfp4")["quantization_config"]["quant_method"] == "mxfp4"
    assert cfg("deepseek_v4_fp4")["expert_dtype"] == "fp4"
    assert cfg("deepseek_v4_fp8")["expert_dtype"] == "fp8"
    ct = cfg("qwen3_moe_nvfp4_ct")["quantization_config"]
    assert ct["quant_method"] == "compressed-tensors" and ct["format"] == "nvfp4-pack-quantized"
    mo = json.loads((_dir("mixed_bf16_nvfp4") / "hf_quant_config.json").read_text())["quantization"]
    assert mo["quant_algo"] == "NVFP4"
    assert "model.layers.0.mlp.experts*" in mo["exclude_modules"] and "model.layers.3.mlp.experts*" in mo["exclude_modules"]
    assert cfg("mixed_bf16_nvfp4")["quantization_config"]["quant_method"] == "modelopt"
    mp = json.loads((_dir("mixed_fp8_nvfp4") / "hf_quant_config.json").read_text())["quantization"]
    assert mp["quant_algo"] == "MIXED_PRECISION"
    assert {m.split(".")[2] for m in mp["quantized_layers"]} == {"1", "2"}
    assert cfg("mixed_deepseek_v3_bf16_fp8")["quantization_config"]["modules_to_not_convert"] == [
        "model.layers.2.mlp.experts"]


# --------------------------------------------------------------------------- references


@pytest.mark.parametrize("name", TF_BF16)
def test_transformers_in_memory_experts_equal_the_files(name):
    """reference_experts (what transformers loads) == the bf16 tensors on disk, bit for bit."""
    e = MANIFEST[name]
    mem = reference_experts(_dir(name))
    ref = reference_dequant(_dir(name), e)
    assert sorted(mem) == e["moe_layers"]
    for l, w in ref.items():
        gu, down = mem[l]["gate_up_proj"], mem[l]["down_proj"]
        if e["family"] == "gpt_oss":
            gu, down = gu.transpose(0, 2, 1), down.transpose(0, 2, 1)
            np.testing.assert_array_equal(gu[:, 0::2], w["gate"])
            np.testing.assert_array_equal(gu[:, 1::2], w["up"])
            np.testing.assert_array_equal(mem[l]["gate_up_proj_bias"][:, 0::2], w["gate_bias"])
            np.testing.assert_array_equal(mem[l]["down_proj_bias"], w["down_bias"])
        else:
            I = e["I"]
            np.testing.assert_array_equal(gu[:, :I], w["gate"])
            np.testing.assert_array_equal(gu[:, I:], w["up"])
        np.testing.assert_array_equal(down, w["down"])


def _check_error(fmt: str, ref: np.ndarray, orig: np.ndarray, where: str, options: dict | None = None) -> None:
    E, o, i = orig.shape
    if fmt == "bf16":
        np.testing.assert_array_equal(ref, orig, err_msg=where)
        return
    if fmt == "affine":
        bits, g = options["bits"], options["group_size"]
        grp = orig.reshape(E, o, i // g, g)
        step = (grp.max(-1, keepdims=True) - grp.min(-1, keepdims=True)) / (2**bits - 1)
        bound = np.broadcast_to(step + np.abs(grp).max(-1, keepdims=True) / 256, grp.shape).reshape(E, o, i)
    elif fmt == "fp8_block":
        amax = np.zeros_like(orig)
        for a in range(0, o, 128):
            for b in range(0, i, 128):
                blk = np.abs(orig[:, a:a + 128, b:b + 128]).max(axis=(1, 2), keepdims=True)
                amax[:, a:a + 128, b:b + 128] = blk
        bound = amax / 16
    else:
        g, c = {"nvfp4": (16, 0.18), "mxfp4": (32, 1 / 3), "ds_fp4": (32, 1 / 3), "mxfp8": (32, 1 / 16)}[fmt]
        amax = np.abs(orig.reshape(E, o, i // g, g)).max(-1, keepdims=True)
        bound = np.broadcast_to(c * amax, (E, o, i // g, g)).reshape(E, o, i)
    err = np.abs(ref - orig)
    assert (err <= bound + 1e-12).all(), f"{where}: worst excess {(err - bound).max():.3g}"
    rel = np.linalg.norm(ref - orig) / np.linalg.norm(orig)
    limit = {"fp8_block": 0.05, "nvfp4": 0.15, "mxfp4": 0.2, "ds_fp4": 0.2, "mxfp8": 0.05}.get(fmt)
    if fmt == "affine":
        limit = 1.0 / 2 ** (options["bits"] - 2)  # measured ~0.17 at 3 bits, ~0.09 at 4, ~0.02 at 6
    assert rel < limit, f"{where}: rel {rel:.3f}"


@pytest.mark.parametrize("name", QUANTIZED + ["qwen3_moe_bf16", "gpt_oss_bf16"])
def test_reference_dequant_matches_originals_fresh_seed(tmp_path, name):
    """Regenerate with a fresh seed; the formula reference recovers the quantized floats."""
    if MANIFEST[name]["writer"]["experts"].startswith("mlx"):
        pytest.importorskip("mlx.core", reason="the MLX samples are written by mlx (dev extra)")
    made = M.make_sample(name, tmp_path, seed=12345)
    ref = reference_dequant(tmp_path / made.entry["path"], made.entry)
    assert sorted(ref) == made.entry["moe_layers"]
    for l, w in ref.items():
        opts = made.entry.get("options", {}).get(str(l))
        for p in ("gate", "up", "down"):
            _check_error(w["format"], w[p], made.originals[l][p], f"{name} layer {l} {p}", opts)


@pytest.mark.parametrize("name", [n for n in QUANTIZED if MANIFEST[n]["layout"] == "per_expert"])
def test_library_decoders_agree_with_formula_reference(name):
    e = MANIFEST[name]
    lib = reference_dequant_library(_dir(name), e)
    ref = reference_dequant(_dir(name), e)
    wanted = {int(l) for l, f in e["formats"].items()
              if f in ("nvfp4", "mxfp8") or (f == "fp8_block" and e["naming"].get("scale_suffix") != ".scale")}
    assert set(lib) == wanted
    for l, w in lib.items():
        rtol = 2**-7 if w["format"] in ("nvfp4", "mxfp8") else 1e-6
        for p in ("gate", "up", "down"):
            np.testing.assert_allclose(w[p], ref[l][p], rtol=rtol, atol=1e-12, err_msg=f"{name} {l} {p}")


@pytest.mark.parametrize("name", [n for n in NAMES if MANIFEST[n]["writer"]["experts"].startswith("mlx")])
def test_mlx_dequantize_agrees_with_formula_reference(name):
    """mlx's own decoder (mx.dequantize) on the committed bytes == the LAYOUTS.md formulas."""
    pytest.importorskip("mlx.core", reason="mlx is the dev extra's MLX decoder")
    e = MANIFEST[name]
    lib = reference_dequant_library(_dir(name), e)
    ref = reference_dequant(_dir(name), e)
    assert set(lib) == {int(l) for l in e["formats"]}
    for l, w in lib.items():
        for p in ("gate", "up", "down"):
            np.testing.assert_allclose(w[p], ref[l][p], rtol=1e-6, atol=1e-12, err_msg=f"{name} {l} {p}")


def test_affine_options_match_the_files():
    """The manifest's per-layer bits and group size are what the tensor shapes say (LAYOUTS.md)."""
    for name in [n for n in NAMES if "affine" in MANIFEST[n]["formats"].values()]:
        e = MANIFEST[name]
        heads = L.tensor_headers(_dir(name))
        for l, opts in e["options"].items():
            pre = L.expert_prefix(e, int(l))
            w, s = heads[f"{pre}.gate_proj.weight"]["shape"], heads[f"{pre}.gate_proj.scales"]["shape"]
            assert opts == {"bits": w[-1] * 32 // e["H"], "group_size": e["H"] // s[-1]}, (name, l)
    cfg = json.loads((_dir("mixtral_affine_mixed") / "config.json").read_text())
    assert cfg["quantization"]["bits"] == 3
    assert cfg["quantization"]["model.layers.1.block_sparse_moe.switch_mlp.down_proj"] == {"group_size": 32, "bits": 6}


def test_fp4_packing_low_nibble_first():
    codes = L.fp4_codes(np.array([[0.5, -6.0, 1.0, 0.0]]))
    assert codes.tolist() == [[1, 15, 2, 0]]
    assert L.pack_fp4(codes).tolist() == [[0xF1, 0x02]]
    np.testing.assert_array_equal(L.unpack_fp4(L.pack_fp4(codes)), [[0.5, -6.0, 1.0, 0.0]])
