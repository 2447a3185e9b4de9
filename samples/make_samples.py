"""Write the tiny sample checkpoints under samples/st/ and their manifest.

    python samples/make_samples.py [--out samples] [--seed 0] [--only NAME ...]

Every sample is a small Hugging Face folder (config.json, generation_config.json,
model.safetensors or shards + index), deterministic from (name, seed). A real library writes
the bytes wherever one can: transformers 5 builds and saves the bf16 models (per-expert by
default, stacked with save_original_format=False), compressed-tensors quantizes and packs
NVFP4 and MXFP8, mlx quantizes and saves MLX affine (mlx-lm's switch_mlp layout). The other layouts (ModelOpt NVFP4, block FP8, gpt-oss MXFP4, DeepSeek-V4 native FP4)
have no writer that runs on a CPU here, so they are made by quantizing the transformers
model's own expert weights with samples/st_layouts.py, following LAYOUTS.md.

API (used by the tests and the demo):
    make_all(out_dir, seed=0) -> manifest dict (also written to out_dir/manifest.json)
    make_sample(name, out_dir, seed=0) -> Made(entry, originals)
    make_<name>(out_dir, seed=0) -> Made    (one per sample, e.g. make_qwen3_moe_bf16)
`originals[layer]` holds the float64 gate [E, I, H], up [E, I, H], down [E, H, I] that were
saved (bf16) or quantized, so a test can bound the quantization error.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

if __package__ in (None, ""):  # run as a script: make `samples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from samples import st_layouts as L  # noqa: E402

HERE = Path(__file__).resolve().parent
VOCAB = 256

# --------------------------------------------------------------------------- registry


@dataclass
class Made:
    entry: dict
    originals: dict  # layer -> {"gate": [E,I,H], "up": [E,I,H], "down": [E,H,I]} float64


SAMPLES: dict[str, callable] = {}


def sample(fn):
    SAMPLES[fn.__name__.removeprefix("make_")] = fn
    return fn


def _seed_for(name: str, seed: int) -> int:
    # each sample gets its own stream, so adding a sample never changes another one's bytes
    return (seed * 1_000_003 + sum((i + 1) * ord(c) for i, c in enumerate(name))) % (2**31)


# --------------------------------------------------------------------------- transformers models

STD = ("gate_proj", "up_proj", "down_proj")
W132 = ("w1", "w3", "w2")


def _config(family: str, H: int, I: int, E: int, layers: int, **kw):
    from transformers import AutoConfig

    attn = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    mla = dict(q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)
    common = dict(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=layers, num_experts_per_tok=2)
    if family == "qwen3_moe":
        c = dict(common, **attn, intermediate_size=2 * H, moe_intermediate_size=I, num_experts=E)
    elif family in ("deepseek_v3", "glm4_moe", "glm_moe_dsa"):
        c = dict(common, **attn, moe_intermediate_size=I, intermediate_size=2 * H, n_routed_experts=E,
                 n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1)
        if family != "glm4_moe":
            c.update(mla)
        if family == "glm_moe_dsa":
            c.update(index_n_heads=2, index_head_dim=16, index_topk=8)
    elif family == "deepseek_v4":
        c = dict(common, num_attention_heads=4, num_key_value_heads=2, head_dim=16, moe_intermediate_size=I,
                 n_routed_experts=E, n_shared_experts=1, q_lora_rank=32, o_lora_rank=16, o_groups=2,
                 index_n_heads=2, index_head_dim=16, index_topk=8, num_nextn_predict_layers=0,
                 mlp_layer_types=["hash_moe"] + ["moe"] * (layers - 1))
    elif family == "gpt_oss":
        c = dict(common, **attn, intermediate_size=I, num_local_experts=E, sliding_window=8)
    elif family == "mixtral":
        c = dict(common, **attn, intermediate_size=I, num_local_experts=E)
    elif family == "glm5_next":
        text = dict(common, num_attention_heads=4, num_key_value_heads=4, intermediate_size=2 * H,
                    moe_intermediate_size=I, n_routed_experts=E, kv_lora_rank=16, q_lora_rank=32,
                    qk_rope_head_dim=0, v_head_dim=16, qk_nope_head_dim=16, index_topk=16, index_kpool=4,
                    index_head_dim=16, index_n_heads=2, linear_head_dim=16, linear_num_heads=4, pad_token_id=0,
                    mlp_layer_types=["dense"] + ["sparse"] * (layers - 1),
                    layer_types=[("full_attention" if i % 2 else "linear_attention") for i in range(layers)])
        vision = dict(depth=1, hidden_size=32, num_heads=2, image_size=8, patch_size=4, temporal_patch_size=1,
                      out_hidden_size=H, intermediate_size=32, projection_intermediate_size=32)
        return AutoConfig.for_model("glm5_next", text_config=text, vision_config=vision)
    elif family == "qwen3_5_moe":
        text = dict(common, **attn, moe_intermediate_size=I, num_experts=E, shared_expert_intermediate_size=I,
                    linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                    linear_value_head_dim=16,
                    layer_types=[("linear_attention" if i % 2 == 0 else "full_attention") for i in range(layers)])
        vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=H,
                      patch_size=4, num_position_embeddings=16)
        return AutoConfig.for_model("qwen3_5_moe", text_config=text, vision_config=vision)
    else:
        raise ValueError(family)
    c.update(kw)
    return AutoConfig.for_model(family, **c)


def _build(family: str, seed: int, H: int, I: int, E: int, layers: int, **kw):
    import transformers

    cfg = _config(family, H, I, E, layers, **kw)
    torch.manual_seed(seed)
    with _quiet():
        if family == "qwen3_5_moe":
            model = transformers.Qwen3_5MoeForConditionalGeneration(cfg)
        elif family == "glm5_next":
            model = transformers.Glm5NextForConditionalGeneration(cfg)
        else:
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    return model.to(torch.bfloat16).eval()


@contextlib.contextmanager
def _quiet():
    """transformers prints progress bars and init warnings; the script's output stays readable."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _save_tf(model, out: Path, stacked: bool) -> None:
    if out.exists():
        shutil.rmtree(out)
    with _quiet():
        model.save_pretrained(out, save_original_format=not stacked)


