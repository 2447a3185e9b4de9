"""load_expert_banks / merge_expert_banks on synthetic mixed FTW files."""

from __future__ import annotations

import numpy as np
import pytest

import ftw
from ftw import MergeError, load_expert_banks, merge_expert_banks
from ftw.banks import BankSource, LayerBanks
from ftw.formats import LayerFormat, ModelShape
from ftw.writers import FtwWriter

E, H, I = 4, 64, 32
LAYERS = [0, 1, 2, 3, 4]  # bf16 at both ends, nvfp4 in between, like real mixed checkpoints


def _bf16_layer(rng, layer):
    gate_up = rng.integers(1, 0xFFFF, (E, 2 * I, H), dtype=np.uint16)
    down = rng.integers(1, 0xFFFF, (E, H, I), dtype=np.uint16)
    banks = {
        "gate_up": BankSource("bf16", (2 * I, H), E, lambda e: [gate_up[e, :I], gate_up[e, I:]]),
        "down": BankSource("bf16", (H, I), E, lambda e: [down[e]]),
    }
    return LayerBanks(layer, LayerFormat.of("bf16"), banks), {"gate_up": gate_up, "down": down}


def _nvfp4_layer(rng, layer):
    arrays = {
        "gate_up": rng.integers(1, 255, (E, 2 * I, H // 2), dtype=np.uint8),
        "down": rng.integers(1, 255, (E, H, I // 2), dtype=np.uint8),
        "gate_up_scale": rng.integers(1, 0x7E, (E, 2 * I, H // 16), dtype=np.uint8),
        "down_scale": rng.integers(1, 0x7E, (E, H, I // 16), dtype=np.uint8),
        "gate_up_global": rng.random((E, 2 * I), dtype=np.float32) + 0.5,
        "down_global": rng.random((E, H), dtype=np.float32) + 0.5,
    }
    dtypes = {"gate_up": "u8", "down": "u8", "gate_up_scale": "f8_e4m3", "down_scale": "f8_e4m3",
              "gate_up_global": "f32", "down_global": "f32"}
    banks = {n: BankSource(dtypes[n], a.shape[1:], E, lambda e, a=a: [a[e]]) for n, a in arrays.items()}
    return LayerBanks(layer, LayerFormat.of("nvfp4"), banks), arrays


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    rng = np.random.default_rng()
    path = tmp_path_factory.mktemp("loader") / "mixed.ftw"
    expected = {}
    with FtwWriter(path) as w:
        w.set_model(ModelShape("test", H, I, E, 2, len(LAYERS), LAYERS))
        for layer in LAYERS:
            lb, arrays = (_bf16_layer if layer in (0, LAYERS[-1]) else _nvfp4_layer)(rng, layer)
            w.add_layer(lb)
            expected[layer] = arrays
    return path, expected


@pytest.mark.parametrize("layers", [None, [0], [4], [1, 2, 3], [0, 2], [3, 4]])
def test_subsets_equal_full_load(mixed, layers):
    path, expected = mixed
    full = load_expert_banks(path)
    part = load_expert_banks(path, layers=layers, threads=3)
    want = LAYERS if layers is None else layers
    assert part.layers == want
    for name in part.banks:
        for layer in want:
            a, b = part.banks[name][layer], full.banks[name][layer]
            assert a.dtype == b.dtype and a.shape == b.shape
            assert np.array_equal(a, b)
            if name in expected[layer]:
                assert np.array_equal(a, expected[layer][name])


def test_union_bank_set_and_placeholders(mixed):
    path, expected = mixed
    eb = load_expert_banks(path)
    assert set(eb.banks) == {"gate_up", "down", "gate_up_scale", "down_scale", "gate_up_global", "down_global"}
    for layer in (0, 4):  # bf16 layers lack every nvfp4-only bank
        for name in ("gate_up_scale", "down_scale", "gate_up_global", "down_global"):
            ph = eb.banks[name][layer]
            assert ph.shape == (E, 0) and ph.nbytes == 0
            assert ph.dtype == eb.banks[name][1].dtype  # the bank's dtype from a layer that has it
    assert eb.layer_formats[0].name == "bf16" and eb.layer_formats[2].name == "nvfp4"
    assert eb.nbytes == sum(a.nbytes for arrays in expected.values() for a in arrays.values())
    assert {f.name: ls for f, ls in eb.formats().items()} == {"bf16": [0, 4], "nvfp4": [1, 2, 3]}


def test_pin_gives_torch_tensors_with_same_bytes(mixed):
    torch = pytest.importorskip("torch")
    path, expected = mixed
    eb = load_expert_banks(path, pin=True)
    assert eb.pinned == torch.cuda.is_available()
    t = eb.banks["gate_up"][0]
    assert t.dtype == torch.bfloat16
    assert np.array_equal(t.view(torch.int16).numpy().view(np.uint16), expected[0]["gate_up"])
    assert eb.banks["gate_up_scale"][1].dtype == torch.float8_e4m3fn
    assert eb.banks["gate_up_scale"][0].shape == (E, 0)


def test_compressed_file_loads_the_same(tmp_path):
    rng = np.random.default_rng()
    # realistic bf16 weights compress (the exponent bytes repeat); raw random bits would not
    w = (rng.standard_normal((E, 2 * I, H), dtype=np.float32) * 0.02).view(np.uint32) >> 16
    gate_up = w.astype(np.uint16)
    path = tmp_path / "z.ftw"
    with FtwWriter(path, compress_level=3) as wr:
        wr.add_layer(LayerBanks(7, LayerFormat.of("bf16"), {
            "gate_up": BankSource("bf16", (2 * I, H), E, lambda e: [gate_up[e]]),
            "down": BankSource("bf16", (H, I), E, lambda e: [gate_up[e, :H // 2].reshape(H, I)]),
        }))
    with ftw.open(path) as f:
        assert f.layers[7]["gate_up"].codec == "zstd-bytesplit"
    eb = load_expert_banks(path, threads=2)
    assert np.array_equal(eb.banks["gate_up"][7], gate_up)


def test_merge_refuses_overlap_and_disagreeing_experts(mixed):
    path, _ = mixed
    a = load_expert_banks(path, layers=[0, 1])
    b = load_expert_banks(path, layers=[1, 2])
    with pytest.raises(MergeError, match="layer 1"):
        merge_expert_banks([a, b])
    c = load_expert_banks(path, layers=[3])
    c.num_experts = E + 1
    with pytest.raises(MergeError, match="expert count"):
        merge_expert_banks([a, c])
    merged = merge_expert_banks([a, load_expert_banks(path, layers=[2, 3, 4])])
    full = load_expert_banks(path)
    for name in full.banks:
        for layer in LAYERS:
            assert np.array_equal(merged.banks[name][layer], full.banks[name][layer])


def test_unknown_layer_is_an_error(mixed):
    path, _ = mixed
    with pytest.raises(ftw.FtwError, match="no MoE layer 9"):
        load_expert_banks(path, layers=[9])


def test_close_releases_the_map_after_compressed_reads(tmp_path):
    rng = np.random.default_rng()
    w = ((rng.standard_normal((E, 2 * I, H), dtype=np.float32) * 0.02).view(np.uint32) >> 16).astype(np.uint16)
    path = tmp_path / "z.ftw"
    with FtwWriter(path, compress_level=3) as wr:
        wr.add_layer(LayerBanks(2, LayerFormat.of("bf16"), {
            "gate_up": BankSource("bf16", (2 * I, H), E, lambda e: [w[e]]),
            "down": BankSource("bf16", (H, I), E, lambda e: [w[e, :H // 2].reshape(H, I)]),
        }))
    f = ftw.open(path)
    assert np.array_equal(f.expert_row(2, "gate_up", 1), w[1])
    mm = f.mm
    f.close()
    assert mm.closed
