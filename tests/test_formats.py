"""The format registry: options schemas, strict writing, lenient opening, the activation,
and files written before the registry (1.0) still opening."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from helpers_container import index_of, rng, with_index, write_sample  # noqa: F401 (rng: fixture)

import ftw
from ftw.banks import BankSource, LayerBanks
from ftw.errors import FormatError, UnsupportedError
from ftw.formats import FORMATS, Activation, LayerFormat, ModelShape
from ftw.writers import FtwWriter

BAD_OPTIONS = [
    ("gguf", {}, "needs option 'down_type'"),
    ("gguf", {"gate_up_type": "Q4_K"}, "down_type"),
    ("gguf", {"gate_up_type": "Q9_X", "down_type": "Q4_K"}, "'gate_up_type' must be a ggml type name"),
    ("gguf", {"gate_up_type": "Q4_K", "gate_type": "Q4_K", "up_type": "Q4_K", "down_type": "Q6_K"},
     "excludes"),
    ("gguf", {"gate_type": "Q4_K", "down_type": "Q6_K"}, "go together"),
    ("fp8_block", {"block_size": [128]}, "'block_size' must be two positive integers"),
    ("fp8_block", {"block_size": [0, 128]}, "'block_size'"),
    ("fp8_block", {"block_size": [128.0, 128]}, "'block_size'"),
    ("ds_fp4", {"act_block": 0}, "'act_block' must be a positive integer"),
    ("ds_fp4", {"scale_fmt": "e5m2"}, "'scale_fmt' must be one of"),
    ("affine", {"bits": 4}, "needs option 'group_size'"),
    ("affine", {"bits": 7, "group_size": 64}, "'bits' must be one of"),
    ("nvfp4", {"block": 16}, "nvfp4 has no option 'block'"),
    ("bf16", {"activation": "silu"}, "bf16 has no option 'activation'"),  # 1.0 kept it there
    ("mxfp4", {"swiglu_limit": 7.0}, "mxfp4 has no option 'swiglu_limit'"),
]


@pytest.mark.parametrize("name,options,expected", BAD_OPTIONS)
def test_options_are_validated_naming_layer_and_option(name, options, expected):
    with pytest.raises(FormatError) as e:
        LayerFormat.of(name, options, "layer 7")
    assert "layer 7" in str(e.value) and expected in str(e.value)


def test_unknown_format_name_is_refused_when_made_but_kept_when_read():
    with pytest.raises(UnsupportedError, match="not known"):
        LayerFormat.of("fp3_magic")
    lf = LayerFormat.from_json({"name": "fp3_magic", "options": {"x": 1}}, "layers.0")
    assert not lf.known and lf.options == {"x": 1}
    with pytest.raises(UnsupportedError, match="fp3_magic"):
        lf.decode({}, 8, 8)


def test_legacy_option_keys_are_read_but_not_written():
    lf = LayerFormat.from_json({"name": "mxfp4", "options": {"swiglu_limit": 7.0, "swiglu_alpha": 1.702}}, "x")
    assert lf.known
    with pytest.raises(FormatError, match="nvfp4 has no option"):
        LayerFormat.from_json({"name": "nvfp4", "options": {"swiglu_limit": 7.0}}, "x")


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_declares_gate_up_and_down_rows(name):
    options = {"gguf": {"gate_up_type": "Q8_0", "down_type": "Q8_0"}, "affine": {"bits": 4, "group_size": 32}}
    H, I = 256, 128  # noqa: E741
    specs = LayerFormat.of(name, options.get(name, {})).banks(H, I)
    assert list(specs) == list(FORMATS[name].bank_names)
    assert specs["gate_up"].row_shape[0] == 2 * I and specs["down"].row_shape[0] == H
    shapes = {n: s.row_shape for n, s in specs.items()}
    assert FORMATS[name].infer_dims(shapes, options.get(name, {})) == (H, I)


def test_gguf_rows_with_different_gate_and_up_types_are_one_flat_row():
    specs = LayerFormat.of("gguf", {"gate_type": "Q4_K", "up_type": "Q6_K", "down_type": "Q8_0"}).banks(512, 256)
    assert specs["gate_up"].row_shape == (256 * 2 * 144 + 256 * 2 * 210,)
    assert specs["down"].row_shape == (512, 256 // 32 * 34)
    with pytest.raises(FormatError, match="whole blocks of 256"):
        LayerFormat.of("gguf", {"gate_up_type": "Q4_K", "down_type": "Q4_K"}).banks(100, 256)


# -- the activation ---------------------------------------------------------------------------


def test_activation_formulas_reach_their_clamps():
    g = np.array([-30.0, -1.0, 0.5, 3.0, 12.0])
    u = np.array([-20.0, 2.0, -0.5, 9.0, 40.0])
    silu = lambda x: x / (1 + np.exp(-x))  # noqa: E731
    np.testing.assert_allclose(Activation("silu").apply(g, u), silu(g) * u, rtol=1e-15)
    gl, ul = np.minimum(g, 10.0), np.clip(u, -10.0, 10.0)
    assert (gl != g).any() and (ul != u).any()  # the values do reach the clamp
    np.testing.assert_allclose(Activation("silu", limit=10.0).apply(g, u), silu(gl) * ul, rtol=1e-15)
    g7, u7 = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0)
    want = (u7 + 1) * g7 / (1 + np.exp(-1.702 * g7))
    np.testing.assert_allclose(Activation("swiglu_oai", alpha=1.702, limit=7.0).apply(g, u), want, rtol=1e-15)


@pytest.mark.parametrize("kw,expected", [
    (dict(kind="gelu"), "not an activation"),
    (dict(kind="silu", limit=float("nan")), "finite positive"),
    (dict(kind="silu", limit=-1.0), "finite positive"),
    (dict(kind="silu", alpha=1.0), "no alpha"),
    (dict(kind="swiglu_oai", limit=7.0), "needs alpha and limit"),
])
def test_bad_activations_are_refused(kw, expected):
    with pytest.raises(FormatError, match=expected):
        Activation(**kw)


def test_activation_of_1_0_files_is_read_from_extra():
    a = Activation.from_json("swiglu_oai", "m", {"swiglu_limit": 5.0, "swiglu_alpha": 1.5})
    assert a == Activation("swiglu_oai", alpha=1.5, limit=5.0)
    assert Activation.from_json("swiglu_oai", "m", {}) == Activation("swiglu_oai", alpha=1.702, limit=7.0)
    assert Activation.from_json("silu", "m", {"swiglu_limit": 10.0}) == Activation("silu", limit=10.0)
    assert Activation.from_json({"kind": "future_act", "limit": 3.0}, "m").kind == "future_act"
    with pytest.raises(FormatError, match="finite positive"):
        Activation.from_json({"kind": "silu", "limit": "abc"}, "m")


def test_model_json_round_trips_with_per_layer_widths():
    m = ModelShape("t", 64, 32, 4, 2, 6, [1, 2, 3], Activation("silu", limit=10.0), {"x": 1}, {3: 48})
    back = ModelShape.from_json(m.to_json(), "m")
    assert back == m and back.intermediate_size(3) == 48 and back.intermediate_size(1) == 32
    old = dict(m.to_json(), activation="silu", extra={"moe_intermediate_sizes": {"1": 32, "3": 48}})
    del old["moe_intermediate_sizes"]
    assert ModelShape.from_json(old, "m").layer_intermediate_sizes == {3: 48}


# -- strict writing, lenient opening ----------------------------------------------------------


def _bf16_layer(rng, E=2, H=64, I=32, **extra):  # noqa: E741
    gu = rng.integers(0, 1 << 16, (E, 2 * I, H), dtype=np.uint16)
    d = rng.integers(0, 1 << 16, (E, H, I), dtype=np.uint16)
    banks = {"gate_up": BankSource("bf16", (2 * I, H), E, lambda e: [gu[e]]),
             "down": BankSource("bf16", (H, I), E, lambda e: [d[e]])}
    banks.update(extra)
    return LayerBanks(0, LayerFormat.of("bf16"), banks)


@pytest.mark.parametrize("change,expected", [
    (lambda lb: lb.banks.pop("down"), "lacks bank 'down'"),
    (lambda lb: lb.banks.update(gate_up_scale=lb.banks["down"]), "'gate_up_scale' is not a bank of bf16"),
    (lambda lb: setattr(lb.banks["down"], "dtype", "f16"), "'down' is f16"),
    (lambda lb: setattr(lb.banks["down"], "row_shape", (32, 64)), r"rows of shape \[32, 64\]"),
])
def test_the_writer_refuses_banks_that_contradict_the_format(tmp_path, rng, change, expected):  # noqa: F811
    lb = _bf16_layer(rng)
    change(lb)
    path = tmp_path / "w.ftw"
    with pytest.raises(FormatError, match=expected) as e:
        with FtwWriter(path) as w:
            w.set_model(ModelShape("t", 64, 32, 2, 1, 1, [0]))
            w.add_layer(lb)
    assert "layer 0" in str(e.value)
    assert not path.exists()


def test_a_file_whose_banks_contradict_their_format_opens_and_is_refused_where_used(tmp_path, rng):  # noqa: F811
    path = tmp_path / "m.ftw"
    write_sample(path, rng)
    data = path.read_bytes()
    ix = copy.deepcopy(index_of(data))
    ix["layer_quant_formats"]["3"] = {"name": "mxfp8", "options": {}}  # nvfp4 banks, labelled mxfp8
    bad = tmp_path / "bad.ftw"
    bad.write_bytes(with_index(data, ix))
    with ftw.open(bad) as f:  # lenient: it opens
        assert f.layer_formats[3].name == "mxfp8"
        for use in (f.verify, lambda: f.decode_expert(3, 0), lambda: ftw.load_expert_banks(f)):
            with pytest.raises(FormatError, match="layer 3") as e:
                use()
            assert "_global' is not a bank of mxfp8" in str(e.value)
        f.decode_expert(1, 0)  # the other layer is fine


def test_ds_fp4_banks_of_1_0_files_stored_as_i8_are_accepted():
    spec = LayerFormat.of("ds_fp4").banks(64, 32)["gate_up"]
    assert spec.dtypes == ("u8",) and spec.accepts("i8", reading=True) and not spec.accepts("i8")