def _fused_originals(model) -> dict[int, dict]:
    """The model's in-memory fused experts, as canonical float64 gate/up/down per MoE layer."""
    out = {}
    gpt_oss = model.config.model_type == "gpt_oss"
    for name, p in model.named_parameters():
        if not name.endswith("experts.gate_up_proj"):
            continue
        layer = int(name.split(".layers.")[1].split(".")[0])
        gu = p.detach().double().numpy()
        down = dict(model.named_parameters())[name[: -len("gate_up_proj")] + "down_proj"].detach().double().numpy()
        if gpt_oss:  # [E, H, 2I] for x @ W, gate/up interleaved on the last axis
            gu_t = gu.transpose(0, 2, 1)
            out[layer] = {"gate": gu_t[:, 0::2], "up": gu_t[:, 1::2], "down": down.transpose(0, 2, 1)}
            continue
        I = gu.shape[1] // 2
        out[layer] = {"gate": gu[:, :I], "up": gu[:, I:], "down": down}
    return out


# --------------------------------------------------------------------------- entries


def _naming(layers="model.layers.", experts="mlp.experts", proj=STD, **kw) -> dict:
    return dict(layers=layers, experts=experts, proj=list(proj), **kw)


def _entry(name, family, layout, formats, E, H, I, num_layers, naming, writer, notes="", **kw) -> dict:
    kw.setdefault("mtp_layers", [])
    return dict(
        name=name, family=family, path=f"st/{name}", layout=layout,
        formats={str(k): v for k, v in sorted(formats.items())},
        moe_layers=sorted(formats), E=E, H=H, I=I, top_k=2, num_layers=num_layers,
        naming=naming, writer=writer, notes=notes, **kw,
    )


def _tf_writer() -> str:
    import transformers

    return f"transformers {transformers.__version__}"


def _finish(out_root: Path, entry: dict) -> dict:
    d = out_root / entry["path"]
    entry["files"] = {f.name: f.stat().st_size for f in sorted(d.iterdir())}
    entry["size"] = sum(entry["files"].values())
    return entry


def _tf_sample(name, family, out_root, seed, stacked, dims, naming, notes="", **kw) -> Made:
    model = _build(family, _seed_for(name, seed), **dims, **kw)
    out = Path(out_root) / "st" / name
    _save_tf(model, out, stacked)
    orig = _fused_originals(model)
    layout = "stacked" if stacked or family == "gpt_oss" else "per_expert"  # gpt-oss is always stacked
    entry = _entry(name, family, layout, {l: "bf16" for l in orig},
                   dims["E"], dims["H"], dims["I"], dims["layers"], naming,
                   {"experts": _tf_writer(), "non_expert": _tf_writer()}, notes)
    return Made(_finish(Path(out_root), entry), orig)


SMALL = dict(H=64, I=32, E=4, layers=3)


@sample
def make_qwen3_moe_bf16(out_dir, seed=0) -> Made:
    return _tf_sample("qwen3_moe_bf16", "qwen3_moe", out_dir, seed, False, SMALL, _naming())


@sample
def make_qwen3_moe_bf16_stacked(out_dir, seed=0) -> Made:
    return _tf_sample("qwen3_moe_bf16_stacked", "qwen3_moe", out_dir, seed, True, SMALL, _naming())


@sample
def make_qwen3_5_moe_bf16_stacked(out_dir, seed=0) -> Made:
    return _tf_sample("qwen3_5_moe_bf16_stacked", "qwen3_5_moe", out_dir, seed, True, dict(SMALL, layers=2),
                      _naming("model.language_model.layers."),
                      "Qwen3_5MoeForConditionalGeneration with a one-block vision tower (model.visual.*)")


@sample
def make_qwen3_5_moe_bf16(out_dir, seed=0) -> Made:
    return _tf_sample("qwen3_5_moe_bf16", "qwen3_5_moe", out_dir, seed, False, dict(SMALL, layers=2),
                      _naming("model.language_model.layers."),
                      "per-expert, as transformers saves it by default")


@sample
def make_deepseek_v3_bf16(out_dir, seed=0) -> Made:
    return _tf_sample("deepseek_v3_bf16", "deepseek_v3", out_dir, seed, False, SMALL, _naming(),
                      "layer 0 dense (first_k_dense_replace=1)")


@sample
def make_deepseek_v4_bf16(out_dir, seed=0) -> Made:
    return _tf_sample("deepseek_v4_bf16", "deepseek_v4", out_dir, seed, False, SMALL,
                      _naming("model.layers.", "ffn.experts", W132),
                      "transformers' own V4 names (model.layers.L.ffn.experts.e.w1.weight); layer 0 hash_moe")


def _drop_last_layer(config: dict, layers: int) -> dict:
    """Config of a model built with one extra layer, re-declared as MTP: per-layer lists cut."""
    cfg = {k: (v[:layers] if isinstance(v, list) and len(v) == layers + 1 else v) for k, v in config.items()}
    return dict(cfg, num_hidden_layers=layers, num_nextn_predict_layers=1)


