"""Every sample under samples/st (written by samples/make_samples.py with transformers and
compressed-tensors where they can) plans, and its banks decode to the samples' own float64
references: the LAYOUTS.md formulas, the libraries' decoders, and transformers' fused experts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ftw.readers.safetensors_reader import SafetensorsReader

ROOT = Path(__file__).resolve().parent.parent / "samples"
reference = pytest.importorskip("samples.reference")


def _samples():
    if not (ROOT / "manifest.json").exists():
        return []
    man = reference.load_manifest(ROOT)["samples"]
    return sorted(n for n, e in man.items() if e["path"].startswith("st/") and (ROOT / e["path"]).is_dir())


SAMPLES = _samples()
pytestmark = pytest.mark.skipif(not SAMPLES, reason="no samples under samples/st (run samples/make_samples.py)")


def banks_dequant(lb):
    out: dict[str, list] = {}
    for e in range(lb.banks["gate_up"].num_experts):
        w = lb.decode_expert(e)
        for k, v in w.items():
            out.setdefault(k, []).append(v)
    return {k: np.stack(v) for k, v in out.items()}


def compare(got, want, rtol, where):
    for k in ("gate", "up", "down", "gate_bias", "up_bias", "down_bias"):
        if k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=0, err_msg=f"{where} {k}")


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_matches_formula_reference(name):
    entry = reference.load_manifest(ROOT)["samples"][name]
    folder = ROOT / entry["path"]
    ref = reference.reference_dequant(folder, entry)
    with SafetensorsReader(folder) as r:
        assert r.model.moe_layers == entry["moe_layers"]
        assert {str(k): f.name for k, f in r.layer_formats().items()} == entry["formats"]
        for lb in r.plan():
            got = banks_dequant(lb)
            # only compressed-tensors' inverse global is rounded (once, to float32)
            ct = "ct" in name and lb.format.name == "nvfp4"
            compare(got, ref[lb.layer], 2.0**-23 if ct else 0, f"{name} layer {lb.layer}")


def _library_decodable() -> list[str]:
    """Samples with layers compressed-tensors can decode: NVFP4, and block FP8 under HF names
    (DeepSeek-V4's native `.scale` names are outside its converters)."""
    man = reference.load_manifest(ROOT)["samples"] if SAMPLES else {}
    return [n for n in SAMPLES if man[n]["family"] != "deepseek_v4"
            and {"nvfp4", "fp8_block"} & set(man[n]["formats"].values())]


@pytest.mark.parametrize("name", _library_decodable())
def test_sample_matches_library_decoders(name):
    entry = reference.load_manifest(ROOT)["samples"][name]
    folder = ROOT / entry["path"]
    lib = reference.reference_dequant_library(folder, entry)
    assert lib, f"compressed-tensors decoded no layer of {name}"
    with SafetensorsReader(folder) as r:
        for lb in r.plan(sorted(lib)):
            # the libraries decode block FP8 in float32 and NVFP4 in bf16 (measured: 6e-8 and 6e-3)
            rtol = 1e-6 if lb.format.name == "fp8_block" else 1e-2
            compare(banks_dequant(lb), lib[lb.layer], rtol, f"{name} layer {lb.layer}")


BF16 = [n for n in SAMPLES if "bf16" in n and "nvfp4" not in n and "fp8" not in n and "mxfp4" not in n]


@pytest.mark.parametrize("name", BF16)
def test_bf16_banks_equal_transformers_fused_experts(name):
    folder = ROOT / reference.load_manifest(ROOT)["samples"][name]["path"]
    try:
        fused = reference.reference_experts(folder)
    except ValueError as e:  # a sample whose config transformers itself refuses to load
        pytest.skip(f"transformers cannot load {name}: {str(e).splitlines()[-1]}")
    with SafetensorsReader(folder) as r:
        for lb in r.plan():
            p = fused[lb.layer]
            gu, down = p["gate_up_proj"], p["down_proj"]
            if r.family.name == "gpt_oss":  # x @ W, gate/up interleaved on the last axis
                gu = np.concatenate([gu[..., 0::2], gu[..., 1::2]], axis=-1).transpose(0, 2, 1)
                down = down.transpose(0, 2, 1)
            got = banks_dequant(lb)
            np.testing.assert_array_equal(np.concatenate([got["gate"], got["up"]], axis=1), gu)
            np.testing.assert_array_equal(got["down"], down)
            if "gate_up_proj_bias" in p:
                b = p["gate_up_proj_bias"]
                np.testing.assert_array_equal(got["gate_bias"], b[:, 0::2])
                np.testing.assert_array_equal(got["up_bias"], b[:, 1::2])
                np.testing.assert_array_equal(got["down_bias"], p["down_proj_bias"])
