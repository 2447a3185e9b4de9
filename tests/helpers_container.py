"""Building small FTW files from fresh random data, and re-sealing edited ones.

Re-sealing (new index checksum, new footer checksum) lets a test that edits the index or a
blob get past the checksums and reach the semantic checks behind them.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field

import numpy as np
import pytest
import xxhash

from ftw import spec
from ftw.banks import BankSource, LayerBanks, SourceTensor
from ftw.formats import LayerFormat, ModelShape
from ftw.writers import FtwWriter

E = 4
H, I = 64, 32


@pytest.fixture
def rng():
    """A generator with a fresh seed; the seed is printed so a failure can be replayed
    (pytest shows captured stdout of failing tests). FTW_SEED=... forces one."""
    seed = int(os.environ.get("FTW_SEED") or secrets.randbits(63))
    print(f"random seed: FTW_SEED={seed}")
    return np.random.default_rng(seed)


def bf16_normal(rng: np.random.Generator, shape) -> np.ndarray:
    """Random normal weights truncated to bf16, as the u16 bit patterns a bank stores."""
    f = (rng.standard_normal(shape, dtype=np.float32) * 0.05).view(np.uint32)
    return (f >> 16).astype(np.uint16)


def random_bytes(rng: np.random.Generator, shape) -> np.ndarray:
    return rng.integers(0, 256, shape, dtype=np.uint8)


@dataclass
class Expected:
    """What was written: arrays in their bank/tensor dtype, attachments as bytes."""

    banks: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)
    formats: dict[int, LayerFormat] = field(default_factory=dict)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    tensor_meta: dict[str, dict] = field(default_factory=dict)
    attachments: dict[str, bytes] = field(default_factory=dict)
    model: ModelShape | None = None


def _source(dtype: str, arr: np.ndarray, pieces: int = 1) -> BankSource:
    """A bank handing each row out as `pieces` slices, as readers do for gate rows + up rows."""

    def row(e: int):
        flat = arr[e].reshape(-1)
        return np.array_split(flat, pieces) if pieces > 1 else [arr[e]]

    return BankSource(dtype, tuple(arr.shape[1:]), arr.shape[0], row)


def sample_layers(rng: np.random.Generator, num_experts: int = E) -> list[tuple[int, LayerFormat, dict]]:
    """Two MoE layers of different formats: bf16 (compressible) and nvfp4-like (4-bit bytes)."""
    e = num_experts
    bf16 = {
        "gate_up": ("bf16", bf16_normal(rng, (e, 2 * I, H))),
        "down": ("bf16", bf16_normal(rng, (e, H, I))),
        "gate_up_bias": ("bf16", bf16_normal(rng, (e, 2 * I))),
        "down_bias": ("bf16", bf16_normal(rng, (e, H))),
    }
    nvfp4 = {
        "gate_up": ("u8", random_bytes(rng, (e, 2 * I, H // 2))),
        "down": ("u8", random_bytes(rng, (e, H, I // 2))),
        "gate_up_scale": ("f8_e4m3", random_bytes(rng, (e, 2 * I, H // 16))),
        "down_scale": ("f8_e4m3", random_bytes(rng, (e, H, I // 16))),
        "gate_up_global": ("f32", rng.random((e, 2 * I), dtype=np.float32)),
        "down_global": ("f32", rng.random((e, H), dtype=np.float32)),
    }
    return [
        (1, LayerFormat.of("bf16"), bf16),
        (3, LayerFormat.of("nvfp4"), nvfp4),
    ]


def write_sample(path, rng: np.random.Generator, *, level: int | None = None, num_experts: int = E,
                 force: bool = False) -> Expected:
    """A small but complete FTW: model shape, two layers, tensors with meta, attachments."""
    exp = Expected()
    exp.model = ModelShape("test", H, I, num_experts, 2, 4, [1, 3], "silu", {"note": "x"})
    with FtwWriter(path, compress_level=level, force=force) as w:
        w.set_model(exp.model)
        w.set_provenance({"reader": "tests", "source_files": ["a.safetensors"], "tool_version": "0"})
        for layer, fmt, banks in sample_layers(rng, num_experts):
            exp.formats[layer] = fmt
            sources = {}
            for i, (name, (dtype, arr)) in enumerate(banks.items()):
                exp.banks[(layer, name)] = arr
                sources[name] = _source(dtype, arr, pieces=1 + i % 3)
            w.add_layer(LayerBanks(layer, fmt, sources))
        tensors = {
            "model.embed_tokens.weight": ("bf16", bf16_normal(rng, (16, H)), None),
            "model.norm.weight": ("f32", rng.standard_normal(H, dtype=np.float32), None),
            "blk.0.attn_q.weight": ("u8", random_bytes(rng, (8, 18)), {"ggml_type": "Q4_0"}),
            "scalar": ("f64", np.array(rng.standard_normal(), dtype=np.float64), None),
        }
        for name, (dtype, arr, meta) in tensors.items():
            exp.tensors[name], exp.tensor_meta[name] = arr, meta or {}
            w.add_tensor(SourceTensor(name, dtype, arr.shape, lambda a=arr: a, meta))
        exp.attachments = {
            "config.json": json.dumps({"hidden_size": H, "seed": int(rng.integers(1 << 30))}).encode(),
            "tokenizer.model": random_bytes(rng, int(rng.integers(1, 9000))).tobytes(),
            "empty.txt": b"",
        }
        for name, data in exp.attachments.items():
            w.add_attachment(name, data)
    return exp


# -- taking files apart and putting them back together ----------------------------------


def footer(data: bytes) -> dict:
    names = ("magic", "major", "minor", "flags", "index_offset", "index_nbytes", "index_xxh3", "footer_xxh3")
    return dict(zip(names, spec.FOOTER.unpack(data[-spec.FOOTER.size :])))


def seal_footer(fields: dict) -> bytes:
    """A footer with its checksum over the first 56 bytes recomputed."""
    body = spec.FOOTER.pack(
        fields["magic"], fields["major"], fields["minor"], fields["flags"], fields["index_offset"],
        fields["index_nbytes"], fields["index_xxh3"], 0,
    )[:-8]
    return body + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little")


def index_of(data: bytes) -> dict:
    f = footer(data)
    return json.loads(data[f["index_offset"] : f["index_offset"] + f["index_nbytes"]])


def with_index(data: bytes, index: dict | bytes, **footer_changes) -> bytes:
    """data with its index replaced (JSON object or raw bytes) and index + footer re-sealed."""
    f = footer(data)
    raw = index if isinstance(index, bytes) else json.dumps(index).encode()
    f.update(index_nbytes=len(raw), index_xxh3=xxhash.xxh3_64_intdigest(raw))
    f.update(footer_changes)
    return data[: f["index_offset"]] + raw + seal_footer(f)


def with_footer(data: bytes, **changes) -> bytes:
    f = footer(data)
    f.update(changes)
    return data[: -spec.FOOTER.size] + seal_footer(f)


def blobs_of(index: dict) -> list[tuple[str, dict]]:
    """Every blob descriptor in an index, labelled as the reader labels them."""
    out = []
    for key, layer in index["layers"].items():
        for name, bank in layer["banks"].items():
            out.append((f"layer {key} bank {name}", bank))
            if "row_table" in bank:
                out.append((f"layer {key} bank {name} row table", bank["row_table"]))
    out += [(f"tensor {n}", t) for n, t in index["tensors"].items()]
    out += [(f"attachment {n}", a) for n, a in index["attachments"].items()]
    return out


def patch_blob(data: bytes, desc: dict, offset_in_blob: int, new: bytes, reseal: bool) -> bytes:
    """Overwrite bytes inside a blob; with reseal, also fix that blob's xxh3 in the index so
    only a deeper check (zstd frame, row table) can notice."""
    pos = desc["offset"] + offset_in_blob
    out = data[:pos] + new + data[pos + len(new) :]
    if not reseal:
        return out
    index = index_of(out)
    for _, d in blobs_of(index):
        if d["offset"] == desc["offset"] and d["nbytes"] == desc["nbytes"]:
            d["xxh3"] = xxhash.xxh3_64_hexdigest(out[d["offset"] : d["offset"] + d["nbytes"]])
    return with_index(out, index)


def flip_bit(data: bytes, pos: int, bit: int) -> bytes:
    return data[:pos] + bytes([data[pos] ^ (1 << bit)]) + data[pos + 1 :]