@sample
def make_glm_moe_dsa_bf16(out_dir, seed=0) -> Made:
    name, dims = "glm_moe_dsa_bf16", SMALL
    layers = dims["layers"]
    # transformers has no MTP module for GLM-5, so build one more decoder layer and give it
    # the MTP extras; it then sits at index num_hidden_layers like the release's layer 78
    b = Base("glm_moe_dsa", _seed_for(name, seed), **dict(dims, layers=layers + 1))
    H = dims["H"]
    g = torch.Generator().manual_seed(_seed_for(name + "/mtp", seed))
    for k, shape in (("enorm.weight", [H]), ("hnorm.weight", [H]), ("shared_head.norm.weight", [H]),
                     ("eh_proj.weight", [H, 2 * H])):
        t = torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=g) * 0.02
        b.sd[f"model.layers.{layers}.{k}"] = t.to(torch.bfloat16)
    cfg = _drop_last_layer(b.config, layers)
    out = Path(out_dir) / "st" / name
    b.save(out, cfg)
    formats = {l: "bf16" for l in b.originals if l < layers}
    entry = _entry(name, "glm_moe_dsa", "per_expert", formats, dims["E"], dims["H"], dims["I"], layers, _naming(),
                   {"experts": _tf_writer(), "non_expert": _tf_writer() + " (+ MTP extras by make_samples)"},
                   "layer 0 dense (first_k_dense_replace=1, mlp_layer_types); MTP layer 3 (= num_hidden_layers) "
                   "with its own bf16 experts", mtp_layers=[layers])
    return Made(_finish(Path(out_dir), entry), {l: b.originals[l] for l in formats})


@sample
def make_glm5_next_bf16(out_dir, seed=0) -> Made:
    return _tf_sample("glm5_next_bf16", "glm5_next", out_dir, seed, False, SMALL,
                      _naming("model.language_model.layers."),
                      "GLM-5 Flash (Glm5NextForConditionalGeneration, one-block vision tower); layer 0 dense "
                      "(mlp_layer_types)")


@sample
def make_glm4_moe_bf16_stacked(out_dir, seed=0) -> Made:
    return _tf_sample("glm4_moe_bf16_stacked", "glm4_moe", out_dir, seed, True, SMALL, _naming(),
                      "layer 0 dense")


@sample
def make_gpt_oss_bf16(out_dir, seed=0) -> Made:
    return _tf_sample("gpt_oss_bf16", "gpt_oss", out_dir, seed, False, dict(H=64, I=64, E=4, layers=2),
                      _naming(), "gpt-oss is stacked on disk whatever save_original_format says: "
                      "gate_up_proj [E, H, 2I] interleaved, with biases")


@sample
def make_mixtral_bf16(out_dir, seed=0) -> Made:
    return _tf_sample("mixtral_bf16", "mixtral", out_dir, seed, False, SMALL,
                      _naming("model.layers.", "block_sparse_moe.experts", W132))


@sample
def make_mixtral_bf16_stacked(out_dir, seed=0) -> Made:
    return _tf_sample("mixtral_bf16_stacked", "mixtral", out_dir, seed, True, SMALL,
                      _naming("model.layers.", "mlp.experts"),
                      "stacked save renames block_sparse_moe to mlp")


# --------------------------------------------------------------------------- hand-written layouts


class Base:
    """A transformers model saved per-expert, loaded back as a state dict to be re-laid."""

    def __init__(self, family, seed, H, I, E, layers, **kw):
        import safetensors.torch as st

        self.model = _build(family, seed, H=H, I=I, E=E, layers=layers, **kw)
        self.originals = _fused_originals(self.model)
        with tempfile.TemporaryDirectory() as tmp:
            _save_tf(self.model, Path(tmp) / "m", stacked=False)
            self.sd = dict(st.load_file(Path(tmp) / "m" / "model.safetensors"))
            self.config = json.loads((Path(tmp) / "m" / "config.json").read_text())
            gen = Path(tmp) / "m" / "generation_config.json"
            self.generation = gen.read_text() if gen.exists() else None

    def pop_experts(self, pre: str) -> None:
        for k in [k for k in self.sd if k.startswith(pre + ".")]:
            del self.sd[k]

    def save(self, out: Path, config: dict, shards: list[list[str]] | None = None, extra_files=None) -> None:
        import safetensors.torch as st

        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if self.generation is not None:
            (out / "generation_config.json").write_text(self.generation)
        for fname, obj in (extra_files or {}).items():
            (out / fname).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        sd = {k: v.contiguous() for k, v in sorted(self.sd.items())}
        if not shards:
            st.save_file(sd, out / "model.safetensors", metadata={"format": "pt"})
            return
        n = len(shards)
        weight_map, total = {}, 0
        for i, keys in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            part = {k: sd[k] for k in keys}
            st.save_file(part, out / fname, metadata={"format": "pt"})
            weight_map.update({k: fname for k in part})
            total += sum(v.numel() * v.element_size() for v in part.values())
        assert set(weight_map) == set(sd), "every tensor goes to exactly one shard"
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def _u8(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.uint8))


def _put_expert(sd: dict, base: str, fmt: str, w: np.ndarray, scale_suffix: str = ".weight_scale_inv",
                input_scale: float = 4.0 / (6 * 448)) -> None:
    """Write one expert projection (float64 [out, in]) in `fmt` under module name `base`."""
    if fmt == "bf16":
        sd[base + ".weight"] = L.to_bf16(w)
    elif fmt == "fp8_block":
        q, s = L.quant_fp8_block(w)
        sd[base + ".weight"] = _u8(q).view(torch.float8_e4m3fn)
        sd[base + scale_suffix] = torch.from_numpy(s)
    elif fmt == "nvfp4":
        q, s, s2 = L.quant_nvfp4_modelopt(w)
        sd[base + ".weight"] = _u8(q)
        sd[base + ".weight_scale"] = _u8(s).view(torch.float8_e4m3fn)
        sd[base + ".weight_scale_2"] = torch.tensor(s2, dtype=torch.float32)
        sd[base + ".input_scale"] = torch.tensor(input_scale, dtype=torch.float32)
    elif fmt == "ds_fp4":
        q, s = L.quant_e8m0_fp4(w, 32)
        sd[base + ".weight"] = _u8(q).view(torch.int8)
        sd[base + ".scale"] = _u8(s).view(torch.float8_e8m0fnu)
    else:
        raise ValueError(fmt)


