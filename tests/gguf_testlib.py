"""Builders of GGUF files for the GGUF reader tests.

``write_gguf`` writes the bytes by hand (not with gguf.GGUFWriter) so a test can put in what
no well-behaved writer would: a type id the gguf package does not know, an offset past the
end, a missing tensor. ``moe_file`` builds a small MoE model on top of it, quantized by the
real quantizers, and returns what it wrote so tests compare against the source of truth.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from samples.make_gguf_samples import quantize

U32, F32, STR, ARR, U64, I32 = 4, 6, 8, 9, 10, 5
_PACK = {4: "<I", 5: "<i", 6: "<f", 10: "<Q", 0: "<B", 7: "<?"}


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _value(vtype: int, v, sub: int | None = None) -> bytes:
    if vtype == STR:
        return _str(v)
    if vtype == ARR:
        return struct.pack("<IQ", sub, len(v)) + b"".join(_value(sub, x) for x in v)
    return struct.pack(_PACK[vtype], v)


@dataclass
class T:
    name: str
    ne: tuple[int, ...]
    type_id: int
    data: bytes
    offset: int | None = None  # relative to the data section; None: laid out in order


def write_gguf(path, kvs: list[tuple], tensors: list[T], alignment: int = 32) -> dict[str, int]:
    """Write a GGUF v3; kvs are (key, vtype, value[, sub_type]). Returns absolute data offsets."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for kv in kvs:
        head += _str(kv[0]) + struct.pack("<I", kv[1]) + _value(*kv[1:])
    rel, pos = [], 0
    for t in tensors:
        rel.append(pos if t.offset is None else t.offset)
        pos = -(-(pos + len(t.data)) // alignment) * alignment
    for t, r in zip(tensors, rel):
        head += _str(t.name) + struct.pack("<I", len(t.ne)) + struct.pack(f"<{len(t.ne)}Q", *t.ne)
        head += struct.pack("<IQ", t.type_id, r)
    start = -(-len(head) // alignment) * alignment
    body = bytearray(head + bytes(start - len(head)))
    for t in tensors:
        body += t.data + bytes(-len(t.data) % alignment)
    with open(path, "wb") as f:
        f.write(body)
    return {t.name: start + r for t, r in zip(tensors, rel)}


def nbytes(type_name: str, ne: tuple[int, ...]) -> int:
    block, size = GGML_QUANT_SIZES[Q[type_name]]
    n = 1
    for d in ne[1:]:
        n *= d
    return n * ne[0] // block * size


@dataclass
class Built:
    path: str
    offsets: dict[str, int]
    tensors: dict[str, T]
    values: dict[str, np.ndarray]  # the floats a tensor was quantized from (numpy order)


def moe_file(path, rng: np.random.Generator, layers: dict, *, arch="qwen3moe", H=256, I=256, E=2,
             n_layers=None, lead=0, bias=False, random_bytes=False, drop=(), widths=None,
             extra_kvs=(), meta_I=None) -> Built:
    """layers: {L: (gate, up, down) type names, or ("fused", T, down)}; other blocks dense-free."""
    n_layers = n_layers or (max(layers) + 1)
    kvs = [("general.architecture", STR, arch), ("general.name", STR, "test"),
           (f"{arch}.block_count", U32, n_layers), (f"{arch}.embedding_length", U32, H),
           (f"{arch}.expert_count", U32, E), (f"{arch}.expert_used_count", U32, 1),
           ("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.tokens", ARR, ["a", "b", "é"], STR),
           ("tokenizer.ggml.token_type", ARR, [1, 1, 1], I32)]
    if widths is not None:
        kvs.append((f"{arch}.expert_feed_forward_length", ARR, widths, U32))
    else:
        kvs.append((f"{arch}.expert_feed_forward_length", U32, meta_I or I))
    if lead:
        kvs.append((f"{arch}.leading_dense_block_count", U32, lead))
    kvs += list(extra_kvs)

    tensors: list[T] = []
    values: dict[str, np.ndarray] = {}

    def put(name: str, shape_np: tuple[int, ...], tname: str) -> None:
        ne = tuple(reversed(shape_np))
        if random_bytes:
            data = rng.integers(0, 256, nbytes(tname, ne), dtype=np.uint8).tobytes()
        else:
            v = (rng.standard_normal(shape_np) * 0.1).astype(np.float32)
            values[name] = v
            data = np.ascontiguousarray(quantize(v, tname) if tname != "BF16" else _bf16(v)).tobytes()
        assert len(data) == nbytes(tname, ne), name
        if name not in drop:
            tensors.append(T(name, ne, Q[tname].value, data))

    put("token_embd.weight", (3, H), "F16")
    for L in range(n_layers):
        p = f"blk.{L}."
        put(p + "attn_norm.weight", (H,), "F32")
        if L not in layers:
            continue
        Il = widths[L] if widths is not None else I
        put(p + "ffn_gate_inp.weight", (E, H), "F32")
        g, u, d = layers[L]
        if g == "fused":
            put(p + "ffn_gate_up_exps.weight", (E, 2 * Il, H), u)
        else:
            put(p + "ffn_gate_exps.weight", (E, Il, H), g)
            put(p + "ffn_up_exps.weight", (E, Il, H), u)
        put(p + "ffn_down_exps.weight", (E, H, Il), d)
        if bias:
            put(p + "ffn_gate_exps.bias", (E, Il), "F32")
            put(p + "ffn_up_exps.bias", (E, Il), "F32")
            put(p + "ffn_down_exps.bias", (E, H), "F32")
    put("output.weight", (3, H), "Q8_0")
    offsets = write_gguf(path, kvs, tensors)
    return Built(str(path), offsets, {t.name: t for t in tensors}, values)


def _bf16(v: np.ndarray) -> np.ndarray:
    return (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def source_rows(built: Built, name: str, E: int) -> list[bytes]:
    """Expert e's bytes of a stacked tensor, cut from what was written (not from any reader)."""
    data = built.tensors[name].data
    n = len(data) // E
    return [data[e * n:(e + 1) * n] for e in range(E)]
