"""Every ggml type the gguf package knows, as the experts' type: raw rows, right sizes, dequant."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf.quants import _type_traits, dequantize

from ftw.readers.gguf_file import known_types
from ftw.readers.gguf_reader import GgufReader
from gguf_testlib import STR, U32, T, write_gguf

ALL = [t.name for t in known_types()]
H = I = 256  # a multiple of every block size (1, 32, 64, 128, 256)
E = 2


def test_every_known_type_is_covered():
    assert set(ALL) == {t.name for t in Q if t in GGML_QUANT_SIZES}
    for name in ("Q2_K", "Q4_K", "Q6_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ3_S", "IQ4_XS", "MXFP4", "NVFP4", "TQ1_0", "BF16"):
        assert name in ALL


def _experts(path, rng, gate: str, up: str, down: str):
    types = {"gate": gate, "up": up, "down": down}
    sizes = {t.name: t for t in known_types()}
    tensors, raw = [], {}
    for k, ne in (("gate", (H, I, E)), ("up", (H, I, E)), ("down", (I, H, E))):
        t = sizes[types[k]]
        data = rng.integers(0, 256, t.row_nbytes(ne[0]) * ne[1] * ne[2], dtype=np.uint8).tobytes()
        raw[k] = data
        tensors.append(T(f"blk.0.ffn_{k}_exps.weight", ne, t.id, data))
    kvs = [("general.architecture", STR, "qwen3moe"), ("qwen3moe.block_count", U32, 1),
           ("qwen3moe.embedding_length", U32, H), ("qwen3moe.expert_count", U32, E),
           ("qwen3moe.expert_used_count", U32, 1), ("qwen3moe.expert_feed_forward_length", U32, I)]
    write_gguf(path, kvs, tensors)
    return raw


@pytest.mark.parametrize("name", ALL)
def test_type_as_expert_type(tmp_path, name):
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    other = "Q8_0" if name != "Q8_0" else "Q4_0"
    raw = _experts(tmp_path / "t.gguf", rng, name, other, name)  # gate differs from up on purpose
    r = GgufReader(str(tmp_path / "t.gguf"))
    lb = r.plan()[0]
    assert lb.format.options == {"gate_type": name, "up_type": other, "down_type": name}
    t = next(t for t in known_types() if t.name == name)
    assert lb.banks["down"].row_shape == (H, t.row_nbytes(I))
    for e in range(E):
        n_g, n_u, n_d = (len(raw[k]) // E for k in ("gate", "up", "down"))
        want = raw["gate"][e * n_g:(e + 1) * n_g] + raw["up"][e * n_u:(e + 1) * n_u]
        assert lb.banks["gate_up"].row_array(e).tobytes() == want
        assert lb.banks["down"].row_array(e).tobytes() == raw["down"][e * n_d:(e + 1) * n_d]
    if Q[name] in _type_traits or name in ("F32", "F16"):
        rows = {k: b.row_array(1) for k, b in lb.banks.items()}
        with warnings.catch_warnings(), np.errstate(all="ignore"):  # random bytes: NaN/inf scales
            warnings.simplefilter("ignore")
            w = lb.format.decode(rows, *lb.dims())
            src = np.frombuffer(raw["down"], dtype=np.uint8).reshape(E, H, -1)[1]
            np.testing.assert_array_equal(w["down"], dequantize(src, Q[name]).astype(np.float64))
            gsrc = np.frombuffer(raw["gate"], dtype=np.uint8).reshape(E, I, -1)[1]
            np.testing.assert_array_equal(w["gate"], dequantize(gsrc, Q[name]).astype(np.float64))
        assert w["gate"].shape == (I, H) and w["down"].shape == (H, I)


def test_q8_1_uses_ggml_block_size(tmp_path):
    """gguf 0.19 says Q8_1 blocks are 40 bytes; ggml's block_q8_1 is 36 (two halves + 32 int8)."""
    t = next(t for t in known_types() if t.name == "Q8_1")
    assert (t.block, t.nbytes) == (32, 36)