def _write_per_expert(b: Base, naming: dict, formats: dict[int, str], scale_suffix=".weight_scale_inv") -> None:
    for layer, fmt in formats.items():
        pre = f"{naming['layers']}{layer}.{naming['experts']}"
        b.pop_experts(pre)
        o = b.originals[layer]
        for e in range(o["gate"].shape[0]):
            for p, pname in zip(L.PROJ, naming["proj"]):
                _put_expert(b.sd, f"{pre}.{e}.{pname}", fmt, o[p][e], scale_suffix)


def _fp8_linears(sd: dict, keep) -> list[str]:
    """Block-FP8 every 2-D `.weight` that `keep` rejects, as DeepSeek/Qwen FP8 releases do."""
    done = []
    for k in sorted(sd):
        v = sd[k]
        if not k.endswith(".weight") or v.ndim != 2 or v.dtype != torch.bfloat16 or keep(k):
            continue
        _put_expert(sd, k[: -len(".weight")], "fp8_block", v.double().numpy())
        done.append(k[: -len(".weight")])
    return done


FP8_QCONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
MODELOPT_PRODUCER = {"name": "modelopt", "version": "0.47.0"}
NUMPY_WRITER = "samples/st_layouts.py (numpy, from LAYOUTS.md)"


def _hand_entry(name, family, layout, formats, dims, naming, notes, non_expert="transformers", **kw):
    ne = _tf_writer() if non_expert == "transformers" else non_expert
    return _entry(name, family, layout, formats, dims["E"], dims["H"], dims["I"], dims["layers"], naming,
                  {"experts": NUMPY_WRITER if any(f != "bf16" for f in formats.values()) else _tf_writer(),
                   "non_expert": ne}, notes, **kw)


def _modelopt_nvfp4(name, out_dir, seed, formats, dims, notes) -> Made:
    b = Base("qwen3_moe", _seed_for(name, seed), **dims)
    naming = _naming()
    _write_per_expert(b, naming, formats)
    bf16_layers = [l for l, f in formats.items() if f == "bf16"]
    exclude = ["lm_head", "model.layers.*.self_attn*", "model.layers.*.mlp.gate"]
    exclude += [f"model.layers.{l}.mlp.experts*" for l in bf16_layers]
    quant = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": exclude}
    cfg = dict(b.config, quantization_config=dict(quant, quant_method="modelopt", producer=MODELOPT_PRODUCER))
    out = Path(out_dir) / "st" / name
    b.save(out, cfg, extra_files={"hf_quant_config.json": {"producer": MODELOPT_PRODUCER, "quantization": quant}})
    entry = _hand_entry(name, "qwen3_moe", "per_expert", formats, dims, naming, notes)
    return Made(_finish(Path(out_dir), entry), b.originals)


@sample
def make_qwen3_moe_nvfp4_modelopt(out_dir, seed=0) -> Made:
    return _modelopt_nvfp4("qwen3_moe_nvfp4_modelopt", out_dir, seed, {0: "nvfp4", 1: "nvfp4", 2: "nvfp4"}, SMALL,
                           "ModelOpt NVFP4 experts only; attention, router, embeddings bf16 (exclude_modules)")


MIXED_DIMS = dict(H=128, I=64, E=8, layers=4)


@sample
def make_mixed_bf16_nvfp4(out_dir, seed=0) -> Made:
    return _modelopt_nvfp4("mixed_bf16_nvfp4", out_dir, seed, {0: "bf16", 1: "nvfp4", 2: "nvfp4", 3: "bf16"},
                           MIXED_DIMS, "README demo: bf16 first and last MoE layers (in exclude_modules), "
                           "ModelOpt NVFP4 in between")


@sample
def make_mixed_fp8_nvfp4(out_dir, seed=0) -> Made:
    name, dims = "mixed_fp8_nvfp4", dict(H=64, I=32, E=4, layers=4)
    formats = {0: "fp8_block", 1: "nvfp4", 2: "nvfp4", 3: "fp8_block"}
    b = Base("qwen3_moe", _seed_for(name, seed), **dims)
    naming = _naming()
    _write_per_expert(b, naming, formats)
    nv_modules = [f"model.layers.{l}.mlp.experts.{e}.{p}" for l, f in formats.items() if f == "nvfp4"
                  for e in range(dims["E"]) for p in STD]
    # no library writes this mix; the config follows a Qwen FP8 release (block FP8 is the
    # checkpoint's base) and ModelOpt's MIXED_PRECISION map names the NVFP4 modules
    qc = dict(FP8_QCONFIG, modules_to_not_convert=["lm_head", "model.layers.*.self_attn*", "model.layers.*.mlp.gate"]
              + [f"model.layers.{l}.mlp.experts*" for l, f in formats.items() if f == "nvfp4"])
    hf_quant = {"producer": MODELOPT_PRODUCER, "quantization": {
        "quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None,
        "quantized_layers": {m: {"quant_algo": "NVFP4", "group_size": 16} for m in nv_modules}}}
    out = Path(out_dir) / "st" / name
    b.save(out, dict(b.config, quantization_config=qc), extra_files={"hf_quant_config.json": hf_quant})
    entry = _hand_entry(name, "qwen3_moe", "per_expert", formats, dims, naming,
                        "block FP8 (I=32 < 128: one partial block) layers 0 and 3, ModelOpt NVFP4 layers 1-2; "
                        "hf_quant_config MIXED_PRECISION lists the NVFP4 modules")
    return Made(_finish(Path(out_dir), entry), b.originals)


