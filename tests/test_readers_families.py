"""Every family and source format: banks hold the source bytes, re-laid as DESIGN.md says, and
the format's decoder on the banks equals an independent float64 decode of the source tensors."""

from __future__ import annotations

import numpy as np

from ftw.formats import Activation
import pytest

from ftw.readers.safetensors_reader import SafetensorsReader, open_safetensors
from st_build import CANON, build

NVFP4_CT_RTOL = 2.0**-23  # the reciprocal global is rounded once to float32


def check_layer(lb, refs, src_fmt):
    fmt = lb.format
    assert fmt.name == CANON.get(src_fmt, "mxfp4" if src_fmt == "mxfp4" else "bf16")
    specs = fmt.banks(*lb.dims())
    assert {n for n, s in specs.items() if not s.optional} <= set(lb.banks) <= set(specs)
    for e, ref in enumerate(refs):
        rows = {}
        for k, src in lb.banks.items():
            pieces = src.row(e)
            assert sum(np.asarray(p).nbytes for p in pieces) == src.row_nbytes, k
            rows[k] = src.row_array(e)
            assert rows[k].shape == src.row_shape
        w = fmt.decode(rows, *lb.dims())
        for key in ("gate", "up", "down", "gate_bias", "up_bias", "down_bias"):
            if key not in ref:
                assert key not in w
                continue
            if src_fmt == "nvfp4_ct":
                np.testing.assert_allclose(w[key], ref[key], rtol=NVFP4_CT_RTOL, atol=0, err_msg=key)
            else:
                np.testing.assert_array_equal(w[key], ref[key], err_msg=key)
        if "gate_src" in ref:
            check_bytes(lb, e, ref, src_fmt)


# bank -> source suffix whose bytes it holds (gate's then up's for gate_up banks)
BYTES = {
    "bf16": {"gate_up": "weight", "down": "weight"},
    "fp8_block": {"gate_up": "weight", "down": "weight", "gate_up_scale": "weight_scale_inv", "down_scale": "weight_scale_inv"},
    "fp8_v4": {"gate_up": "weight", "down": "weight", "gate_up_scale": "scale", "down_scale": "scale"},
    "fp8_ct": {"gate_up": "weight", "down": "weight", "gate_up_scale": "weight_scale", "down_scale": "weight_scale"},
    "mxfp8": {"gate_up": "weight", "down": "weight", "gate_up_scale": "weight_scale", "down_scale": "weight_scale"},
    "ds_fp4": {"gate_up": "weight", "down": "weight", "gate_up_scale": "scale", "down_scale": "scale"},
    "nvfp4_modelopt": {"gate_up": "weight", "down": "weight", "gate_up_scale": "weight_scale", "down_scale": "weight_scale"},
    "nvfp4_ct": {"gate_up": "weight_packed", "down": "weight_packed", "gate_up_scale": "weight_scale", "down_scale": "weight_scale"},
}


def check_bytes(lb, e, ref, src_fmt):
    for bank, sfx in BYTES[src_fmt].items():
        roles = ("gate", "up") if bank.startswith("gate_up") else ("down",)
        want = b"".join(ref[r + "_src"][sfx].tobytes() for r in roles)
        got = b"".join(np.ascontiguousarray(p).tobytes() for p in lb.banks[bank].row(e))
        assert got == want, bank
        for p in lb.banks[bank].row(e):
            assert not p.flags.writeable, "per-expert pieces are views of the read-only map"
    if src_fmt.startswith("nvfp4"):
        I = ref["gate"].shape[0]
        H = ref["down"].shape[0]
        key = "weight_global_scale" if src_fmt == "nvfp4_ct" else "weight_scale_2"

        def mult(r):
            g = ref[r + "_src"][key].reshape(-1)[0]
            return np.float32(1.0 / np.float64(g)) if src_fmt == "nvfp4_ct" else np.float32(g)

        gu = lb.banks["gate_up_global"].row_array(e)
        np.testing.assert_array_equal(gu, np.r_[np.full(I, mult("gate")), np.full(I, mult("up"))].astype(np.float32))
        np.testing.assert_array_equal(lb.banks["down_global"].row_array(e), np.full(H, mult("down"), np.float32))


def check_all(folder, refs, fmts):
    with open_safetensors(folder) as r:
        moe = [L for L, f in enumerate(fmts) if f is not None]
        assert r.model.moe_layers == moe
        formats = r.layer_formats()
        assert sorted(formats) == moe
        for lb in r.plan():
            check_layer(lb, refs[lb.layer], fmts[lb.layer])
        return r


