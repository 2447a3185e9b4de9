"""Make the tiny GGUF samples in samples/gguf/: MoE files whose expert layers mix ggml types
the way real llama.cpp quants do, quantized by real quantizers.

    .venv/bin/python samples/make_gguf_samples.py [--out samples/gguf] [--seed 0]

Simple types (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/MXFP4) come from gguf.quants, K and IQ types from
llama.cpp's ggml inside the xllamacpp wheel (samples/ggml_quant.py). H = I = 256 is the
smallest width the 256-value K/IQ blocks allow; E = 4 keeps every file well under 2 MB.
Same seed, same bytes: the weights come from one seeded generator per file and both
quantizers are deterministic.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import zlib
from dataclasses import dataclass, field

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGMLQuantizationType as Q
from gguf.constants import GGUFValueType
from gguf.quants import quantize as gguf_quantize

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from samples.ggml_quant import quantize as ggml_quantize  # noqa: E402

SIMPLE = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"}
FLOATS = {"F32": np.float32, "F16": np.float16}
H, I, E, VOCAB, HEAD = 256, 256, 4, 32, 32


def quantize(values: np.ndarray, qtype: str) -> np.ndarray:
    """[..., n] float -> what GGUFWriter takes: floats for F32/F16, else [..., row_bytes] u8."""
    if qtype in FLOATS:
        return values.astype(FLOATS[qtype])
    if qtype in SIMPLE:
        return gguf_quantize(values.astype(np.float32), Q[qtype])
    return ggml_quantize(values, qtype)


@dataclass
class Sample:
    name: str
    arch: str
    n_layers: int
    lead_dense: int = 0
    # layer -> (gate, up, down) types, or ("fused", T, down) for ffn_gate_up_exps
    experts: dict[int, tuple[str, str, str]] = field(default_factory=dict)
    attn: tuple[str, str, str, str] = ("Q8_0", "Q8_0", "Q8_0", "Q8_0")  # q, k, v, output
    embd: str = "Q8_0"
    output: str = "Q6_K"
    dense_ffn: tuple[str, str, str] = ("Q4_K", "Q4_K", "Q6_K")
    shared_expert: str | None = None  # type of ffn_*_shexp, when the model has one
    expert_bias: bool = False  # gpt-oss
    nextn: int = 0  # MTP blocks counted in block_count, last
    split_max_tensors: int = 0
    extra_kv: dict = field(default_factory=dict)


SAMPLES = [
    Sample(
        # llama-quantize Q4_K_M: Q4_K experts, ffn_down_exps at Q6_K on some layers
        "qwen3moe-Q4_K_M.gguf", "qwen3moe", n_layers=4, lead_dense=1,
        experts={1: ("Q4_K", "Q4_K", "Q6_K"), 2: ("Q4_K", "Q4_K", "Q4_K"), 3: ("Q4_K", "Q4_K", "Q6_K")},
        attn=("Q4_K", "Q4_K", "Q6_K", "Q8_0"), embd="Q4_K", output="Q6_K",
    ),
    Sample(
        # Unsloth-style dynamic quant: very low-bit experts, a different mix per layer
        "qwen3moe-UD-IQ2_XS.gguf", "qwen3moe", n_layers=2,
        experts={0: ("IQ2_XS", "IQ2_XS", "IQ4_NL"), 1: ("IQ3_S", "IQ3_S", "Q2_K")},
        attn=("IQ4_XS", "IQ4_XS", "Q5_K", "Q8_0"), embd="Q5_K", output="Q8_0",
    ),
    Sample(
        # gate and up of different types in one layer (seen in hand-tuned quant recipes)
        "deepseek2-mixed-gate-up.gguf", "deepseek2", n_layers=3, lead_dense=1,
        experts={1: ("Q3_K", "Q4_K", "Q5_K"), 2: ("Q4_0", "Q5_1", "IQ4_XS")},
        shared_expert="Q6_K", extra_kv={"expert_shared_count": 1, "expert_weights_scale": 2.5},
    ),
    Sample(
        # qwen3.5 MoE converted with the fused gate_up tensor (gate rows first)
        "qwen35moe-fused-gate-up.gguf", "qwen35moe", n_layers=2,
        experts={0: ("fused", "Q5_K", "Q6_K"), 1: ("fused", "Q4_1", "Q8_0")},
        shared_expert="Q4_K",
    ),
    Sample(
        # gpt-oss: MXFP4 experts with f32 biases, everything else Q8_0/F32
        "gpt-oss-MXFP4.gguf", "gpt-oss", n_layers=2,
        experts={0: ("MXFP4", "MXFP4", "MXFP4"), 1: ("MXFP4", "MXFP4", "MXFP4")},
        expert_bias=True, embd="Q8_0", output="Q8_0",
    ),
    Sample(
        # a 2-way split GLM-4.5-style file: a dense lead block, shared expert, MTP block last
        "glm4moe-Q4_K_S-00001-of-00002.gguf", "glm4moe", n_layers=4, lead_dense=1, nextn=1,
        experts={1: ("Q4_K", "Q4_K", "Q5_K"), 2: ("Q4_K", "Q4_K", "Q4_K"), 3: ("Q2_K", "Q2_K", "Q3_K")},
        shared_expert="Q5_0", split_max_tensors=31,  # 61 tensors: two shards
    ),
]


def _tokenizer(w: GGUFWriter) -> None:
    tokens = ["<unk>", "<s>", "</s>"] + [chr(ord("a") + i) for i in range(26)] + [" ", "Ġthe", "é"]
    assert len(tokens) == VOCAB
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_key_value("tokenizer.ggml.token_type", [3, 3, 3] + [1] * (VOCAB - 3), GGUFValueType.ARRAY, GGUFValueType.INT32)
    w.add_array("tokenizer.ggml.merges", ["t h", "th e"])
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    w.add_string("tokenizer.chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}")


def build(s: Sample, out_dir: str, seed: int) -> dict:
    # one generator per file, seeded by the file name too: samples do not shift when one is added
    rng = np.random.default_rng([seed, zlib.crc32(s.name.encode())])

    def w_(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    path = os.path.join(out_dir, s.name.replace("-00001-of-00002", ""))
    w = GGUFWriter(path, s.arch, split_max_tensors=s.split_max_tensors)
    a = s.arch
    w.add_string("general.name", f"ftw sample {s.name}")
    w.add_uint32("general.quantization_version", 2)
    w.add_uint32(f"{a}.block_count", s.n_layers)
    w.add_uint32(f"{a}.context_length", 4096)
    w.add_uint32(f"{a}.embedding_length", H)
    w.add_uint32(f"{a}.feed_forward_length", I)
    w.add_uint32(f"{a}.expert_feed_forward_length", I)
    w.add_uint32(f"{a}.expert_count", E)
    w.add_uint32(f"{a}.expert_used_count", 2)
    w.add_uint32(f"{a}.attention.head_count", 1)
    w.add_uint32(f"{a}.attention.head_count_kv", 1)
    w.add_uint32(f"{a}.attention.key_length", HEAD)
    w.add_uint32(f"{a}.attention.value_length", HEAD)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{a}.rope.freq_base", 1e6)
    if s.lead_dense:
        w.add_uint32(f"{a}.leading_dense_block_count", s.lead_dense)
    if s.nextn:
        w.add_uint32(f"{a}.nextn_predict_layers", s.nextn)
    for k, v in s.extra_kv.items():
        (w.add_uint32 if isinstance(v, int) else w.add_float32)(f"{a}.{k}", v)
    _tokenizer(w)

    types: dict[str, str] = {}

    def put(name: str, values: np.ndarray, qtype: str) -> None:
        data = quantize(values, qtype)
        w.add_tensor(name, data, raw_dtype=None if qtype in FLOATS else Q[qtype])
        types[name] = qtype

    put("token_embd.weight", w_(VOCAB, H), s.embd)
    for L in range(s.n_layers):
        p = f"blk.{L}."
        put(p + "attn_norm.weight", 1 + w_(H), "F32")
        put(p + "attn_q.weight", w_(HEAD, H), s.attn[0])
        put(p + "attn_k.weight", w_(HEAD, H), s.attn[1])
        put(p + "attn_v.weight", w_(HEAD, H), s.attn[2])
        # rows of HEAD values: too short for 256-value blocks, as in real files
        put(p + "attn_output.weight", w_(H, HEAD), s.attn[3] if s.attn[3] in SIMPLE else "Q8_0")
        if a == "gpt-oss":
            put(p + "attn_sinks.weight", w_(2), "F32")
        put(p + "ffn_norm.weight", 1 + w_(H), "F32")
        if L < s.lead_dense:
            g, u, d = s.dense_ffn
            put(p + "ffn_gate.weight", w_(I, H), g)
            put(p + "ffn_up.weight", w_(I, H), u)
            put(p + "ffn_down.weight", w_(H, I), d)
            continue
        put(p + "ffn_gate_inp.weight", w_(E, H), "F32")
        if a == "gpt-oss":
            put(p + "ffn_gate_inp.bias", w_(E), "F32")
        if a in ("deepseek2", "glm4moe"):
            put(p + "exp_probs_b.bias", w_(E), "F32")
        gt, ut, dt = s.experts.get(L, s.experts[max(s.experts)])
        if gt == "fused":
            put(p + "ffn_gate_up_exps.weight", w_(E, 2 * I, H), ut)
        else:
            put(p + "ffn_gate_exps.weight", w_(E, I, H), gt)
            put(p + "ffn_up_exps.weight", w_(E, I, H), ut)
        put(p + "ffn_down_exps.weight", w_(E, H, I), dt)
        if s.expert_bias:
            put(p + "ffn_gate_exps.bias", w_(E, I), "F32")
            put(p + "ffn_up_exps.bias", w_(E, I), "F32")
            put(p + "ffn_down_exps.bias", w_(E, H), "F32")
        if s.shared_expert:
            put(p + "ffn_gate_shexp.weight", w_(I, H), s.shared_expert)
            put(p + "ffn_up_shexp.weight", w_(I, H), s.shared_expert)
            put(p + "ffn_down_shexp.weight", w_(H, I), s.shared_expert)
        if L >= s.n_layers - s.nextn:
            put(p + "nextn.eh_proj.weight", w_(H, 2 * H), "Q8_0")
            put(p + "nextn.enorm.weight", 1 + w_(H), "F32")
            put(p + "nextn.hnorm.weight", 1 + w_(H), "F32")
    put("output_norm.weight", 1 + w_(H), "F32")
    put("output.weight", w_(VOCAB, H), s.output)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    files = [os.path.basename(str(p)) for p in w.format_shard_names(w.path)]
    assert files[0] == s.name, f"{s.name}: the writer made {files}"
    return {"files": files, "arch": a, "types": types, "experts": {str(k): list(v) for k, v in s.experts.items()},
            "lead_dense": s.lead_dense, "nextn": s.nextn, "n_layers": s.n_layers,
            "expert_bias": s.expert_bias}


def expected_formats(s: Sample) -> dict[str, dict]:
    out = {}
    for L in range(s.lead_dense, s.n_layers - s.nextn):
        g, u, d = s.experts.get(L, s.experts[max(s.experts)])
        opts = {"gate_up_type": u, "down_type": d} if g in ("fused", u) else {"gate_type": g, "up_type": u, "down_type": d}
        out[str(L)] = {"name": "gguf", "options": opts}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "gguf"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", help="make only the sample with this name")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    from importlib.metadata import version

    # regenerated bytes are only comparable under the same quantizers and random generator
    libs = {lib: version(lib) for lib in ("gguf", "xllamacpp", "numpy")}
    manifest = {"seed": args.seed, "versions": libs, "samples": {}}
    for s in SAMPLES:
        if args.only and s.name != args.only:
            continue
        info = build(s, args.out, args.seed)
        info["layer_formats"] = expected_formats(s)
        info["model"] = {"hidden_size": H, "moe_intermediate_size": I, "num_experts": E, "top_k": 2,
                         "num_layers": s.n_layers, "moe_layers": [int(k) for k in info["layer_formats"]]}
        info["sha256"] = {}
        for f in info["files"]:
            with open(os.path.join(args.out, f), "rb") as fh:
                info["sha256"][f] = hashlib.sha256(fh.read()).hexdigest()
        info["nbytes"] = sum(os.path.getsize(os.path.join(args.out, f)) for f in info["files"])
        manifest["samples"][s.name] = info
        print(f"{s.name}: {info['nbytes'] / 1e6:.2f} MB, layers {info['layer_formats']}")
    if not args.only:
        with open(os.path.join(args.out, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.write("\n")


if __name__ == "__main__":
    main()