def _deepseek_fp8(name, out_dir, seed, dims, formats, mtp: bool, shards: bool, notes) -> Made:
    layers = dims["layers"]
    b = Base("deepseek_v3", _seed_for(name, seed), **dict(dims, layers=layers + int(mtp)))
    naming = _naming()
    all_formats = dict(formats)
    if mtp:  # the MTP block sits at index num_hidden_layers with its own experts
        all_formats[layers] = "fp8_block"
        H = dims["H"]
        g = torch.Generator().manual_seed(_seed_for(name + "/mtp", seed))
        for k, shape in (("enorm.weight", [H]), ("hnorm.weight", [H]), ("shared_head.norm.weight", [H]),
                         ("eh_proj.weight", [H, 2 * H]), ("shared_head.head.weight", [VOCAB, H])):
            t = torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=g) * 0.02
            b.sd[f"model.layers.{layers}.{k}"] = t.to(torch.bfloat16)
    _write_per_expert(b, naming, all_formats)
    bf16_mods = [f"model.layers.{l}.mlp.experts" for l, f in formats.items() if f == "bf16"]
    _fp8_linears(b.sd, lambda k: (".mlp.gate." in k or "embed_tokens" in k or "lm_head" in k or "shared_head.head" in k
                                  or any(k.startswith(m + ".") for m in bf16_mods)))
    qc = dict(FP8_QCONFIG)
    if bf16_mods:
        qc["modules_to_not_convert"] = bf16_mods
    # without an MTP block say so: transformers' default of 1 would promise a layer that is absent
    cfg = _drop_last_layer(b.config, layers) if mtp else dict(b.config, num_nextn_predict_layers=0)
    cfg["quantization_config"] = qc
    split = None
    if shards:  # one shard for the first half of the layers, one for the rest: exercises the index
        half = (layers + int(mtp)) // 2
        first = [k for k in b.sd if k.startswith("model.embed") or
                 (k.startswith("model.layers.") and int(k.split(".")[2]) < half)]
        split = [sorted(first), sorted(set(b.sd) - set(first))]
    out = Path(out_dir) / "st" / name
    b.save(out, cfg, split)
    originals = {l: b.originals[l] for l in formats}
    entry = _hand_entry(name, "deepseek_v3", "per_expert", formats, dims, naming, notes,
                        non_expert=f"{_tf_writer()} (linears block FP8 by {NUMPY_WRITER})",
                        mtp_layers=[layers] if mtp else [])
    return Made(_finish(Path(out_dir), entry), originals)


@sample
def make_deepseek_v3_fp8(out_dir, seed=0) -> Made:
    return _deepseek_fp8("deepseek_v3_fp8", out_dir, seed, dict(H=192, I=160, E=4, layers=3, intermediate_size=160),
                         {1: "fp8_block", 2: "fp8_block"}, mtp=True, shards=True,
                         notes="H=192, I=160: partial 128-blocks on both axes; layer 0 dense; MTP layer 3 "
                         "(num_hidden_layers=3) with its own FP8 experts; two shards + index; "
                         "attention/dense/shared linears block FP8 like the real release")


@sample
def make_mixed_deepseek_v3_bf16_fp8(out_dir, seed=0) -> Made:
    return _deepseek_fp8("mixed_deepseek_v3_bf16_fp8", out_dir, seed, dict(H=128, I=96, E=4, layers=4),
                         {1: "fp8_block", 2: "bf16", 3: "fp8_block"}, mtp=False, shards=False,
                         notes="layer 2's per-expert experts stay bf16 (quantization_config."
                         "modules_to_not_convert); I=96: one partial block")


@sample
def make_qwen3_5_moe_fp8(out_dir, seed=0) -> Made:
    name, dims = "qwen3_5_moe_fp8", dict(SMALL, layers=2)
    b = Base("qwen3_5_moe", _seed_for(name, seed), **dims)
    naming = _naming("model.language_model.layers.")
    formats = {l: "fp8_block" for l in b.originals}
    _write_per_expert(b, naming, formats)
    keep = ("model.visual", "lm_head", "embed_tokens", ".mlp.gate.", "shared_expert_gate", "linear_attn")
    _fp8_linears(b.sd, lambda k: any(s in k for s in keep))
    qc = dict(FP8_QCONFIG, modules_to_not_convert=["model.visual", "lm_head", "model.language_model.embed_tokens",
                                                   "mlp.gate", "mlp.shared_expert_gate", "linear_attn"])
    out = Path(out_dir) / "st" / name
    b.save(out, dict(b.config, quantization_config=qc))
    entry = _hand_entry(name, "qwen3_5_moe", "per_expert", formats, dims, naming,
                        "per-expert block FP8 under model.language_model. (LAYOUTS.md: unverified layout); "
                        "self_attn and shared_expert linears FP8, linear_attn and vision bf16",
                        non_expert=f"{_tf_writer()} (some linears block FP8 by {NUMPY_WRITER})")
    return Made(_finish(Path(out_dir), entry), b.originals)


def _gpt_oss(name, out_dir, seed, formats, dims, notes) -> Made:
    b = Base("gpt_oss", _seed_for(name, seed), **dims)
    E, H, I = dims["E"], dims["H"], dims["I"]
    for layer, fmt in formats.items():
        if fmt == "bf16":
            continue  # transformers already wrote the stacked bf16 form
        pre = f"model.layers.{layer}.mlp.experts"
        gu_bias = b.sd.pop(pre + ".gate_up_proj_bias")
        del b.sd[pre + ".gate_up_proj"], b.sd[pre + ".down_proj"]
        o = b.originals[layer]
        # on disk gate/up rows are interleaved: row 2j is gate j, row 2j+1 is up j
        gu = np.empty((E, 2 * I, H))
        gu[:, 0::2], gu[:, 1::2] = o["gate"], o["up"]
        for p, w in (("gate_up_proj", gu), ("down_proj", o["down"])):
            qs = [L.quant_e8m0_fp4(w[e], 32) for e in range(E)]
            blocks = np.stack([q for q, _ in qs]).reshape(E, w.shape[1], w.shape[2] // 32, 16)
            b.sd[f"{pre}.{p}_blocks"] = _u8(blocks)
            b.sd[f"{pre}.{p}_scales"] = _u8(np.stack([s for _, s in qs]))
        b.sd[pre + ".gate_up_proj_bias"] = gu_bias
    bf16_layers = [l for l, f in formats.items() if f == "bf16"]
    qc = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                              "model.embed_tokens", "lm_head"]
          + [f"model.layers.{l}.mlp.experts" for l in bf16_layers]}
    out = Path(out_dir) / "st" / name
    b.save(out, dict(b.config, quantization_config=qc))
    entry = _hand_entry(name, "gpt_oss", "stacked", formats, dims, _naming(), notes,
                        activation={"swiglu_limit": b.config.get("swiglu_limit", 7.0), "swiglu_alpha": 1.702})
    return Made(_finish(Path(out_dir), entry), b.originals)


