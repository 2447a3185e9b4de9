"""A large synthetic mixed checkpoint for the benchmarks, in the exact on-disk layout of a
qwen3_moe ModelOpt NVFP4 release with its first and last MoE layers left in bf16.

The values are realistic enough for compression figures to mean something: bf16 weights
are normal(0, 0.02) rounded to bf16, FP4 codes follow what quantizing normal values gives,
and scales sit in a narrow e4m3 range. One pool of such bytes per kind is drawn once and
sliced per tensor (zstd compresses rows independently, so the reuse does not help it).
"""

from __future__ import annotations

import json
import os

import numpy as np
from safetensors.torch import save_file


def _pools(rng, n: int) -> dict[str, np.ndarray]:
    bf16 = (rng.standard_normal(n // 2, dtype=np.float32) * 0.02).view(np.uint32)
    bf16 = ((bf16 + 0x8000) >> 16).astype(np.uint16)  # round to nearest bf16
    # FP4 codes of N(0,1)/block-max quantization: small magnitudes dominate
    mags = np.array([0.16, 0.26, 0.22, 0.14, 0.10, 0.07, 0.03, 0.02])
    codes = rng.choice(16, size=n * 2, p=np.concatenate([mags, mags]) / 2).astype(np.uint8)
    fp4 = codes[0::2] | (codes[1::2] << 4)
    scale = rng.integers(0x30, 0x48, n // 8, dtype=np.uint8)  # e4m3 around 2^-1..2^1
    return {"bf16": bf16, "fp4": fp4, "scale": scale}


def _take(pool: np.ndarray, shape, rng) -> np.ndarray:
    n = int(np.prod(shape))
    start = int(rng.integers(0, pool.size - n))
    return pool[start : start + n].reshape(shape).copy()


def make_checkpoint(out: str, *, layers: int = 16, experts: int = 64, hidden: int = 2048,
                    inter: int = 768, seed: int = 0) -> dict:
    """Writes one shard per layer; returns {"nbytes", "expert_nbytes", "layers"}."""
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    pools = _pools(rng, max(hidden * inter * 2, 64 << 20))
    H, I, E = hidden, inter, experts
    bf16_layers = {0, layers - 1}
    weight_map: dict[str, str] = {}
    expert_nbytes = 0
    for L in range(layers):
        tensors: dict[str, np.ndarray] = {}
        p = f"model.layers.{L}."
        tensors[p + "input_layernorm.weight"] = _take(pools["bf16"], (H,), rng)
        tensors[p + "post_attention_layernorm.weight"] = _take(pools["bf16"], (H,), rng)
        for proj, shape in (("q_proj", (H, H)), ("k_proj", (H // 4, H)), ("v_proj", (H // 4, H)), ("o_proj", (H, H))):
            tensors[p + f"self_attn.{proj}.weight"] = _take(pools["bf16"], shape, rng)
        tensors[p + "mlp.gate.weight"] = _take(pools["bf16"], (E, H), rng)
        for e in range(E):
            for proj, (o, i) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                q = p + f"mlp.experts.{e}.{proj}."
                if L in bf16_layers:
                    tensors[q + "weight"] = _take(pools["bf16"], (o, i), rng)
                else:
                    tensors[q + "weight"] = _take(pools["fp4"], (o, i // 2), rng)
                    tensors[q + "weight_scale"] = _take(pools["scale"], (o, i // 16), rng)
                    tensors[q + "weight_scale_2"] = np.array(rng.random() * 1e-3 + 1e-4, dtype=np.float32)
                    tensors[q + "input_scale"] = np.array(1.0, dtype=np.float32)
        for k, v in tensors.items():
            if "experts" in k and not k.endswith("input_scale"):
                expert_nbytes += v.nbytes
        shard = f"model-{L + 1:05d}-of-{layers:05d}.safetensors"
        save_file(_typed(tensors), os.path.join(out, shard))
        weight_map.update({k: shard for k in tensors})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    excluded = [f"model.layers.{L}.mlp.experts*" for L in sorted(bf16_layers)] + ["lm_head"]
    config = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": H, "moe_intermediate_size": I, "num_experts": E, "num_experts_per_tok": 8,
        "num_hidden_layers": layers, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "intermediate_size": I * 4, "num_attention_heads": 16, "num_key_value_heads": 4,
        "head_dim": H // 16, "vocab_size": 1024, "hidden_act": "silu", "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                "exclude_modules": excluded},
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(out, "hf_quant_config.json"), "w") as f:
        json.dump({"producer": {"name": "modelopt"},
                   "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": excluded}}, f)
    total = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out))
    return {"nbytes": total, "expert_nbytes": expert_nbytes, "layers": layers}


def _typed(tensors: dict[str, np.ndarray]) -> dict:
    """safetensors.numpy knows no bf16/e4m3: save through torch views with the real dtypes."""
    import torch

    out = {}
    for k, v in tensors.items():
        t = torch.from_numpy(v)
        if v.dtype == np.uint16:
            t = t.view(torch.bfloat16)
        elif k.endswith("weight_scale"):
            t = t.view(torch.float8_e4m3fn)
        out[k] = t
    return out
