"""Large synthetic checkpoints for the benchmarks, one per source layout, in the exact on-disk
form of the real thing (tensor names, dtypes, shard order as safetensors writes them).

    make_layout(out, "per_expert", size_gib=3.2, hidden=1024, inter=512)

Layouts: per_expert (qwen3_moe bf16, one tensor per expert and projection), stacked (the
same model in transformers 5's fused [E, 2I, H] form), nvfp4 (ModelOpt NVFP4 with its first
and last MoE layers in bf16: ``make_checkpoint``), gpt_oss_bf16 ([E, H, 2I] interleaved, with
biases), gguf (a Q4_K_M-style qwen3moe GGUF, bench/bench_gguf.py's maker).

The values are realistic enough for compression figures to mean something: bf16 weights
are normal(0, 0.02) rounded to bf16, FP4 codes follow what quantizing normal values gives,
and scales sit in a narrow e4m3 range. One pool of such bytes per kind is drawn once and
sliced per tensor (zstd compresses rows independently, so the reuse does not help it).
Files are written directly (header + slices of the pools), without torch or a copy.
"""

from __future__ import annotations

import json
import os

import numpy as np

GiB = 1 << 30
LAYOUTS = ("per_expert", "stacked", "nvfp4", "gguf", "gpt_oss_bf16")
ITEMSIZE = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}