@sample
def make_gpt_oss_mxfp4(out_dir, seed=0) -> Made:
    return _gpt_oss("gpt_oss_mxfp4", out_dir, seed, {0: "mxfp4", 1: "mxfp4"}, dict(H=64, I=64, E=4, layers=2),
                    "gate_up rows interleaved (even gate, odd up); biases bf16")


@sample
def make_mixed_gpt_oss_mxfp4_bf16(out_dir, seed=0) -> Made:
    return _gpt_oss("mixed_gpt_oss_mxfp4_bf16", out_dir, seed, {0: "bf16", 1: "mxfp4", 2: "mxfp4"},
                    dict(H=64, I=64, E=4, layers=3),
                    "layer 0 experts bf16 (transposed, interleaved, modules_to_not_convert), layers 1-2 MXFP4")


def _deepseek_v4_native(name, out_dir, seed, expert_dtype, notes) -> Made:
    dims = SMALL
    b = Base("deepseek_v4", _seed_for(name, seed), **dims)
    formats = {l: ("ds_fp4" if expert_dtype == "fp4" else "fp8_block") for l in b.originals}
    # transformers writes model.-prefixed names; the official release has none
    renamed = {}
    for k, v in b.sd.items():
        if k == "model.embed_tokens.weight":
            k = "embed.weight"
        elif k.startswith("model."):
            k = k[len("model."):]
        renamed[k] = v
    b.sd = renamed
    naming = _naming("layers.", "ffn.experts", W132, scale_suffix=".scale")
    _write_per_expert(b, naming, formats, scale_suffix=".scale")
    cfg = dict(b.config, expert_dtype=expert_dtype,
               quantization_config=dict(FP8_QCONFIG, scale_fmt="ue8m0", expert_dtype=expert_dtype))
    out = Path(out_dir) / "st" / name
    b.save(out, cfg)
    entry = _hand_entry(name, "deepseek_v4", "per_expert", formats, dims, naming, notes,
                        act_block=128 if expert_dtype == "fp4" else None)
    return Made(_finish(Path(out_dir), entry), b.originals)


@sample
def make_deepseek_v4_fp4(out_dir, seed=0) -> Made:
    return _deepseek_v4_native("deepseek_v4_fp4", out_dir, seed, "fp4",
                               "native names (layers.L.ffn.experts.e.w1.weight I8 + .scale F8_E8M0); "
                               "non-expert tensors are transformers' with model. stripped, left bf16 "
                               "(the release stores those linears block FP8)")


@sample
def make_deepseek_v4_fp8(out_dir, seed=0) -> Made:
    return _deepseek_v4_native("deepseek_v4_fp8", out_dir, seed, "fp8",
                               "native names, expert_dtype fp8: .weight F8_E4M3 + .scale F32 128x128 blocks")


# --------------------------------------------------------------------------- compressed-tensors


# compressed-tensors schemes the samples use: its preset, its format name, the ftw format
CT_SCHEMES = {"nvfp4": ("NVFP4", "nvfp4-pack-quantized"), "mxfp8": ("MXFP8", "mxfp8-quantized")}


def _ct_quantized(name, out_dir, seed, dims, bf16_layers, notes, scheme="nvfp4") -> Made:
    """Quantize with compressed-tensors' own API: its config, its qparam math, its compressor."""
    import compressed_tensors
    from compressed_tensors.compressors.model_compressors.model_compressor import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme, apply_quantization_config
    from compressed_tensors.quantization import quant_scheme as presets
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    preset, fmt = CT_SCHEMES[scheme]
    b = Base("qwen3_moe", _seed_for(name, seed), **dims)
    # compressed-tensors only quantizes nn.Linear, and transformers 5 fuses the experts into
    # one parameter, so the per-expert tensors transformers saved become a tree of Linears
    # with the same names (what llm-compressor's MoE calibration does by unfusing)
    root = torch.nn.Module()
    for k, v in sorted(b.sd.items()):
        if not (k.endswith(".weight") and v.ndim == 2) or "embed_tokens" in k:
            continue
        lin = torch.nn.Linear(v.shape[1], v.shape[0], bias=False, dtype=v.dtype)
        lin.weight.data.copy_(v)
        *parents, leaf = k[: -len(".weight")].split(".")
        node = root
        for p in parents:
            if not hasattr(node, p):
                node.add_module(p, torch.nn.Module())
            node = getattr(node, p)
        node.add_module(leaf, lin)
    ignore = ["lm_head", "re:.*mlp.gate$"] + [f"re:model\\.layers\\.{l}\\.mlp\\.experts\\..*" for l in bf16_layers]
    qscheme = QuantizationScheme(targets=["Linear"], format=fmt, **getattr(presets, preset))
    cfg = QuantizationConfig(config_groups={"group_0": qscheme}, ignore=ignore, format=fmt,
                             quantization_status="initialized")
    apply_quantization_config(root, cfg, show_progress=False)
    for _, m in root.named_modules():
        if not hasattr(m, "quantization_scheme"):
            continue
        # what llm-compressor's static min-max observer computes for weights
        w = m.weight.data.float()
        g = generate_gparam(w.min(), w.max()) if scheme == "nvfp4" else None
        gs = m.quantization_scheme.weights.group_size
        groups = w.reshape(w.shape[0], -1, gs)
        scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), m.quantization_scheme.weights, global_scale=g)
        m.weight_scale.data.copy_(scale.to(m.weight_scale.dtype))
        if scheme == "nvfp4":
            m.weight_global_scale.data.copy_(g)
            # activations are calibrated on data in practice; a fixed amax of 4 stands in
            m.input_global_scale.data.copy_(generate_gparam(torch.tensor(-4.0), torch.tensor(4.0)))
    comp = ModelCompressor(quantization_config=cfg)
    with _quiet():
        comp.compress_model(root)
    for k in [k for k in b.sd if k.endswith(".weight") and b.sd[k].ndim == 2 and "embed_tokens" not in k]:
        del b.sd[k]
    b.sd.update({k: v.detach().clone() for k, v in root.state_dict().items()})
    out = Path(out_dir) / "st" / name
    b.save(out, b.config)
    comp.update_config(str(out))  # the library writes its own quantization_config into config.json
    formats = {l: ("bf16" if l in bf16_layers else scheme) for l in b.originals}
    naming = _naming(**{scheme: "compressed-tensors"})
    writer = f"compressed-tensors {compressed_tensors.__version__}"
    entry = _entry(name, "qwen3_moe", "per_expert", formats, dims["E"], dims["H"], dims["I"], dims["layers"], naming,
                   {"experts": writer, "non_expert": f"{_tf_writer()}; attention linears {preset} by {writer}"}, notes)
    return Made(_finish(Path(out_dir), entry), b.originals)