PER_EXPERT = ["bf16", "fp8_block", "nvfp4_modelopt", "nvfp4_ct"]
CASES = [
    ("qwen3_moe", [f, f]) for f in PER_EXPERT + ["stacked"]
] + [
    ("qwen3_moe", [None, "bf16", None, "nvfp4_ct"]),  # mlp_only_layers
    ("qwen3_next", ["stacked", None, "fp8_block"]),
    ("qwen3_5_moe", ["stacked", "stacked"]),
    ("qwen3_5_moe", ["fp8_block", "fp8_block"]),
    ("deepseek_v3", [None, "fp8_block", "fp8_block"]),
    ("deepseek_v3", [None, "bf16", "stacked"]),
    ("glm4_moe", [None, "bf16", "nvfp4_modelopt"]),
    ("glm_moe_dsa", [None, None, "fp8_block"]),
    ("glm5_next", [None, "bf16", "fp8_block"]),
    ("mixtral", ["bf16", "nvfp4_modelopt"]),
    ("gpt_oss", ["mxfp4", "mxfp4"]),
    ("gpt_oss", ["bf16_gptoss", "bf16_gptoss"]),
    ("deepseek_v4", ["ds_fp4", "ds_fp4"]),
    ("deepseek_v4", ["fp8_v4", "ds_fp4"]),
    # mixed checkpoints: bf16 first and last with NVFP4 between; fp8 next to nvfp4
    ("qwen3_moe", ["bf16", "nvfp4_modelopt", "nvfp4_modelopt", "bf16"]),
    ("deepseek_v3", [None, "fp8_block", "nvfp4_ct", "bf16"]),
    ("glm_moe_dsa", [None, "bf16", "nvfp4_modelopt", "fp8_block", "stacked"]),
    # compressed-tensors FP8 flavours
    ("qwen3_moe", ["fp8_ct", "mxfp8", "nvfp4_ct"]),
]


@pytest.mark.parametrize("family,fmts", CASES, ids=lambda x: x if isinstance(x, str) else "-".join(map(str, x)))
def test_family_formats(tmp_path, family, fmts):
    # I=160 is not a multiple of 128: the fused fp8 scale keeps gate's and up's partial blocks
    H, I = (256, 160) if any(f and f.startswith("fp8") for f in fmts) else (64, 32)
    folder, refs = build(tmp_path / "ck", family, fmts, E=3, H=H, I=I)
    check_all(folder, refs, fmts)


def test_sharded_with_index(tmp_path):
    fmts = [None, "bf16", "fp8_block", "nvfp4_ct"]
    folder, refs = build(tmp_path / "ck", "deepseek_v3", fmts, E=3, H=256, I=160, nshards=3)
    r = check_all(folder, refs, fmts)
    assert len(r.source_files()) == 2 + 3


def test_options_and_shape(tmp_path):
    folder, _ = build(tmp_path / "a", "gpt_oss", ["mxfp4", "bf16_gptoss"])
    with SafetensorsReader(folder) as r:
        f = r.layer_formats()
        assert f[0].name == "mxfp4" and f[0].options == {}
        assert f[1].name == "bf16" and f[1].options == {}
        # the activation is the model's, with gpt-oss's default limit and fixed alpha
        assert r.model.activation == Activation("swiglu_oai", alpha=1.702, limit=7.0)
        assert set(r.plan([1])[0].banks) == {"gate_up", "down", "gate_up_bias", "down_bias"}
        assert (r.model.num_experts, r.model.hidden_size, r.model.moe_intermediate_size) == (4, 64, 32)
    folder, _ = build(tmp_path / "b", "deepseek_v4", ["ds_fp4", "fp8_v4"], H=256, I=160)
    with SafetensorsReader(folder) as r:
        f = r.layer_formats()
        assert f[0].options == {"act_block": 128}
        assert f[1].name == "fp8_block" and f[1].options == {"block_size": [128, 128]}
        assert r.model.activation == Activation("silu", limit=10.0)
        assert "swiglu_limit" not in r.model.extra
        assert r.name == "safetensors/deepseek_v4"