def _pools(rng, n: int) -> dict[str, np.ndarray]:
    bf16 = (rng.standard_normal(n // 2, dtype=np.float32) * 0.02).view(np.uint32)
    bf16 = ((bf16 + 0x8000) >> 16).astype(np.uint16)  # round to nearest bf16
    # FP4 codes of N(0,1)/block-max quantization: small magnitudes dominate
    mags = np.array([0.16, 0.26, 0.22, 0.14, 0.10, 0.07, 0.03, 0.02])
    codes = rng.choice(16, size=n * 2, p=np.concatenate([mags, mags]) / 2).astype(np.uint8)
    fp4 = codes[0::2] | (codes[1::2] << 4)
    scale = rng.integers(0x30, 0x48, n // 8, dtype=np.uint8)  # e4m3 around 2^-1..2^1
    return {"BF16": bf16.view(np.uint8), "U8": fp4, "F8_E4M3": scale}


class _Shards:
    """Tensors (name, safetensors dtype, shape) written as slices of the pools, shard by shard."""

    def __init__(self, out: str, pools: dict[str, np.ndarray], rng):
        self.out, self.pools, self.rng = out, pools, rng
        self.shards: list[tuple[str, list]] = []
        self.weight_map: dict[str, str] = {}

    def shard(self, tensors: list[tuple[str, str, tuple[int, ...]]]) -> None:
        self.shards.append(("", tensors))

    def _write_data(self, f, st: str, n: int) -> None:
        if st == "F32":  # global scales and biases: small, positive, finite
            f.write(memoryview((self.rng.random(n // 4, dtype=np.float32) * 1e-3 + 1e-4)).cast("B"))
            return
        pool = self.pools[st]
        while n:  # a stacked tensor is larger than the pool: slices of it from random places
            k = min(n, pool.size // 2)
            start = int(self.rng.integers(0, pool.size - k)) & ~7
            f.write(memoryview(pool[start : start + k]))
            n -= k

    def write(self) -> None:
        count = len(self.shards)
        for i, (_, tensors) in enumerate(self.shards):
            name = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
            # safetensors' own order: by alignment (itemsize, larger first), then by name
            tensors = sorted(tensors, key=lambda t: (-ITEMSIZE[t[1]], t[0]))
            header, off = {}, 0
            for tname, st, shape in tensors:
                n = int(np.prod(shape)) * ITEMSIZE[st]
                header[tname] = {"dtype": st, "shape": list(shape), "data_offsets": [off, off + n]}
                off += n
                self.weight_map[tname] = name
            head = json.dumps(header, separators=(",", ":")).encode()
            head += b" " * (-len(head) % 8)
            with open(os.path.join(self.out, name), "wb") as f:
                f.write(len(head).to_bytes(8, "little") + head)
                for tname, st, shape in tensors:
                    begin, end = header[tname]["data_offsets"]
                    self._write_data(f, st, end - begin)
        with open(os.path.join(self.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": self.weight_map}, f)


def _attention(p: str, H: int, E: int) -> list:
    out = [(p + "input_layernorm.weight", "BF16", (H,)), (p + "post_attention_layernorm.weight", "BF16", (H,))]
    for proj, shape in (("q_proj", (H, H)), ("k_proj", (H // 4, H)), ("v_proj", (H // 4, H)), ("o_proj", (H, H))):
        out.append((p + f"self_attn.{proj}.weight", "BF16", shape))
    return out


def _qwen3_config(H: int, I: int, E: int, layers: int, **extra) -> dict:
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": H, "moe_intermediate_size": I, "num_experts": E, "num_experts_per_tok": 8,
        "num_hidden_layers": layers, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "intermediate_size": I * 4, "num_attention_heads": 16, "num_key_value_heads": 4,
        "head_dim": H // 16, "vocab_size": 1024, "hidden_act": "silu", "torch_dtype": "bfloat16", **extra,
    }


def _embeddings(H: int) -> list:
    return [("model.embed_tokens.weight", "BF16", (1024, H)), ("model.norm.weight", "BF16", (H,)),
            ("lm_head.weight", "BF16", (1024, H))]


def _expert_tensors(layout: str, p: str, E: int, H: int, I: int, nvfp4: bool) -> list:
    """One layer's routed experts, in the layout's names, dtypes and shapes."""
    if layout == "stacked":
        return [(p + "mlp.experts.gate_up_proj", "BF16", (E, 2 * I, H)), (p + "mlp.experts.down_proj", "BF16", (E, H, I))]
    if layout == "gpt_oss_bf16":
        q = p + "mlp.experts."
        return [(q + "gate_up_proj", "BF16", (E, H, 2 * I)), (q + "gate_up_proj_bias", "BF16", (E, 2 * I)),
                (q + "down_proj", "BF16", (E, I, H)), (q + "down_proj_bias", "BF16", (E, H))]
    out = []
    for e in range(E):
        for proj, (o, i) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
            q = p + f"mlp.experts.{e}.{proj}."
            if not nvfp4:
                out.append((q + "weight", "BF16", (o, i)))
                continue
            out += [(q + "weight", "U8", (o, i // 2)), (q + "weight_scale", "F8_E4M3", (o, i // 16)),
                    (q + "weight_scale_2", "F32", ()), (q + "input_scale", "F32", ())]
    return out


def layer_nbytes(layout: str, E: int, H: int, I: int) -> int:
    return int(3 * E * H * I * (9 / 16 if layout == "nvfp4" else 2))


def make_layout(out: str, layout: str, *, size_gib: float, hidden: int, inter: int, experts: int,
                seed: int = 0) -> dict:
    """A checkpoint of >= size_gib in the given safetensors layout; returns {"layers", "nbytes"}."""
    if layout == "gguf":
        return _make_gguf(out, size_gib)
    H, I, E = hidden, inter, experts
    layers = max(3, -(-int(size_gib * GiB) // layer_nbytes(layout, E, H, I)))
    if layout == "nvfp4":  # its two bf16 layers count for 32/9 NVFP4 ones
        layers = max(3, -(-int(size_gib * GiB - 2 * layer_nbytes("per_expert", E, H, I)) // layer_nbytes(layout, E, H, I)) + 2)
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = _Shards(out, _pools(rng, max(H * I * 2 * 2, 64 << 20)), rng)
    bf16_layers = {0, layers - 1} if layout == "nvfp4" else set(range(layers))
    for L in range(layers):
        p = f"model.layers.{L}."
        router = [(p + "mlp.router.weight", "BF16", (E, H)), (p + "mlp.router.bias", "BF16", (E,))] \
            if layout == "gpt_oss_bf16" else [(p + "mlp.gate.weight", "BF16", (E, H))]
        w.shard(_attention(p, H, E) + router + _expert_tensors(layout, p, E, H, I, L not in bf16_layers))
    w.shard(_embeddings(H))
    w.write()
    if layout == "gpt_oss_bf16":
        config = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": H,
                  "intermediate_size": I, "num_local_experts": E, "num_experts_per_tok": 4,
                  "num_hidden_layers": layers, "num_attention_heads": 16, "num_key_value_heads": 4,
                  "head_dim": H // 16, "vocab_size": 1024, "swiglu_limit": 7.0, "torch_dtype": "bfloat16"}
    elif layout == "nvfp4":
        excluded = [f"model.layers.{L}.mlp.experts*" for L in sorted(bf16_layers)] + ["lm_head"]
        q = {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": excluded}
        config = _qwen3_config(H, I, E, layers, quantization_config={"quant_method": "modelopt", **q})
        with open(os.path.join(out, "hf_quant_config.json"), "w") as f:
            json.dump({"producer": {"name": "modelopt"}, "quantization": q}, f)
    else:
        config = _qwen3_config(H, I, E, layers)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    total = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out))
    return {"nbytes": total, "layers": layers}


def _make_gguf(out: str, size_gib: float) -> dict:
    from bench_gguf import make_gguf, tensor_plan

    per_layer = sum(n for name, _, _, n in tensor_plan(1) if name.startswith("blk."))
    layers = max(3, -(-int(size_gib * GiB) // per_layer))
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"qwen3moe-{layers}L.gguf")
    make_gguf(path, layers)
    return {"nbytes": os.path.getsize(path), "layers": layers, "path": path}


def make_checkpoint(out: str, *, layers: int = 16, experts: int = 64, hidden: int = 2048,
                    inter: int = 768, seed: int = 0) -> dict:
    """The mixed ModelOpt NVFP4 checkpoint of bench_load.py: `layers` layers, bf16 first and last."""
    size = (2 * layer_nbytes("per_expert", experts, hidden, inter)
            + (layers - 2) * layer_nbytes("nvfp4", experts, hidden, inter)) / GiB
    return make_layout(out, "nvfp4", size_gib=size * 0.999, hidden=hidden, inter=inter, experts=experts, seed=seed)