@sample
def make_qwen3_moe_nvfp4_ct(out_dir, seed=0) -> Made:
    return _ct_quantized("qwen3_moe_nvfp4_ct", out_dir, seed, SMALL, [],
                     "nvfp4-pack-quantized; every Linear but lm_head and routers (the llm-compressor recipe)")


@sample
def make_mixed_ct_bf16_nvfp4(out_dir, seed=0) -> Made:
    return _ct_quantized("mixed_ct_bf16_nvfp4", out_dir, seed, dict(SMALL, layers=4), [0, 3],
                     "compressed-tensors with layers 0 and 3's experts in `ignore` (bf16 per-expert)")


@sample
def make_qwen3_moe_mxfp8_ct(out_dir, seed=0) -> Made:
    return _ct_quantized("qwen3_moe_mxfp8_ct", out_dir, seed, SMALL, [],
                         "mxfp8-quantized (MXFP8 preset): e4m3 weights + U8 E8M0 weight_scale per 32; every "
                         "Linear but lm_head and routers", scheme="mxfp8")


# --------------------------------------------------------------------------- MLX


def _mx_from_torch(t: torch.Tensor):
    """A torch tensor as an mlx array with the same bits (numpy has no bf16: go through int16)."""
    import mlx.core as mx

    if t.dtype == torch.bfloat16:
        return mx.array(t.view(torch.int16).numpy()).view(mx.bfloat16)
    return mx.array(t.numpy())


def _mlx(name, family, out_dir, seed, dims, naming, layer_quant, default, notes, mode="affine") -> Made:
    """mlx-lm's layout, quantized by mlx itself: experts stacked as switch_mlp.{gate,up,down}_proj
    [E, out, in] and every Linear and Embedding whose input width is a multiple of the group
    size replaced by mx.quantize's (weight u32, scales[, biases]), as mlx-lm's default predicate
    does; written by mx.save_safetensors with mlx-lm's metadata. `layer_quant` overrides
    (bits, group_size) per MoE layer, recorded in config.json the way mlx-lm records
    per-module quantization. mode "affine" -> ftw affine; "mxfp8" (no biases) -> ftw mxfp8."""
    try:
        import mlx.core as mx
    except ImportError as e:
        raise ImportError(f"{name} is written by mlx: pip install 'mlx[cpu]' (Linux) or mlx (macOS), "
                          f"as the dev extra does") from e

    def quantize(w, gs, bits):  # -> (weight, scales, biases), (weight, scales) for mxfp8
        return mx.quantize(w, group_size=gs, bits=bits, mode=mode)

    b = Base(family, _seed_for(name, seed), **dims)
    bits0, gs0 = default
    quant = {"group_size": gs0, "bits": bits0, **({"mode": mode} if mode != "affine" else {})}
    arrays = {}
    for k, v in sorted(b.sd.items()):
        if "experts." in k:
            continue  # the per-expert tensors transformers saved: restacked below
        w = _mx_from_torch(v)
        if k.endswith(".weight") and v.ndim == 2 and v.shape[1] % gs0 == 0 and "norm" not in k:
            for part, a in zip(("weight", "scales", "biases"), quantize(w, gs0, bits0)):
                arrays[k[: -len("weight")] + part] = a
        else:
            arrays[k] = w
    formats, options = {}, {}
    for layer, o in b.originals.items():
        bits, gs = layer_quant.get(layer, default)
        pre = f"{naming['layers']}{layer}.{naming['experts']}"
        for p, pname in zip(L.PROJ, naming["proj"]):
            stacked = _mx_from_torch(L.to_bf16(o[p]))  # [E, out, in], the model's bf16 bits
            for part, a in zip(("weight", "scales", "biases"), quantize(stacked, gs, bits)):
                arrays[f"{pre}.{pname}.{part}"] = a
            if (bits, gs) != default:
                quant[f"{pre}.{pname}"] = {"group_size": gs, "bits": bits}
        formats[layer] = mode
        if mode == "affine":
            options[str(layer)] = {"bits": bits, "group_size": gs}
    mx.eval(arrays)
    out = Path(out_dir) / "st" / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    # mlx-lm writes the quantization twice: its own key and the Hugging Face one
    cfg = dict(b.config, quantization=quant, quantization_config=quant)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    mx.save_safetensors(str(out / "model.safetensors"), dict(sorted(arrays.items())), metadata={"format": "mlx"})
    writer = f"mlx {mx.__version__}"
    entry = _entry(name, family, "stacked", formats, dims["E"], dims["H"], dims["I"], dims["layers"], naming,
                   {"experts": writer, "non_expert": f"{_tf_writer()}; linears and embeddings quantized by {writer}"},
                   notes, **({"options": options} if options else {}))
    return Made(_finish(Path(out_dir), entry), b.originals)