def test_deepseek_v4_model_prefixed_names(tmp_path):
    naming = ("model.layers.", "mlp.experts", ("gate_proj", "up_proj", "down_proj"))
    folder, refs = build(tmp_path / "ck", "deepseek_v4", ["ds_fp4", "bf16"], naming=naming)
    check_all(folder, refs, ["ds_fp4", "bf16"])
    naming = ("model.layers.", "ffn.experts", ("w1", "w3", "w2"))
    folder, refs = build(tmp_path / "ck2", "deepseek_v4", ["ds_fp4", "ds_fp4"], naming=naming)
    check_all(folder, refs, ["ds_fp4", "ds_fp4"])


def test_mixtral_stacked_under_mlp(tmp_path):
    naming = ("model.layers.", "mlp.experts", ("w1", "w3", "w2"))
    folder, refs = build(tmp_path / "ck", "mixtral", ["stacked", "stacked"], naming=naming)
    check_all(folder, refs, ["stacked", "stacked"])


def test_qwen3_5_text_only_prefix(tmp_path):
    naming = ("model.layers.", "mlp.experts", ("gate_proj", "up_proj", "down_proj"))
    folder, refs = build(tmp_path / "ck", "qwen3_5_moe", ["stacked", "fp8_block"], H=256, I=160, naming=naming)
    check_all(folder, refs, ["stacked", "fp8_block"])


def test_tensors_attachments_mtp(tmp_path):
    folder, _ = build(tmp_path / "ck", "deepseek_v3", [None, "nvfp4_modelopt"], mtp=True)
    with SafetensorsReader(folder) as r:
        names = {t.name for t in r.tensors()}
        assert "model.layers.0.mlp.gate_proj.weight" in names and "model.layers.1.mlp.gate.weight" in names
        assert not any(".experts." in n for n in names), "expert tensors (and input_scale) are banks or dropped"
        assert not any(n.startswith(("model.layers.2.", "mtp.")) for n in names), "MTP skipped"
        for t in r.tensors():
            a = t.data()
            assert a.nbytes == t.nbytes and tuple(a.shape) == t.shape
        assert set(r.attachments()) == {"config.json", "tokenizer.json", "generation_config.json"}
    with SafetensorsReader(folder, keep_mtp=True) as r:
        names = {t.name for t in r.tensors()}
        assert "mtp.0.norm.weight" in names and "model.layers.2.mlp.experts.0.gate_proj.weight" in names
        assert r.model.moe_layers == [1]


def test_non_expert_bytes_exact(tmp_path):
    folder, _ = build(tmp_path / "ck", "qwen3_moe", ["bf16", "bf16"])
    import torch
    from safetensors.torch import load_file

    src = load_file(f"{folder}/model.safetensors")
    with SafetensorsReader(folder) as r:
        for t in r.tensors():
            assert t.data().tobytes() == src[t.name].view(torch.uint8).numpy().tobytes()
            assert t.dtype == "bf16"


def test_fused_fp8_stacked(tmp_path):
    """transformers' in-memory FP8 experts saved stacked: gate_up_proj + gate_up_proj_scale_inv."""
    from st_build import dec_e4m3, rand_e4m3, rand_f32, write_ckpt, family_config

    rng = np.random.default_rng()
    E, H, I = 3, 256, 256
    base = "model.layers.0.mlp.experts."
    gu, gus = rand_e4m3(rng, (E, 2 * I, H)), rand_f32(rng, (E, 4, 2))
    d, dsc = rand_e4m3(rng, (E, H, I)), rand_f32(rng, (E, 2, 2))
    t = {base + "gate_up_proj": ("F8_E4M3", gu), base + "gate_up_proj_scale_inv": ("F32", gus),
         base + "down_proj": ("F8_E4M3", d), base + "down_proj_scale_inv": ("F32", dsc)}
    folder = write_ckpt(str(tmp_path / "ck"), family_config("qwen3_moe", ["x"], E, H, I), t)
    with SafetensorsReader(folder) as r:
        [lb] = r.plan()
        assert lb.format.name == "fp8_block" and lb.format.options == {"block_size": [128, 128]}
        for e in range(E):
            w = lb.decode_expert(e)
            ref = dec_e4m3(gu[e]) * np.repeat(np.repeat(gus[e].astype(np.float64), 128, 0), 128, 1)
            np.testing.assert_array_equal(w["gate"], ref[:I])
            np.testing.assert_array_equal(w["up"], ref[I:])
            refd = dec_e4m3(d[e]) * np.repeat(np.repeat(dsc[e].astype(np.float64), 128, 0), 128, 1)
            np.testing.assert_array_equal(w["down"], refd)
