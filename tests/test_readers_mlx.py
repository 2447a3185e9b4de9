"""MLX affine (`switch_mlp` weight/scales/biases) -> `affine` banks, and unquantized switch_mlp -> bf16.

The check is bytes (gate rows then up rows, kept as stored) plus a float64 decode of the
banks against one of the sources, both written here from the mlx-lm rule (LSB-first bit
stream per row, w = scale * q + bias), and the registered `affine` decoder against the same.
The committed samples written by mlx itself are covered by tests/test_registry.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ftw.readers.safetensors_reader import SafetensorsReader
from st_build import dec_bf16, family_config, rand_bf16, rand_e4m3, write_ckpt


def unpack(words: np.ndarray, bits: int, n: int) -> np.ndarray:
    b = np.unpackbits(np.ascontiguousarray(words).view(np.uint8), axis=-1, bitorder="little")
    b = b[..., : n * bits].reshape(*b.shape[:-1], n, bits).astype(np.int64)
    return (b << np.arange(bits)).sum(-1)


def affine(words, scales, biases, bits, n):
    q = unpack(words, bits, n).astype(np.float64)
    g = n // scales.shape[-1]
    return q * np.repeat(dec_bf16(scales), g, -1) + np.repeat(dec_bf16(biases), g, -1)


def mlx_layer(rng, base, E, H, I, bits, gs):
    t = {}
    for p, (o, i) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
        t[f"{base}{p}.weight"] = ("U32", rng.integers(0, 2**32, (E, o, i * bits // 32), dtype=np.uint32))
        t[f"{base}{p}.scales"] = ("BF16", rand_bf16(rng, (E, o, i // gs)))
        t[f"{base}{p}.biases"] = ("BF16", rand_bf16(rng, (E, o, i // gs)))
    return t


@pytest.mark.parametrize("bits,gs", [(4, 64), (8, 32), (3, 32), (6, 64)])
def test_affine(tmp_path, bits, gs):
    rng = np.random.default_rng()
    E, H, I = 3, 128, 64
    t = {}
    for L in range(2):
        t.update(mlx_layer(rng, f"model.layers.{L}.mlp.switch_mlp.", E, H, I, bits, gs))
        t[f"model.layers.{L}.mlp.gate.weight"] = ("BF16", rand_bf16(rng, (E, H)))
    cfg = dict(family_config("qwen3_moe", ["bf16", "bf16"], E, H, I), quantization={"group_size": gs, "bits": bits})
    folder = write_ckpt(str(tmp_path / "ck"), cfg, t)
    with SafetensorsReader(folder) as r:
        for lb in r.plan():
            assert lb.format.name == "affine" and lb.format.options == {"bits": bits, "group_size": gs}
            base = f"model.layers.{lb.layer}.mlp.switch_mlp."
            for e in range(E):
                rows = {k: s.row_array(e) for k, s in lb.banks.items()}
                for bank, s in (("gate_up", "weight"), ("gate_up_scale", "scales"), ("gate_up_offset", "biases")):
                    want = t[f"{base}gate_proj.{s}"][1][e].tobytes() + t[f"{base}up_proj.{s}"][1][e].tobytes()
                    assert rows[bank].tobytes() == want
                w = affine(rows["gate_up"], rows["gate_up_scale"], rows["gate_up_offset"], bits, H)
                src = {p: affine(t[f"{base}{p}.weight"][1][e], t[f"{base}{p}.scales"][1][e],
                                 t[f"{base}{p}.biases"][1][e], bits, n)
                       for p, n in (("gate_proj", H), ("up_proj", H), ("down_proj", I))}
                np.testing.assert_array_equal(w[:I], src["gate_proj"])
                np.testing.assert_array_equal(w[I:], src["up_proj"])
                d = affine(rows["down"], rows["down_scale"], rows["down_offset"], bits, I)
                np.testing.assert_array_equal(d, src["down_proj"])
                dec = lb.format.decode(rows, H, I)
                for k, p in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                    np.testing.assert_array_equal(dec[k], src[p])
        assert not any("switch_mlp" in x.name for x in r.tensors())


def test_unquantized_switch_mlp(tmp_path):
    rng = np.random.default_rng()
    E, H, I = 3, 64, 32
    base = "model.layers.0.block_sparse_moe.switch_mlp."
    t = {f"{base}{p}.weight": ("BF16", rand_bf16(rng, (E, o, i)))
         for p, (o, i) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I)))}
    folder = write_ckpt(str(tmp_path / "ck"), family_config("mixtral", ["bf16"], E, H, I), t)
    with SafetensorsReader(folder) as r:
        [lb] = r.plan()
        assert lb.format.name == "bf16"
        for e in range(E):
            gu = lb.banks["gate_up"].row_array(e)
            assert gu.tobytes() == t[f"{base}gate_proj.weight"][1][e].tobytes() + t[f"{base}up_proj.weight"][1][e].tobytes()
            assert lb.banks["down"].row_array(e).tobytes() == t[f"{base}down_proj.weight"][1][e].tobytes()


def test_affine_mismatched_bits(tmp_path):
    rng = np.random.default_rng()
    E, H, I = 2, 128, 64
    t = mlx_layer(rng, "model.layers.0.mlp.switch_mlp.", E, H, I, 4, 64)
    t["model.layers.0.mlp.switch_mlp.down_proj.weight"] = ("U32", rng.integers(0, 2**32, (E, H, I * 8 // 32), dtype=np.uint32))
    folder = write_ckpt(str(tmp_path / "ck"), family_config("qwen3_moe", ["bf16"], E, H, I), t)
    from ftw.errors import SourceError

    with pytest.raises(SourceError, match=r"down_proj.weight' .* expected u32 \[2, 128, 8\] \(4-bit affine"):
        SafetensorsReader(folder).plan()


def test_mlx_mxfp8_switch_mlp(tmp_path):
    """MLX mode mxfp8: u32 [E, out, in/4] words of four e4m3 bytes, u8 E8M0 scales per 32, no
    biases -> mxfp8 banks holding the words' bytes; decoded against e4m3 * 2^(s - 127)."""
    rng = np.random.default_rng()
    E, H, I = 3, 128, 64
    base = "model.layers.0.mlp.switch_mlp."
    t = {}
    for p, (o, i) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
        t[f"{base}{p}.weight"] = ("U32", rand_e4m3(rng, (E, o, i)).view(np.uint32))
        t[f"{base}{p}.scales"] = ("U8", rng.integers(100, 140, (E, o, i // 32), dtype=np.uint8))
    cfg = dict(family_config("qwen3_moe", ["bf16"], E, H, I), quantization={"group_size": 32, "bits": 8, "mode": "mxfp8"})
    folder = write_ckpt(str(tmp_path / "ck"), cfg, t)
    e4m3 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double().numpy()
    with SafetensorsReader(folder) as r:
        [lb] = r.plan()
        assert lb.format.name == "mxfp8" and lb.format.options == {}
        for e in range(E):
            rows = {k: s.row_array(e) for k, s in lb.banks.items()}
            for bank, s in (("gate_up", "weight"), ("gate_up_scale", "scales")):
                assert rows[bank].tobytes() == t[f"{base}gate_proj.{s}"][1][e].tobytes() + t[f"{base}up_proj.{s}"][1][e].tobytes()
            dec = lb.format.decode(rows, H, I)
            for k, p in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                q = t[f"{base}{p}.weight"][1][e].view(np.uint8)
                want = e4m3[q] * np.repeat(np.exp2(t[f"{base}{p}.scales"][1][e].astype(np.float64) - 127), 32, -1)
                np.testing.assert_array_equal(dec[k], want)


def test_mlx_mxfp4_mode_is_refused_by_name(tmp_path):
    rng = np.random.default_rng()
    E, H, I = 2, 128, 64
    base = "model.layers.0.mlp.switch_mlp."
    t = {}
    for p, (o, i) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
        t[f"{base}{p}.weight"] = ("U32", rng.integers(0, 2**32, (E, o, i // 8), dtype=np.uint32))
        t[f"{base}{p}.scales"] = ("U8", rng.integers(100, 140, (E, o, i // 32), dtype=np.uint8))
    folder = write_ckpt(str(tmp_path / "ck"), family_config("qwen3_moe", ["bf16"], E, H, I), t)
    from ftw.errors import UnsupportedError

    with pytest.raises(UnsupportedError, match=r"gate_proj.weight' is u32 \[2, 64, 16\].*mxfp8 mode"):
        SafetensorsReader(folder).plan()