@sample
def make_qwen3_moe_affine(out_dir, seed=0) -> Made:
    return _mlx("qwen3_moe_affine", "qwen3_moe", out_dir, seed, dict(H=128, I=64, E=4, layers=2),
                _naming("model.layers.", "mlp.switch_mlp"), {}, (4, 64),
                "mlx-lm layout (switch_mlp), 4-bit group 64 everywhere (experts, attention, router, "
                "embeddings, lm_head); scales/biases bf16")


@sample
def make_mixtral_affine_mixed(out_dir, seed=0) -> Made:
    return _mlx("mixtral_affine_mixed", "mixtral", out_dir, seed, dict(H=64, I=32, E=4, layers=2),
                _naming("model.layers.", "block_sparse_moe.switch_mlp"), {1: (6, 32)}, (3, 32),
                "mlx-lm mixtral layout (block_sparse_moe.switch_mlp); 3-bit group 32, layer 1's "
                "experts 6-bit (per-module entries in config.json quantization)")


@sample
def make_qwen3_moe_mxfp8_mlx(out_dir, seed=0) -> Made:
    return _mlx("qwen3_moe_mxfp8_mlx", "qwen3_moe", out_dir, seed, dict(SMALL, layers=2),
                _naming("model.layers.", "mlp.switch_mlp"), {}, (8, 32),
                "mlx-lm layout (switch_mlp), mode mxfp8 everywhere: weight U32 [E, out, in/4] (four e4m3 "
                "bytes per word), scales U8 E8M0 per 32, no biases", mode="mxfp8")


# --------------------------------------------------------------------------- all


BEGIN, END = "<!-- st-samples:begin (written by make_samples.py) -->", "<!-- st-samples:end -->"


def _fmt_layers(e: dict) -> str:
    runs, prev = [], None
    for l, f in e["formats"].items():
        opts = e.get("options", {}).get(l)  # format options where the manifest records them (affine)
        f += "{" + ",".join(f"{k}={v}" for k, v in sorted(opts.items())) + "}" if opts else ""
        if runs and f == prev:
            runs[-1][1] = l
        else:
            runs.append([l, l, f])
        prev = f
    return ", ".join(f"{a}: {f}" if a == b else f"{a}-{b}: {f}" for a, b, f in runs)


def _writer_cell(e: dict) -> str:
    w = e["writer"]["experts"]
    if w == NUMPY_WRITER:
        w = "numpy (st_layouts.py)"
        if "bf16" in e["formats"].values():
            w += "; bf16 layers: transformers"
    elif w.startswith("compressed-tensors") and "bf16" in e["formats"].values():
        w += "; bf16 layers: transformers"
    return w


def readme_table(manifest: dict) -> str:
    rows = ["| sample | family | layout | MoE layer: format | E / H / I | experts written by | size |",
            "|---|---|---|---|---|---|---|"]
    for name, e in manifest["samples"].items():
        layout = e["layout"].replace("_", "-")
        layout += " (native names)" if e["naming"]["layers"] == "layers." else ""
        layout += " (sharded)" if any("-of-" in f for f in e["files"]) else ""
        extra = f"; MTP layer {e['mtp_layers'][0]}" if e.get("mtp_layers") else ""
        rows.append(f"| `{name}` | {e['family']} | {layout} | {_fmt_layers(e)}{extra} | "
                    f"{e['E']} / {e['H']} / {e['I']} | {_writer_cell(e)} | {e['size'] / 1024:.0f} KiB |")
    total = sum(e["size"] for e in manifest["samples"].values())
    rows.append(f"\n{len(manifest['samples'])} samples, {total / 1e6:.2f} MB, seed {manifest['seed']}.")
    return "\n".join(rows)


def _update_readme(path: Path, manifest: dict) -> None:
    """Rewrite only the generated table; the prose around it is edited by hand."""
    if not path.exists():
        return
    text = path.read_text()
    if BEGIN not in text or END not in text:
        return
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(head + BEGIN + "\n" + readme_table(manifest) + "\n" + END + tail)


def made_with() -> dict:
    """Library versions the bytes depend on: another version may init or pack differently."""
    import compressed_tensors
    import safetensors
    import transformers

    out = {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__,
           "compressed-tensors": compressed_tensors.__version__, "safetensors": safetensors.__version__,
           "numpy": np.__version__}
    with contextlib.suppress(ImportError):  # the MLX samples need it (dev extra, Linux/macOS)
        import mlx.core as mx

        out["mlx"] = mx.__version__
    return out


def make_sample(name: str, out_dir, seed: int = 0) -> Made:
    return SAMPLES[name](Path(out_dir), seed)


def make_all(out_dir=HERE, seed: int = 0, only: list[str] | None = None) -> dict:
    out_dir = Path(out_dir)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    manifest_path = out_dir / "manifest.json"
    old = json.loads(manifest_path.read_text())["samples"] if (only and manifest_path.exists()) else {}
    entries = dict(old)
    for name in SAMPLES:
        if only and name not in only:
            continue
        entries[name] = make_sample(name, out_dir, seed).entry
        print(f"  {name:32s} {entries[name]['size'] / 1024:7.0f} KiB")
    manifest = {"seed": seed, "made_with": made_with(), "samples": {k: entries[k] for k in SAMPLES if k in entries}}
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    _update_readme(out_dir / "README.md", manifest)
    return manifest


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args(argv)
    m = make_all(a.out, a.seed, a.only)
    print(f"{len(m['samples'])} samples, {sum(e['size'] for e in m['samples'].values()) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
