"""Tests for mutants that the mutation run of scripts/mutation.sh (mutmut) left alive. Each names
the mutation it kills; docs/TESTING.md lists every survivor with its judgement."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import ftw
from ftw import loader, spec
from ftw.errors import FtwError, MergeError, UnsupportedError
from ftw.formats import Activation, LayerFormat, ModelShape
from ftw.layer_ranges import format_layers, parse_layers
from ftw.loader import ExpertBanks, load_expert_banks, merge_expert_banks

# --- ftw/layer_ranges.py ----------------------------------------------------------------------


# kills: `or` -> `and` in the "no selection" test; "" / "all" mutated
@pytest.mark.parametrize("text", [None, "", "  ", "all", " all "])
def test_no_selection_means_every_layer(text):
    assert parse_layers(text) is None
    assert parse_layers(text, limit=4) is None


# kills: the model's layer count ignored (bound always the format's limit), min() arguments lost
def test_a_range_past_the_models_layers_is_refused_naming_them():
    assert parse_layers("0-3", limit=4) == [0, 1, 2, 3]
    with pytest.raises(FtwError) as e:
        parse_layers("2-4", limit=4)
    msg = str(e.value)
    assert "'2-4'" in msg and "the model's 4 layers" in msg and "highest index 3" in msg


# kills: `hi >= bound` -> `hi > bound`; the format-limit message and its highest index
def test_the_format_limit_is_the_bound_without_a_model():
    top = spec.MAX_LAYERS - 1
    assert parse_layers(f"{top}") == [top]
    with pytest.raises(FtwError) as e:
        parse_layers(f"{spec.MAX_LAYERS}")
    msg = str(e.value)
    assert f"the format's limit of {spec.MAX_LAYERS} layers" in msg and f"highest index {top}" in msg
    # a model with more layers than the format allows is still bounded by the format
    with pytest.raises(FtwError, match="the format's limit"):
        parse_layers(f"{spec.MAX_LAYERS}", limit=spec.MAX_LAYERS + 10)


# kills: `lo is None or hi is None or lo > hi` with an `or` turned into `and`; the message lost
@pytest.mark.parametrize("text", ["3-1", "x-3", "3-", "-3", "1-x", "01-3", "1,,2"])
def test_malformed_parts_are_refused_naming_the_part(text):
    with pytest.raises(FtwError) as e:
        parse_layers(text)
    assert "is not a layer index or range like 0-3" in str(e.value)


# kills: format_layers stepping past the layer after a run; the separator mutated
@pytest.mark.parametrize("layers, text", [
    ([0, 2], "0,2"), ([0, 1, 2, 3, 10], "0-3,10"), ([5, 1, 2, 7, 8, 9], "1-2,5,7-9"), ([4], "4"), ([], ""),
])
def test_format_layers_is_the_inverse_of_parse_layers(layers, text):
    assert format_layers(layers) == text
    if layers:
        assert parse_layers(text) == sorted(layers)


# --- ftw/loader.py ----------------------------------------------------------------------------

LE, LH, LI = 4, 64, 32  # as in test_loader, whose layer builders make the banks


@pytest.fixture(scope="module")
def mixed_file(tmp_path_factory):
    """bf16 at layers 0 and 3, nvfp4 at 1 and 2: random bytes, never zeros."""
    from test_loader import _bf16_layer, _nvfp4_layer

    from ftw.formats import ModelShape
    from ftw.writers import FtwWriter

    rng = np.random.default_rng()
    path = tmp_path_factory.mktemp("mutants_loader") / "mixed.ftw"
    model = ModelShape("test", LH, LI, LE, 2, 4, [0, 1, 2, 3])
    expected = {}
    with FtwWriter(path) as w:
        w.set_model(model)
        for layer in range(4):
            lb, arrays = (_bf16_layer if layer in (0, 3) else _nvfp4_layer)(rng, layer)
            w.add_layer(lb)
            expected[layer] = arrays
    return path, expected, model


NVFP4_DTYPES = {"gate_up": "u8", "down": "u8", "gate_up_scale": "f8_e4m3", "down_scale": "f8_e4m3",
                "gate_up_global": "f32", "down_global": "f32"}


# kills: the bank dtypes lost or keyed wrongly (setdefault mutated in _load_format and merge,
# dtypes= dropped from the merge); the model shape dropped by _load_format or by the merge
def test_load_reports_bank_dtypes_and_the_model(mixed_file):
    path, _, model = mixed_file
    only_nvfp4 = load_expert_banks(path, layers=[1, 2])
    assert only_nvfp4.dtypes == NVFP4_DTYPES
    assert only_nvfp4.model == model
    full = load_expert_banks(path)
    assert full.model == model
    # the first format loaded (bf16, layer 0) names the shared banks; the rest come from nvfp4
    assert full.dtypes == {**NVFP4_DTYPES, "gate_up": "bf16", "down": "bf16"}


# kills: progress(None), and chunk offsets / counts: the copy split at COPY_CHUNK, forced small
# here so that every bank spans several chunks (lo - offset, hi + lo, a range without its step)
def test_chunked_copy_is_exact_and_progress_counts_every_byte(mixed_file, monkeypatch):
    path, expected, _ = mixed_file
    monkeypatch.setattr(loader, "COPY_CHUNK", 1000)  # not a divisor of any bank's size
    seen = []
    eb = load_expert_banks(path, progress=seen.append, threads=3)
    for layer, arrays in expected.items():
        for name, a in arrays.items():
            assert np.array_equal(eb.banks[name][layer], a), (name, layer)
    assert all(isinstance(n, int) and 0 < n <= 1000 for n in seen)
    assert sum(seen) == sum(a.nbytes for arrays in expected.values() for a in arrays.values())


# kills: ExpertBanks.pinned None / True for a numpy load
def test_a_numpy_load_is_not_pinned(mixed_file):
    eb = load_expert_banks(mixed_file[0], layers=[0])
    assert eb.pinned is False
    assert all(isinstance(a, np.ndarray) for per_layer in eb.banks.values() for a in per_layer.values())


# kills: numel() / element_size() in _nbytes (ExpertBanks.nbytes of torch banks); np.empty
# instead of the page-aligned host buffer for pin=True; pinned tensors not page-locked (on CUDA)
def test_pinned_load_counts_bytes_and_uses_page_aligned_locked_buffers(mixed_file):
    torch = pytest.importorskip("torch")
    path, expected, _ = mixed_file
    eb = load_expert_banks(path, pin=True)
    assert eb.nbytes == sum(a.nbytes for arrays in expected.values() for a in arrays.values())
    page = os.sysconf("SC_PAGE_SIZE")
    for name, per_layer in eb.banks.items():
        for layer, t in per_layer.items():
            if t.numel():
                assert t.data_ptr() % page == 0, (name, layer)
                assert t.is_pinned() == torch.cuda.is_available(), (name, layer)


# kills: the "nothing to merge" message lost; ExpertBanks.pinned not carried by the merge
def test_merge_of_nothing_and_of_pinned_parts():
    with pytest.raises(MergeError, match=r"^merge_expert_banks: nothing to merge$"):
        merge_expert_banks([])
    fmt = LayerFormat.of("bf16")

    def part(layer, pinned):
        a = np.random.default_rng().integers(1, 0xFFFF, (2, 8), dtype=np.uint16)
        return ExpertBanks({"down": {layer: a}}, {layer: fmt}, 2, {"down": "bf16"}, None, pinned)

    assert merge_expert_banks([part(0, True), part(1, True)]).pinned is True
    assert merge_expert_banks([part(0, True), part(1, False)]).pinned is False


# kills: sorted(None) when every layer's bank is empty (no layer has bytes)
def test_merge_of_a_bank_empty_in_every_layer_takes_the_lowest_layers_dtype():
    fmt = LayerFormat.of("bf16")
    p0 = ExpertBanks({"bias": {2: np.empty((3, 0), np.float16)}}, {2: fmt}, 3, {"bias": "f16"})
    p1 = ExpertBanks({"bias": {5: np.empty((3, 0), np.float32)}}, {5: fmt}, 3, {"bias": "f32"})
    p2 = ExpertBanks({}, {7: fmt}, 3)
    m = merge_expert_banks([p1, p2, p0])
    assert m.layers == [2, 5, 7]
    assert m.banks["bias"][7].shape == (3, 0) and m.banks["bias"][7].dtype == np.float16


# kills: the "no MoE layers" error without its message
def test_loading_no_layers_is_one_error_naming_the_file(mixed_file):
    path = mixed_file[0]
    with pytest.raises(FtwError, match=r"mixed\.ftw: no MoE layers to load"):
        load_expert_banks(path, layers=[])


# kills: `experts.pop() if experts else 0` with the guard removed (KeyError from an empty set)
# or the fallback changed to 1: a layer of a format this ftw does not know may carry no banks
def test_a_layer_without_banks_loads_as_empty(tmp_path):
    from helpers_container import index_of, with_index, write_sample

    path = tmp_path / "m.ftw"
    write_sample(path, np.random.default_rng())
    data = path.read_bytes()
    ix = index_of(data)
    ix["layers"]["3"]["banks"] = {}
    ix["layer_quant_formats"]["3"] = {"name": "someday_fp3", "options": {}}
    empty = tmp_path / "empty.ftw"
    empty.write_bytes(with_index(data, ix))
    eb = load_expert_banks(empty, layers=[3])
    assert eb.layers == [3] and eb.banks == {} and eb.num_experts == 0 and eb.nbytes == 0


# --- ftw/formats/ -----------------------------------------------------------------------------
# Several of these kill mutants of code that runs at import (a table built once, a check
# closure made in a class body, a class decorator): mutmut cannot switch those on after
# import, so docs/TESTING.md shows them killed with the mutant applied to the source by hand.


# kills: every mutant of codes._e4m3_table (sign, exponent, mantissa, subnormals, NaN)
def test_e4m3_table_matches_torchs_float8_e4m3fn():
    torch = pytest.importorskip("torch")
    from ftw.formats.codes import E4M3

    ref = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float64).numpy()
    assert np.array_equal(E4M3, ref, equal_nan=True)


# kills: one_of accepting anything / a value of another type / refusing every value, and its
# message; positive_int refusing 1
def test_option_checks_accept_every_listed_value_and_name_the_choices():
    for bits in (2, 3, 4, 5, 6, 8):
        assert LayerFormat.of("affine", {"bits": bits, "group_size": 1}).options["bits"] == bits
    assert LayerFormat.of("ds_fp4", {"scale_fmt": "float", "act_block": 1}).options["scale_fmt"] == "float"
    for bad in (7, 4.0, "4"):
        with pytest.raises(FtwError) as e:
            LayerFormat.of("affine", {"bits": bad, "group_size": 64}, where="layer 3")
        assert str(e.value) == f"layer 3: affine option 'bits' must be one of 2, 3, 4, 5, 6, 8, got {bad!r}"
    with pytest.raises(FtwError, match=r"scale_fmt' must be one of 'ue8m0', 'float', got 'e8m0'"):
        LayerFormat.of("ds_fp4", {"scale_fmt": "e8m0"})
    with pytest.raises(FtwError, match="group_size' must be a positive integer, got 0"):
        LayerFormat.of("affine", {"bits": 4, "group_size": 0})


# kills: register accepting a taken or empty name, or storing None
def test_register_refuses_a_taken_or_empty_name_and_stores_the_class():
    from ftw.formats import FORMATS
    from ftw.formats.base import ExpertFormat, register

    class Taken(ExpertFormat):
        name = "bf16"

    class Empty(ExpertFormat):
        name = ""

    class Fresh(ExpertFormat):
        name = "mutants_probe_format"

    for cls in (Taken, Empty):
        with pytest.raises(ValueError, match=f"format class {cls.__name__}: name {cls.name!r} is empty or taken"):
            register(cls)
    assert FORMATS["bf16"].__name__ != "Taken"
    try:
        assert register(Fresh) is Fresh and FORMATS["mutants_probe_format"] is Fresh
    finally:
        FORMATS.pop("mutants_probe_format", None)


# kills: LayerFormat.key's options dropped or its separators changed
def test_layer_format_key_lists_sorted_options():
    assert LayerFormat.of("nvfp4").key() == "nvfp4"
    fmt = LayerFormat.of("affine", {"group_size": 64, "bits": 4})
    assert fmt.key() == str(fmt) == "affine{bits=4,group_size=64}"


# kills: Activation.__str__ mutants (parameter names, which are shown, the kind alone)
def test_activation_str_names_its_parameters():
    assert str(Activation("silu")) == "silu"
    assert str(Activation("silu", limit=10.0)) == "silu(limit=10)"
    assert str(Activation("swiglu_oai", limit=7.0, alpha=1.702)) == "swiglu_oai(alpha=1.702, limit=7)"


# kills: Activation.from_json's shape check (`or` -> `and`, message lost), its limit / alpha
# check skipped for a kind this ftw does not know, `where` lost on validation; limit 0 accepted
def test_activation_from_json_refuses_bad_objects_naming_where():
    for bad in (5, {"limit": 3.0}, {"kind": 3}):
        with pytest.raises(FtwError, match=r"^model\.activation: activation must be \{kind, limit\?, alpha\?\}"):
            Activation.from_json(bad, "model.activation")
    for k in ("limit", "alpha"):
        with pytest.raises(FtwError, match=f"^m: activation {k} must be a finite positive number, got -1.0"):
            Activation.from_json({"kind": "future_act", k: -1.0}, "m")
    assert Activation.from_json({"kind": "future_act", "limit": 2.0}, "m").kind == "future_act"
    with pytest.raises(FtwError, match="^model.activation: silu takes no alpha$"):
        Activation.from_json({"kind": "silu", "alpha": 1.0}, "model.activation")
    with pytest.raises(FtwError, match="limit must be a finite positive number"):
        Activation("silu", limit=0.0)


# kills: Activation.apply computing in the input's precision (float32) instead of float64; its
# error without the kind
def test_activation_apply_is_a_float64_reference():
    rng = np.random.default_rng()
    gate = rng.standard_normal((3, 40)).astype(np.float32) * 4
    up = rng.standard_normal((3, 40)).astype(np.float32) * 4
    g, u = gate.astype(np.float64), up.astype(np.float64)
    silu = Activation("silu", limit=5.0).apply(gate, up)
    gc, uc = np.minimum(g, 5.0), np.clip(u, -5.0, 5.0)
    assert silu.dtype == np.float64
    np.testing.assert_allclose(silu, gc / (1 + np.exp(-gc)) * uc, rtol=1e-14, atol=0)
    oai = Activation("swiglu_oai", limit=7.0, alpha=1.702).apply(gate, up)
    gc, uc = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0)
    np.testing.assert_allclose(oai, (uc + 1) * gc / (1 + np.exp(-1.702 * gc)), rtol=1e-14, atol=0)
    future = Activation.from_json({"kind": "future_act"}, "m")
    with pytest.raises(UnsupportedError, match="activation 'future_act' is not one ftw can compute"):
        future.apply(gate, up)


# kills: ModelShape.from_json refusing zero (its contract and message: non-negative integers)
def test_model_shape_fields_may_be_zero():
    d = ModelShape("test", 64, 32, 4, 2, 4, [1, 3]).to_json()
    for k in ("hidden_size", "moe_intermediate_size", "num_experts", "top_k", "num_layers"):
        assert getattr(ModelShape.from_json({**d, k: 0}, "w"), k) == 0
        with pytest.raises(FtwError, match=f"model.{k} must be a non-negative integer"):
            ModelShape.from_json({**d, k: -1}, "w")


# kills: fp8_block's block size option ignored, or its default (FORMAT.md: [128, 128] when the
# option is absent) changed; sizes picked so that 129 rounds differently from 128
def test_fp8_block_scale_shapes_follow_the_block_size_default_128():
    from ftw.formats import FORMATS

    fmt = FORMATS["fp8_block"]
    H, I = 258, 387
    default = fmt.banks(H, I, {})
    assert default == fmt.banks(H, I, {"block_size": [128, 128]})
    assert default["gate_up_scale"].row_shape == (2 * -(-I // 128), -(-H // 128)) == (8, 3)  # gate, up blocked apart
    assert default["down_scale"].row_shape == (-(-H // 128), -(-I // 128)) == (3, 4)
    small = fmt.banks(H, I, {"block_size": [64, 32]})
    assert small["gate_up_scale"].row_shape == (2 * -(-I // 64), -(-H // 32)) == (14, 9)


# kills: ModelShape.from_json's defaults (family "", activation silu), the legacy extra passed to
# the activation, `where` in the activation's errors, the per-layer width checks
def test_model_shape_from_json_defaults_legacy_fields_and_width_checks():
    d = ModelShape("test", 64, 32, 4, 2, 4, [1, 3]).to_json()
    bare = {k: v for k, v in d.items() if k not in ("family", "activation", "extra")}
    m = ModelShape.from_json(bare, "w")
    assert m.family == "" and m.activation == Activation("silu") and m.extra == {}
    old = ModelShape.from_json({**bare, "activation": "silu", "extra": {"swiglu_limit": 10.0}}, "w")
    assert old.activation == Activation("silu", limit=10.0)
    assert ModelShape.from_json({**bare, "extra": "not an object"}, "w").extra == {}
    with pytest.raises(FtwError, match=r"^f\.ftw: model\.activation: silu takes no alpha$"):
        ModelShape.from_json({**bare, "activation": {"kind": "silu", "alpha": 1.0}}, "f.ftw")
    wide = ModelShape.from_json({**bare, "moe_intermediate_sizes": {"1": 32, "3": 0}}, "w")
    assert wide.layer_intermediate_sizes == {3: 0}
    for bad in ({"x": 32}, {"1": -1}, {"1": 2.0}, [32]):
        with pytest.raises(FtwError, match=r"^w: model\.moe_intermediate_sizes must map layer keys to non-negative"):
            ModelShape.from_json({**bare, "moe_intermediate_sizes": bad}, "w")


# kills: check_banks reading rules (older writers' dtypes accepted only when reading, named in
# the message), its unknown-bank message; LayerFormat.from_json without options; the default
# `where` of LayerFormat.of and of Activation's own validation
def test_bank_checks_take_older_dtypes_only_when_reading():
    from ftw.formats import FORMATS

    ds = FORMATS["ds_fp4"]
    H, I = 64, 32
    shapes = {n: (s.dtypes[0], s.row_shape) for n, s in ds.banks(H, I, {}).items()}
    old = {**shapes, "gate_up": ("i8", shapes["gate_up"][1])}
    ds.check_banks(old, H, I, {}, "f", reading=True)
    ds.check_banks({**old, "down": ("i8", shapes["down"][1])}, H, I, {}, "f", reading=True)
    with pytest.raises(FtwError, match=r"^f: bank 'gate_up' is i8, ds_fp4 stores it as u8$"):
        ds.check_banks(old, H, I, {}, "f")
    bad = {**shapes, "gate_up": ("f16", shapes["gate_up"][1])}
    with pytest.raises(FtwError, match=r"^f: bank 'gate_up' is f16, ds_fp4 stores it as u8/i8$"):
        ds.check_banks(bad, H, I, {}, "f", reading=True)
    with pytest.raises(FtwError, match=r"^f: bank 'extra' is not a bank of ds_fp4 \(banks: gate_up, down, "):
        ds.check_banks({**shapes, "extra": ("u8", (1,))}, H, I, {}, "f")


def test_layer_format_and_activation_name_where_by_default():
    assert LayerFormat.from_json({"name": "nvfp4"}, "w") == LayerFormat.of("nvfp4")
    with pytest.raises(FtwError, match=r"^layer format: affine option 'bits'"):
        LayerFormat.of("affine", {"bits": 7, "group_size": 1})
    with pytest.raises(FtwError, match=r"^activation: kind 'gelu' is not an activation ftw knows"):
        Activation("gelu")


# kills: mxfp4's expert biases made optional (gpt-oss always has them)
def test_mxfp4_layers_need_their_biases():
    from ftw.formats import FORMATS

    mx = FORMATS["mxfp4"]
    shapes = {n: (s.dtypes[0], s.row_shape) for n, s in mx.banks(64, 32, {}).items()}
    del shapes["down_bias"]
    with pytest.raises(FtwError, match=r"^f: mxfp4 layer lacks bank 'down_bias'$"):
        mx.check_banks(shapes, 64, 32, {}, "f")



# kills: ggml_types: the Q8_1 size fix, sizes or names lost, the unknown-id and unknown-name
# messages (their default `where`), a non-string name looked up, known_types' filter
def test_ggml_types_sizes_names_and_errors():
    import re

    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    from ftw.formats.ggml_types import ggml_type, ggml_type_named, known_types

    types = known_types()
    assert [t.id for t in types] == [q.value for q in GGMLQuantizationType if q in GGML_QUANT_SIZES]
    assert ggml_type_named("Q8_1").nbytes == 36  # ggml's block_q8_1, not gguf 0.19's 40
    for t in types:
        q = GGMLQuantizationType(t.id)
        assert t.name == q.name
        assert (t.block, t.nbytes) == ((32, 36) if q.name == "Q8_1" else GGML_QUANT_SIZES[q])
        assert ggml_type_named(t.name, "w: ") == t == ggml_type(t.id, "w")
    with pytest.raises(UnsupportedError, match=r"^w: ggml type id 9999 is unknown to the installed gguf package \(a newer"):
        ggml_type(9999, "w")
    for bad in ("Q9_Z", 5, ["Q4_K"]):
        with pytest.raises(UnsupportedError, match=rf"^w: ggml type {re.escape(repr(bad))} is unknown to the installed"):
            ggml_type_named(bad, "w: ")
    with pytest.raises(UnsupportedError, match=r"^ggml type 'Q9_Z' is unknown"):
        ggml_type_named("Q9_Z")


# kills: gguf: the example type names in the option error, f16 expert biases refused,
# infer_dims dividing with `/` (a float I), the messages when gguf.quants cannot decode a type
def test_gguf_options_biases_dims_and_undecodable_types():
    from ftw.formats import FORMATS
    from ftw.formats.gguf import row_nbytes

    gg = FORMATS["gguf"]
    with pytest.raises(FtwError, match=r"a ggml type name \(Q4_K, Q6_K, IQ2_XS, \.\.\.\)"):
        LayerFormat.of("gguf", {"gate_up_type": "Q9_Z", "down_type": "Q4_K"})
    H, I = 256, 512
    opts = {"gate_up_type": "Q4_K", "down_type": "Q6_K"}
    shapes = {n: (s.dtypes[0], s.row_shape) for n, s in gg.banks(H, I, opts).items()}
    for dt in ("f32", "f16"):
        gg.check_banks({**shapes, "gate_up_bias": (dt, (2 * I,)), "down_bias": (dt, (H,))}, H, I, opts, "f")
    dims = gg.infer_dims({"down": (H, row_nbytes("Q6_K", I))}, opts)
    assert dims == (H, I) and all(type(d) is int for d in dims)
    rng = np.random.default_rng()
    q8k = {"gate_up_type": "Q8_K", "down_type": "Q8_K"}  # gguf.quants has no Q8_K decoder
    rows = {"gate_up": rng.integers(0, 256, (2 * I, row_nbytes("Q8_K", H)), dtype=np.uint8),
            "down": rng.integers(0, 256, (H, row_nbytes("Q8_K", I)), dtype=np.uint8)}
    with pytest.raises(UnsupportedError, match=r"^gguf\.quants cannot decode Q8_K/Q8_K/Q8_K: "):
        gg.decode(rows, H, I, q8k)
    with pytest.raises(UnsupportedError, match=r"^gguf\.quants cannot decode Q8_K: "):
        gg.decode_projection({"weight": rows["down"], "type": "Q8_K"}, q8k)

# --- ftw/writers/atomic.py --------------------------------------------------------------------


# kills: AtomicFile.commit's error without the destination, the step or the OS's reason
def test_a_failed_commit_names_the_destination_and_the_os_error(tmp_path, monkeypatch):
    import errno

    from ftw.writers import atomic

    def eio(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    dst = tmp_path / "out.bin"
    f = atomic.AtomicFile(dst)
    f.write(np.random.default_rng().integers(0, 256, 5000, dtype=np.uint8))
    monkeypatch.setattr(atomic.os, "fsync", eio)
    with pytest.raises(FtwError) as e:
        f.commit()
    assert str(e.value) == f"{dst}: cannot commit: {os.strerror(errno.EIO)}"
    assert os.listdir(tmp_path) == [] and f.fd < 0  # aborted: nothing left, the file closed


# kills: `_COMMITS.append(None)` (committed() then fails for every later report); committed()
# ("no tests" in mutmut: only the CLI's interrupted-conversion report calls it) skips a
# destination gone since, and compares the inode, so a file put there by someone else afterwards is not reported
def test_committed_lists_the_destinations_this_process_put_in_place(tmp_path):
    from ftw.writers import atomic

    data = np.random.default_rng().integers(0, 256, 3000, dtype=np.uint8).tobytes()
    gone, mine, other = tmp_path / "gone.bin", tmp_path / "mine.bin", tmp_path / "other.bin"
    for p in (gone, mine, other):
        f = atomic.AtomicFile(p)
        f.write(data)
        f.commit()
        assert p.read_bytes() == data
    os.unlink(gone)  # listed before the others: skipped, and the rest still reported
    assert {str(mine), str(other)} <= set(atomic.committed()) and str(gone) not in atomic.committed()
    (tmp_path / "new").write_bytes(data)  # same bytes, another inode: not the file this process wrote
    os.replace(tmp_path / "new", other)
    assert str(mine) in atomic.committed() and str(other) not in atomic.committed()


# kills: the reaper's stdout / stderr not /dev/null (it would hold the writer's own output pipes
# open: a caller reading them would wait for the reaper), the reaper left in the writer's
# session (a Ctrl-C or group kill would take it too)
@pytest.mark.parametrize("out_fd", [1, 2])
def test_the_reaper_runs_in_its_own_session_with_its_output_discarded(tmp_path, monkeypatch, out_fd):
    from ftw.writers import atomic

    monkeypatch.setattr(atomic, "_anonymous_files_link", lambda folder: False)  # the named-file path
    r, w = os.pipe()
    saved = os.dup(out_fd)
    try:
        os.dup2(w, out_fd)  # the writer's output is this pipe while it starts the reaper
        os.close(w)
        f = atomic.AtomicFile(tmp_path / "out.bin")
    finally:
        os.dup2(saved, out_fd)
        os.close(saved)
    try:
        os.set_blocking(r, False)
        assert os.read(r, 1) == b""  # end of file: no other process holds the pipe's write end
        assert os.getsid(f._reaper.pid) == f._reaper.pid != os.getsid(0)
    finally:
        os.close(r)
        f.abort()
    assert os.listdir(tmp_path) == []


# kills: AtomicFile.write's error without the destination, the step or the OS's reason; its
# return value (the bytes written) lost; a short write (Linux writes at most 2 GiB - 4 KiB per
# call) not continued; writes any buffer (a float array) as its bytes
def test_write_continues_short_writes_and_names_a_failure(tmp_path, monkeypatch):
    import errno

    from ftw.writers import atomic

    real_write = os.write
    monkeypatch.setattr(atomic.os, "write", lambda fd, b: real_write(fd, b[:4096]))
    data = np.random.default_rng().standard_normal(5000).astype(np.float32)
    dst = tmp_path / "out.bin"
    f = atomic.AtomicFile(dst)
    assert f.write(data) == data.nbytes
    f.commit()
    assert dst.read_bytes() == data.tobytes()

    def enospc(fd, b):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "write", enospc)
    f = atomic.AtomicFile(tmp_path / "full.bin")
    with pytest.raises(FtwError) as e:
        f.write(data)
    f.abort()
    assert str(e.value) == f"{tmp_path / 'full.bin'}: cannot write: {os.strerror(errno.ENOSPC)}"
    assert os.listdir(tmp_path) == ["out.bin"]


# kills: the PC_NAME_MAX query mutated (the 255 fallback taken instead), its fallback lost or
# 256; the cut of the name (its arithmetic, `max(2, ...)`), the name's folder, prefix and random
# part: on a filesystem whose names are shorter (eCryptfs: 143 bytes) the temporary name must
# fit, and it keeps as much of the destination's name as fits
@pytest.mark.parametrize("name_max", [143, 15, None])
def test_the_temporary_name_fits_the_folders_name_max(tmp_path, monkeypatch, name_max):
    import re

    from ftw.writers import atomic

    real_pathconf = os.pathconf

    def pathconf(path, name):
        if name_max is None:
            raise OSError(22, "Invalid argument")  # a filesystem that does not say
        return name_max if name == "PC_NAME_MAX" else real_pathconf(path, name)

    monkeypatch.setattr(atomic, "_anonymous_files_link", lambda folder: False)  # the named-file path
    monkeypatch.setattr(atomic.os, "pathconf", pathconf)
    limit = name_max or 255
    dst = tmp_path / ("m" * (limit - 4) + ".ftw")  # the longest name the folder takes
    f = atomic.AtomicFile(dst)
    assert os.path.dirname(f._named_tmp) == str(tmp_path)
    tmp = os.path.basename(f._named_tmp)
    kept = limit - 1 - len(".12345678.tmp")
    assert re.fullmatch(rf"\.{dst.name[:kept]}\.[0-9a-f]{{8}}\.tmp", tmp) and len(tmp) == limit, tmp
    payload = np.random.default_rng().integers(0, 256, 999, dtype=np.uint8)
    f.write(payload)
    f.commit()
    assert dst.read_bytes() == payload.tobytes() and os.listdir(tmp_path) == [dst.name]


# kills: AtomicFile's default force=True (an existing file replaced unasked); the temporary
# file's mode 0o644 lost (0o777 by default) or changed
def test_atomic_file_keeps_an_existing_file_by_default_and_writes_mode_644(tmp_path):
    from ftw.errors import DestinationExistsError
    from ftw.writers import atomic

    old = tmp_path / "old.bin"
    old.write_bytes(b"theirs")
    with pytest.raises(DestinationExistsError, match="exists"):
        atomic.AtomicFile(old)
    assert old.read_bytes() == b"theirs"
    umask = os.umask(0o022)
    try:
        f = atomic.AtomicFile(tmp_path / "new.bin")
    finally:
        os.umask(umask)
    f.write(b"ours")
    f.commit()
    assert (tmp_path / "new.bin").stat().st_mode & 0o777 == 0o644


# kills: abort() closing only descriptors above 0 (a writer started with stdin closed, as a
# daemon may be, gets descriptor 0 for its file), or leaving fd set to a number after closing
# it (a second abort(), as after a failed commit, would close another file or fail)
def test_abort_closes_descriptor_0_and_can_be_repeated(tmp_path, monkeypatch):
    from ftw.writers import atomic

    monkeypatch.setattr(atomic, "_anonymous_files_link", lambda folder: False)  # the named-file path
    saved = os.dup(0)
    try:
        os.close(0)
        f = atomic.AtomicFile(tmp_path / "out.bin")
        assert f.fd == 0
        f.abort()
        with pytest.raises(OSError):
            os.fstat(0)  # closed by abort
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    assert f.fd < 0
    f.abort()
    assert os.listdir(tmp_path) == [] and os.fstat(0)


# kills: _anonymous_files_link's cache keyed by nothing (one filesystem's answer taken for
# every other), its errno rule inverted (a folder this user may not write is cached as the
# filesystem's answer, a filesystem without O_TMPFILE probed again and again), a refusal
# answered True, and an OS without O_TMPFILE taken to have it. The refusals are made by a
# stand-in os.open: as root on this machine no folder refuses O_TMPFILE.
def test_the_o_tmpfile_probe_is_cached_per_filesystem_not_per_refused_folder(tmp_path, monkeypatch):
    import errno

    from ftw.writers import atomic

    real_open = os.open
    probes, refusal = [], {}

    def tmpfile_refused(path, flags, mode=0o777):
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            probes.append(path)
            raise OSError(refusal[path], os.strerror(refusal[path]))
        return real_open(path, flags, mode)

    monkeypatch.setattr(atomic.os, "open", tmpfile_refused)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    refusal.update({str(a): errno.EOPNOTSUPP, str(b): errno.EACCES})
    for folder, probed in ((a, [a]), (b, [b, b])):  # EOPNOTSUPP: the filesystem's answer, kept
        monkeypatch.setattr(atomic, "_LINKABLE", {})
        probes.clear()
        assert not atomic._anonymous_files_link(str(folder)) and not atomic._anonymous_files_link(str(folder))
        assert probes == [str(p) for p in probed]
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.stat(shm).st_dev != os.stat(a).st_dev:
        monkeypatch.setattr(atomic, "_LINKABLE", {})
        refusal[shm] = errno.EOPNOTSUPP
        probes.clear()
        atomic._anonymous_files_link(str(a))
        atomic._anonymous_files_link(shm)  # another filesystem: probed, not answered from a's
        assert probes == [str(a), shm]
    monkeypatch.setattr(atomic.os, "open", real_open)
    monkeypatch.setattr(atomic, "_LINKABLE", {})
    monkeypatch.delattr(os, "O_TMPFILE")  # as on macOS
    assert not atomic._anonymous_files_link(str(a))
    f = atomic.AtomicFile(a / "out.bin")
    f.write(b"\x01\x02")
    f.commit()
    assert (a / "out.bin").read_bytes() == b"\x01\x02"


# kills: AtomicFile's error when the file cannot be created, without the destination, the
# step or the OS's reason (a read-only filesystem, made by a stand-in os.open: root can write
# any folder here)
def test_a_file_that_cannot_be_created_is_one_error_naming_the_destination(tmp_path, monkeypatch):
    import errno

    from ftw.writers import atomic

    def read_only(path, flags, mode=0o777):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(atomic.os, "open", read_only)
    dst = tmp_path / "out.bin"
    with pytest.raises(FtwError) as e:
        atomic.AtomicFile(dst)
    assert str(e.value) == f"{dst}: cannot create a file in its folder: {os.strerror(errno.EROFS)}"
    assert os.listdir(tmp_path) == []


def _link_anonymous_by_copy(real_link):
    """os.link as a kernel that links O_TMPFILE inodes would do it, for the /proc/self/fd/N
    sources the atomic writer passes: this machine's kernel refuses that link (EXDEV), so its
    O_TMPFILE path runs only with this stand-in. The inode is copied (bytes and mode) to a new
    name, which must not exist, on the inode's filesystem; a directory cannot be linked."""
    import errno
    import re
    import shutil
    import stat

    def link(src, dst, *args, **kw):
        m = re.fullmatch(r"/proc/self/fd/(\d+)", src) if isinstance(src, str) else None
        if m is None:
            return real_link(src, dst, *args, **kw)
        st = os.fstat(int(m.group(1)))
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))
        if os.stat(os.path.dirname(os.path.abspath(dst))).st_dev != st.st_dev:
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.fchmod(out, stat.S_IMODE(st.st_mode))
        with open(src, "rb") as r, open(out, "wb") as w:
            shutil.copyfileobj(r, w)

    return link


# kills: the O_TMPFILE path: its open (folder, flags, mode), the hidden name it is linked under
# at commit and that link's arguments, its initial `_named_tmp` / `_reaper`; the probe's link,
# folder, unlink and answer (True where the link works; a probe at the folder itself fails)
def test_the_anonymous_file_path_writes_the_same_file(tmp_path, monkeypatch):
    from ftw.writers import atomic

    if not atomic._anonymous_files_link(str(tmp_path)):
        monkeypatch.setattr(atomic.os, "link", _link_anonymous_by_copy(os.link))
        monkeypatch.setattr(atomic, "_LINKABLE", {})
    if os.path.isdir("/dev/shm") and os.stat("/dev/shm").st_dev != os.stat(tmp_path).st_dev:
        monkeypatch.chdir("/dev/shm")  # the probe is made in the folder, not the working folder
    assert atomic._anonymous_files_link(str(tmp_path)) is True
    assert os.listdir(tmp_path) == []  # the probe left nothing
    data = np.random.default_rng().integers(0, 256, 70000, dtype=np.uint8)
    for force in (False, True):
        dst = tmp_path / "out.bin"
        umask = os.umask(0o022)
        try:
            f = atomic.AtomicFile(dst, force=force)
        finally:
            os.umask(umask)
        assert f._named_tmp is None and f._reaper is None and os.listdir(tmp_path) == ([dst.name] if force else [])
        f.write(data)
        f.commit()
        assert dst.read_bytes() == data.tobytes() and dst.stat().st_mode & 0o777 == 0o644
        assert os.listdir(tmp_path) == [dst.name]
        data = data[::-1].copy()
    f = atomic.AtomicFile(tmp_path / "aborted.bin")
    f.write(data)
    f.abort()
    assert os.listdir(tmp_path) == [dst.name]


# --- ftw/check.py -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def check_sources(tmp_path_factory):
    """Four sources of 10 experts and what converting three of them gives. qwen3 and qwen3_fp8
    share their seed: layer 0 is bf16 in one and fp8_block in the other, and every byte after
    it differs. gpt_oss has expert biases, mixtral the same layout without them."""
    from st_build import build

    from ftw.writers.convert import convert

    d = tmp_path_factory.mktemp("check_sources")
    seed = int(np.random.default_rng().integers(1 << 30))
    out = {}
    for name, family, fmts in (("qwen3", "qwen3_moe", ["bf16", "bf16"]), ("qwen3_fp8", "qwen3_moe", ["fp8_block", "bf16"]),
                               ("gpt_oss", "gpt_oss", ["bf16", "bf16"]), ("mixtral", "mixtral", ["bf16", "bf16"])):
        src, _ = build(d / name, family, fmts, E=10, seed=seed if name.startswith("qwen3") else None)
        ftw_path = d / f"{name}.ftw"
        if name != "qwen3_fp8":
            convert(src, ftw_path)
        out[name] = (src, ftw_path)
    return out


# kills: a format mismatch's message lost, `continue` -> `break` after it (the next layer not
# compared); the message for differing experts (the first 8 named, then "...")
def test_check_names_a_format_mismatch_and_compares_the_next_layer(check_sources):
    from checking import check

    src_fp8, _ = check_sources["qwen3_fp8"]
    _, qwen3_ftw = check_sources["qwen3"]
    with ftw.open(qwen3_ftw) as f:
        file_fmt = f.layer_formats[0]
    report = check(src_fp8, qwen3_ftw)
    assert report.layers[0].problems == [f"format: source fp8_block{{block_size=[128, 128]}}, file {file_fmt}"]
    assert report.layers[1].problems[:2] == [
        "bank down: bytes of 10 of 10 experts differ from the source (experts 0-7, ...)",
        "bank gate_up: bytes of 10 of 10 experts differ from the source (experts 0-7, ...)"]


# kills: the messages for a bank only in the source or only in the file (and the comparison
# of `have | want` failing on the missing one)
def test_check_names_banks_missing_from_the_file_or_not_in_the_source(check_sources):
    from checking import check

    gpt_src, gpt_ftw = check_sources["gpt_oss"]
    mix_src, mix_ftw = check_sources["mixtral"]
    missing = check(gpt_src, mix_ftw).layers[0].problems
    assert "bank down_bias: in the source, missing from the file" in missing
    assert "bank gate_up_bias: in the source, missing from the file" in missing
    extra = check(mix_src, gpt_ftw).layers[1].problems
    assert extra[:2] == ["bank down_bias: in the file, not in the source", "bank gate_up_bias: in the file, not in the source"]


# kills: the counts of banks and bytes compared (= 1, -= 1, += 2, = nbytes, -= nbytes); verify's
# progress not passed on (every byte it hashes is reported through check's progress), a layer's
# progress without its byte count
def test_check_counts_banks_and_bytes_and_reports_verify_progress(check_sources):
    from checking import check

    src, path = check_sources["gpt_oss"]
    seen = []
    def progress(n, layers=0):  # the documented signature: nbytes always passed
        seen.append((n, layers))

    report = check(src, path, progress=progress)
    assert report.ok, report.all_problems()
    hashed = []
    with ftw.open(path) as f:
        f.verify(progress=hashed.append)
        for layer, r in report.layers.items():
            assert r.banks == len(f.layers[layer]) == 4
            assert r.bytes_compared == sum(f.bank(layer, name).nbytes for name in f.layers[layer])
    assert sum(n for n, _ in seen) == sum(hashed) > 0
    assert sum(layers for _, layers in seen) == len(report.layers)


# kills: a bank whose dtype alone differs passing (`or` -> `and`), its message, `continue` ->
# `break` after it (the layer's next bank not compared); one differing expert named without
# "..."; step_decode's `continue` -> `break` at a failed layer (the next layers not decoded)
def test_check_names_a_bank_dtype_change_and_compares_the_next_bank(tmp_path):
    from checking import check
    from helpers_container import index_of, patch_blob, with_index

    from ftw.writers.convert import convert

    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "samples", "st", "gpt_oss_mxfp4")
    dst = tmp_path / "m.ftw"
    convert(src, dst)
    data = dst.read_bytes()
    ix = index_of(data)
    key = sorted(ix["layers"])[0]
    gu = ix["layers"][key]["banks"]["gate_up"]
    data = patch_blob(data, gu, 5, bytes([data[gu["offset"] + 5] ^ 0x10]), reseal=True)
    ix = index_of(data)
    down = ix["layers"][key]["banks"]["down"]
    assert down["dtype"] == "u8"
    down["dtype"] = "i8"  # what older writers stored: a file that opens
    dst.write_bytes(with_index(data, ix))
    problems = check(src, dst).layers[int(key)].problems
    shape = list(down["shape"])
    assert problems[0] == f"bank down: source u8 {shape}, file i8 {shape}"
    E = gu["shape"][0]
    assert f"bank gate_up: bytes of 1 of {E} experts differ from the source (experts 0)" in problems, problems
    others = [r for layer, r in check(src, dst).layers.items() if layer != int(key)]
    assert others and all(r.ok and r.experts_decoded == 3 for r in others)  # decoded after a failed layer


# kills: the model messages (the file's model missing, a field differing) losing their values
# or prefix, and _short's cut at 80 characters
def test_check_model_messages_show_both_values_cut_to_80_characters(check_sources, tmp_path):
    from checking import check
    from helpers_container import index_of, with_index

    from ftw.check import _short
    from ftw.readers import open_checkpoint

    assert _short("y" * 78) == repr("y" * 78)  # 80 characters: whole
    assert _short("y" * 79) == repr("y" * 79)[:77] + "..." and len(_short("y" * 79)) == 80
    assert _short(list(range(40)), 20) == repr(list(range(40)))[:17] + "..."
    src, path = check_sources["qwen3"]
    with open_checkpoint(src) as r:
        model = r.model.to_json()
    data = path.read_bytes()
    for change, want in (
        (dict(model=None), "model: the file records none; the source's is " + _short(model)),
        (dict(top_k=model["top_k"] + 1), f"model.top_k: source {model['top_k']}, file {model['top_k'] + 1}"),
        (dict(extra={"x": "y" * 100}), f"model.extra: source {_short(model['extra'])}, file {_short({'x': 'y' * 100})}"),
    ):
        ix = index_of(data)
        if "model" in change:
            ix["model"] = None
        else:
            ix["model"].update(change)
        edited = tmp_path / "edited.ftw"
        edited.write_bytes(with_index(data, ix))
        assert check(src, edited).problems == [want]


# kills: the message for a layer in the file but not in its recorded selection, and the layer
# it is filed under
def test_check_files_a_layer_outside_the_selection_under_that_layer(check_sources, tmp_path):
    from checking import check

    src, path = check_sources["qwen3"]
    report = check(src, _edited_copy(tmp_path, path, _select_layer_1))
    layer_problems = [p for p in report.all_problems() if p.startswith("layer ")]
    assert layer_problems == [f"layer 0: in the file, not in the source's selection ({report.selection})"]


# kills: LayerResult made for a layer the report lacks: its number, its format's key or "-"
def test_check_context_makes_a_layer_result_with_the_files_format(check_sources):
    from ftw.check import CheckContext, CheckReport

    _, path = check_sources["qwen3"]
    with ftw.open(path) as f:
        ctx = CheckContext(f, None, None, CheckReport("src", f.path), 3, 1, lambda n=0, layers=0: None)
        r = ctx.layer_result(1)
        assert (r.layer, r.format, r.problems) == (1, f.layer_formats[1].key(), [])
        assert ctx.layer_result(1) is r and ctx.report.layers == {1: r}
        assert (ctx.layer_result(7).layer, ctx.layer_result(7).format) == (7, "-")


# kills: sample_experts' spacing (i * (E - 1) / (count - 1), rounded), its max(count - 1, 1)
@pytest.mark.parametrize("num, count, want", [
    (10, 3, [0, 4, 9]), (32, 4, [0, 10, 21, 31]), (8, 2, [0, 7]), (5, 1, [0]), (4, 4, [0, 1, 2, 3]), (3, 9, [0, 1, 2]),
])
def test_sample_experts_takes_the_ends_and_evenly_spaced_between(num, count, want):
    from ftw.check import sample_experts

    assert sample_experts(num, count) == want


# kills: compare_weights: its messages (keys, shapes, error), the result after a shape or value
# problem, `continue` -> `break` (the next projection not compared after a shape problem or an
# empty one), the relative error (err * scale), an all-zero reference (inf, never 0), the bound
# itself accepted (rel > 2^-23, not >=)
def test_compare_weights_names_every_projection_and_bounds_the_relative_error():
    from ftw.check import DECODE_RTOL, LayerResult, compare_weights

    rng = np.random.default_rng()
    w = rng.standard_normal((4, 6)) * 10
    r = LayerResult(0, "bf16")
    assert not compare_weights(r, 3, {"gate": w}, {"gate": w, "up": w}, "here")
    assert r.problems == ["expert 3: decodes to ['gate'] in the file, ['gate', 'up'] here"]

    r = LayerResult(0, "bf16")
    ref = w.copy()
    ref[1, 2] += 0.5
    res = compare_weights(r, 1, {"e": np.empty((0, 3)), "gate": w[:2], "up": w, "down": w},
                          {"e": np.empty((0, 3)), "gate": w, "up": ref, "down": w}, "there")
    assert res is False
    scale = np.abs(ref).max()
    assert r.problems == ["expert 1 gate: shape [2, 6] in the file, [4, 6] there",
                          f"expert 1 up: max |error| {0.5:.3g} against max |w| {scale:.3g} there"]
    assert r.max_abs_err == pytest.approx(0.5, rel=1e-12) and r.max_rel_err == pytest.approx(0.5 / scale, rel=1e-12)

    r = LayerResult(0, "bf16")
    assert compare_weights(r, 0, {"up": w}, {"up": w}, "x") is True and r.problems == []
    assert not compare_weights(r, 0, {"up": np.ones(3)}, {"up": np.zeros(3)}, "x")
    assert r.max_rel_err == float("inf")

    one = np.zeros(5)
    one[0] = 1.0
    at_bound = one.copy()
    at_bound[3] = DECODE_RTOL  # |error| / max |w| is exactly the bound: accepted
    r = LayerResult(0, "bf16")
    assert compare_weights(r, 0, {"down": at_bound}, {"down": one}, "x") is True
    assert r.max_rel_err == DECODE_RTOL


# kills: CheckReport.to_json's keys and values (`ftw check --json`, run by the CLI tests in a
# subprocess only, so "no tests" in mutmut)
def test_check_report_to_json_carries_every_field(check_sources, tmp_path):
    import json

    from checking import check

    src, path = check_sources["qwen3"]
    edited = _edited_copy(tmp_path, path, _select_layer_1)
    report = check(src, edited, strict=True)
    j = json.loads(json.dumps(report.to_json()))
    assert j == {
        "source": str(src), "file": str(edited), "ok": False, "selection": report.selection, "runtime": "none",
        "strict": True, "layers": [{**vars(r), "ok": r.ok, "result": r.result} for r in report.layers.values()],
        "tensors_compared": report.tensors_compared, "tensor_bytes_compared": report.tensor_bytes_compared,
        "attachments_compared": report.attachments_compared, "problems": report.problems, "notes": report.notes,
    }
    assert [(x["layer"], x["ok"], x["result"]) for x in j["layers"]] == [(0, False, "FAIL"), (1, True, "ok")]
    assert j["problems"] and j["tensors_compared"] > 0 and j["tensor_bytes_compared"] > 0 and j["attachments_compared"] > 0
    assert j["layers"][1]["banks"] == 2 and j["layers"][1]["experts_decoded"] == 3


# kills: the "..." after the first 8 differing experts at exactly 8 and 9 (> 8, not >= 8 or > 9)
def test_check_lists_up_to_8_differing_experts_then_an_ellipsis(check_sources, tmp_path):
    from checking import check
    from helpers_container import index_of, patch_blob

    src, path = check_sources["qwen3"]
    data = path.read_bytes()
    for name, count in (("down", 8), ("gate_up", 9)):
        desc = index_of(data)["layers"]["1"]["banks"][name]
        row = desc["nbytes"] // desc["shape"][0]
        for e in range(count):
            pos = e * row + row // 3
            data = patch_blob(data, desc, pos, bytes([data[desc["offset"] + pos] ^ 0x04]), reseal=True)
            desc = index_of(data)["layers"]["1"]["banks"][name]
    edited = tmp_path / "edited.ftw"
    edited.write_bytes(data)
    assert check(src, edited).layers[1].problems == [
        "bank down: bytes of 8 of 10 experts differ from the source (experts 0-7)",
        "bank gate_up: bytes of 9 of 10 experts differ from the source (experts 0-7, ...)"]


# kills: compare_weights' result after a shape problem alone (None / True)
def test_compare_weights_fails_on_a_shape_problem_alone():
    from ftw.check import LayerResult, compare_weights

    w = np.random.default_rng().standard_normal((4, 6))
    r = LayerResult(0, "bf16")
    assert compare_weights(r, 2, {"down": w[:3]}, {"down": w}, "x") is False
    assert r.problems == ["expert 2 down: shape [3, 6] in the file, [4, 6] x"]


def _select_layer_1(ix):  # the file claims it was converted with --layers 1 (it holds 0 and 1)
    ix["selection"] = {"layers": [1], "experts_only": False}


def _edited_copy(tmp_path, path, edit):
    from helpers_container import index_of, with_index

    data = path.read_bytes()
    ix = index_of(data)
    edit(ix)
    out = tmp_path / "edited.ftw"
    out.write_bytes(with_index(data, ix))
    return out


# kills: step_decode without an independent reference (a reader that gives none): the note, the
# reader's banks decoded (`or True`, decode_expert(None)), where a difference was found, the
# expert named; with a reference, "decoded from the source's own tensors"
@pytest.mark.parametrize("independent", [True, False])
def test_check_decode_says_what_it_compared_with(check_sources, tmp_path, monkeypatch, independent):
    from checking import check

    import ftw.container

    src, path = check_sources["qwen3"]
    if not independent:
        from ftw.readers.families import per_expert

        monkeypatch.setattr(per_expert.reference, "per_expert", lambda *a, **k: None)
    real = ftw.container.FtwFile.decode_expert

    def decode_expert(self, layer, e):  # the file's decoder off by 1e-3 in expert 9's gate
        w = real(self, layer, e)
        if layer == 1 and e == 9:
            w["gate"] = w["gate"] + 1e-3 * np.abs(w["gate"]).max()
        return w

    monkeypatch.setattr(ftw.container.FtwFile, "decode_expert", decode_expert)
    report = check(src, path)
    where = "decoded from the source's own tensors" if independent else "decoded from the reader's banks"
    notes = [] if independent else ["no independent reference for this layout: compared with the reader's banks"]
    assert report.layers[0].notes == notes and report.layers[0].ok and report.layers[0].experts_decoded == 3
    assert report.layers[1].notes == notes and report.layers[1].experts_decoded == 2
    [problem] = report.layers[1].problems
    assert problem.startswith("expert 9 gate: max |error| ") and problem.endswith(where)


# kills: a decode that cannot run (UnsupportedError: a note) or fails (FtwError: a problem):
# their messages, `break` -> `return` (the next layers not decoded)
@pytest.mark.parametrize("error", ["UnsupportedError", "FormatError"])
def test_check_notes_an_undecodable_layer_and_decodes_the_next(check_sources, monkeypatch, error):
    import ftw.errors
    from checking import check

    import ftw.container

    src, path = check_sources["qwen3"]
    real = ftw.container.FtwFile.decode_expert
    exc = getattr(ftw.errors, error)

    def decode_expert(self, layer, e):
        if layer == 0:
            raise exc("layer 0 cannot be decoded here")
        return real(self, layer, e)

    monkeypatch.setattr(ftw.container.FtwFile, "decode_expert", decode_expert)
    report = check(src, path)
    got = report.layers[0].notes if error == "UnsupportedError" else report.layers[0].problems
    assert got == ["not decoded: layer 0 cannot be decoded here"]
    assert report.layers[1].ok and report.layers[1].experts_decoded == 3


# kills: step_tensors: `continue` -> `break` after a dtype/shape mismatch (the next tensors not
# compared), the meta message's values, the bytes-differ message, the byte and attachment counts;
# check's default strict=False
def test_check_tensors_and_attachments_are_all_compared_and_counted(check_sources, tmp_path):
    from checking import check
    from helpers_container import index_of, patch_blob

    src, path = check_sources["qwen3"]
    honest = check(src, path)
    assert honest.strict is False and honest.runtime == "none"  # the defaults
    with ftw.open(path) as f:
        assert honest.tensor_bytes_compared == sum(f.tensor(n).nbytes for n in f.tensors)
        assert honest.tensors_compared == len(f.tensors) and honest.attachments_compared == len(f.attachments) == 3
    data = path.read_bytes()
    names = sorted(index_of(data)["tensors"])
    last = index_of(data)["tensors"][names[-1]]
    data = patch_blob(data, last, 1, bytes([data[last["offset"] + 1] ^ 0x40]), reseal=True)
    edited = tmp_path / "t.ftw"
    edited.write_bytes(data)

    def edit(ix):
        ix["tensors"][names[0]]["dtype"] = "f16"
        ix["tensors"][names[1]]["meta"] = {"m": 1}

    report = check(src, _edited_copy(tmp_path, edited, edit))
    first = index_of(data)["tensors"][names[0]]
    assert report.problems == [
        f"tensor {names[0]}: source bf16 {first['shape']}, file f16 {first['shape']}",
        f"tensor {names[1]}: meta {{'m': 1}} in the file, None in the source",
        f"tensor {names[-1]}: bytes differ from the source"]


# kills: the layers pre-filled with the source's format for a layer missing from the file (`&`,
# None, the format key), the selection error's message, check on an open FtwFile (nullcontext),
# its pread_only restored afterwards
def test_check_fills_layers_from_both_sides_and_takes_an_open_file(check_sources, tmp_path):
    from checking import check

    src, path = check_sources["qwen3"]

    def drop_layer_1(ix):
        del ix["layers"]["1"], ix["layer_quant_formats"]["1"]

    report = check(src, _edited_copy(tmp_path, path, drop_layer_1))
    assert [(r.layer, r.format) for r in report.layers.values()] == [(0, "bf16"), (1, "bf16")]
    assert report.layers[1].problems == ["in the source (and the file's selection), missing from the file"]
    from ftw.writers.convert import convert

    fp8_src, fp8_path = check_sources["qwen3_fp8"]  # layer 0 fp8_block, layer 1 bf16
    convert(fp8_src, fp8_path, force=True)

    def drop_layer_0(ix):
        del ix["layers"]["0"], ix["layer_quant_formats"]["0"]

    report = check(fp8_src, _edited_copy(tmp_path, fp8_path, drop_layer_0))
    assert [(r.layer, r.format) for r in report.layers.values()] == [(0, "fp8_block{block_size=[128, 128]}"), (1, "bf16")]

    def claim_layer_5(ix):
        ix["selection"] = {"layers": [5], "experts_only": False}

    report = check(src, _edited_copy(tmp_path, path, claim_layer_5))
    assert len(report.problems) == 1 and report.problems[0].startswith("selection: ") and "5" in report.problems[0]
    with ftw.open(path) as f:
        f.pread_only = True
        report = check(src, f)
        assert report.ok and report.file == f.path and f.pread_only is True


# kills: selection_text's "none" (no layers in the file, none in the model), "--experts-only",
# the separator and the suffix only when the conversion selected something
def test_check_selection_text_names_what_was_converted(check_sources, tmp_path):
    from ftw.check import selection_text

    _, path = check_sources["qwen3"]
    with ftw.open(path) as f:
        assert selection_text(f, [0, 1]) == "layers 0-1 of 0-1"
        assert selection_text(f, []) == "layers 0-1 of none"

    def select(ix):
        ix["selection"] = {"layers": [1], "experts_only": True}
        del ix["layers"]["0"], ix["layer_quant_formats"]["0"]
        ix["layers"].pop("1"), ix["layer_quant_formats"].pop("1")

    with ftw.open(_edited_copy(tmp_path, path, select)) as f:
        assert selection_text(f, [0, 1]) == "layers none of 0-1 (converted with --layers 1 --experts-only)"


# kills: resolve_runtime's message and "auto" (cuda where a GPU is, else cpu)
def test_resolve_runtime_names_the_choices_and_picks_auto():
    from ftw.check import resolve_runtime
    from ftw.runtime import cuda_device_count

    assert [resolve_runtime(r) for r in ("none", "cpu", "cuda")] == ["none", "cpu", "cuda"]
    assert resolve_runtime("auto") == ("cuda" if cuda_device_count() > 0 else "cpu")
    with pytest.raises(FtwError, match=r"^--runtime 'gpu': expected one of none, cpu, cuda, auto$"):
        resolve_runtime("gpu")


# kills: the meta message's values (a GGUF tensor's meta: its ggml type and shape)
def test_check_names_both_metas_of_a_gguf_tensor(tmp_path):
    from checking import check
    from helpers_container import index_of

    from ftw.check import _short
    from ftw.writers.convert import convert

    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "samples", "gguf", "qwen3moe-Q4_K_M.gguf")
    path = tmp_path / "g.ftw"
    convert(src, path, layers=[1])
    name = next(n for n, t in sorted(index_of(path.read_bytes())["tensors"].items()) if t.get("meta"))
    meta = index_of(path.read_bytes())["tensors"][name]["meta"]
    changed = {**meta, "ggml_shape": meta["ggml_shape"][::-1] + [7]}

    def edit(ix):
        ix["tensors"][name]["meta"] = changed

    import ast

    [problem] = check(src, _edited_copy(tmp_path, path, edit)).problems
    assert problem.startswith(f"tensor {name}: meta {_short(changed)} in the file, ") and problem.endswith(" in the source")
    assert ast.literal_eval(problem.split(" in the file, ")[1][: -len(" in the source")]) == meta


# --- writers/ftw_writer.py --------------------------------------------------------------------


# kills: split_planes' generic path (items of 4 or 8 bytes; the writer itself splits only
# 2-byte items, bench/bench_container.py any) and the 2-byte test inverted
@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_split_planes_puts_byte_k_of_every_item_together(itemsize):
    from ftw.writers.ftw_writer import split_planes

    row = np.random.default_rng().integers(0, 256, 48 * itemsize, dtype=np.uint8)
    got = split_planes(memoryview(row.tobytes()), itemsize)
    want = np.concatenate([row[k::itemsize] for k in range(itemsize)])
    assert got.dtype == np.uint8 and got.shape == want.shape and np.array_equal(got, want)


# kills: FtwWriter.abort not closing its output stage (getattr mutated, the test inverted): the
# stage's writer threads outlive the aborted file
def test_an_aborted_writer_stops_its_output_threads(tmp_path):
    import threading

    from ftw.banks import BankSource, LayerBanks
    from ftw.writers import FtwWriter

    def stage_threads():
        return {t for t in threading.enumerate() if t.name.startswith("ftw-write")}

    before = stage_threads()
    n = 3 << 20  # 9 MiB in all: more than one 8 MiB stage, so a write is in flight
    data = np.random.default_rng().integers(0, 256, (3, n), dtype=np.uint8)
    with pytest.raises(ValueError, match="stop here"):
        with FtwWriter(tmp_path / "m.ftw") as w:
            w.add_layer(LayerBanks(0, LayerFormat.of("bf16"), {"gate_up": BankSource("u8", (n,), 3, lambda e: [data[e]])}))
            assert stage_threads() - before
            raise ValueError("stop here")
    assert not (stage_threads() - before) and os.listdir(tmp_path) == []


# kills: abort() reading `_sink` without a default: when the output stage cannot be made, the
# writer's own error must come out (not an AttributeError from the cleanup), and no file stay
def test_a_writer_whose_output_stage_fails_raises_that_error(tmp_path, monkeypatch):
    import errno

    from ftw.writers import FtwWriter, ftw_writer

    def no_stage(file):
        raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))

    monkeypatch.setattr(ftw_writer, "Sink", no_stage)
    with pytest.raises(OSError, match=os.strerror(errno.ENOMEM)):
        FtwWriter(tmp_path / "m.ftw")
    assert os.listdir(tmp_path) == []


# kills: the message for an attachment the file has and the source does not
def test_check_names_an_attachment_only_in_the_file(check_sources, tmp_path):
    from checking import check

    src, path = check_sources["qwen3"]

    def add(ix):
        ix["attachments"]["notes.txt"] = ix["attachments"].pop("config.json")

    assert check(src, _edited_copy(tmp_path, path, add)).problems == [
        "attachment config.json: in the source, missing from the file", "attachment notes.txt: in the file, not in the source"]


# kills: the writer's messages: a tensor or attachment added twice (_unique: its kind, its
# message, the name not recorded), a tensor whose data has the wrong size (the message and its
# shape); a tensor's bytes reported to progress
def test_writer_names_a_duplicate_or_wrongly_sized_tensor(tmp_path):
    from ftw.banks import SourceTensor
    from ftw.errors import SourceError
    from ftw.writers import FtwWriter

    a = np.random.default_rng().standard_normal(6).astype(np.float32)
    with pytest.raises(FtwError, match=r"m\.ftw: tensor 'norm' added twice$"):
        with FtwWriter(tmp_path / "m.ftw") as w:
            w.add_tensor(SourceTensor("norm", "f32", (6,), lambda: a))
            w.add_attachment("norm", b"an attachment may share the name")
            w.add_tensor(SourceTensor("norm", "f32", (6,), lambda: a))
    with pytest.raises(FtwError, match=r"m\.ftw: attachment 'a\.json' added twice$"):
        with FtwWriter(tmp_path / "m.ftw") as w:
            w.add_attachment("a.json", b"{}")
            w.add_attachment("a.json", b"{}")
    seen = []
    with FtwWriter(tmp_path / "ok.ftw", progress=seen.append) as w:
        w.add_tensor(SourceTensor("norm", "f32", (6,), lambda: a))
    assert seen == [a.nbytes]
    os.unlink(tmp_path / "ok.ftw")
    with pytest.raises(SourceError, match=r"^tensor short: 20 bytes, expected 24 for f32 \[2, 3\]$"):
        with FtwWriter(tmp_path / "m.ftw") as w:
            w.add_tensor(SourceTensor("short", "f32", (2, 3), lambda: a[:5]))
    assert os.listdir(tmp_path) == []


# kills: _compress_bank: the sample of the first rows deciding (not the whole bank), the level
# ignored, the progress of compressed rows (and of raw ones), the bank named in a bad row's error
def test_compression_is_decided_on_the_first_rows_at_the_asked_level(tmp_path):
    import zstandard

    from ftw.banks import BankSource, LayerBanks
    from ftw.errors import SourceError
    from ftw.writers import FtwWriter
    from ftw.writers.ftw_writer import SAMPLE_ROWS

    rng = np.random.default_rng()
    E, n = 160, 2048  # 4 compressible rows of 160 save under 2% of the bank
    rows = rng.integers(0, 256, (E, n), dtype=np.uint8)
    rows[:SAMPLE_ROWS] = rng.integers(0, 4, (SAMPLE_ROWS, n), dtype=np.uint8)  # 2 bits of 8: compressible
    seen = []
    path = tmp_path / "m.ftw"
    with FtwWriter(path, compress_level=1, progress=seen.append) as w:
        w.add_layer(LayerBanks(0, LayerFormat.of("bf16"), {"gate_up": BankSource("u8", (n,), E, lambda e: [rows[e]])}))
    assert sum(seen) == rows.nbytes and all(isinstance(s, int) for s in seen)
    with ftw.open(path) as f:
        assert np.array_equal(f.bank(0, "gate_up"), rows)
        desc = f.layers[0]["gate_up"]
        assert desc.codec == "zstd"  # decided on the compressible first rows; the whole bank saves < 3%
    from helpers_container import index_of

    data = path.read_bytes()
    d = index_of(data)["layers"]["0"]["banks"]["gate_up"]
    table = np.frombuffer(data, "<u8", E + 1, d["row_table"]["offset"])
    first = data[d["offset"] + int(table[0]) : d["offset"] + int(table[1])]
    assert first == zstandard.ZstdCompressor(level=1, write_content_size=True).compress(rows[0].tobytes())
    seen.clear()
    with FtwWriter(tmp_path / "raw.ftw", progress=seen.append) as w:  # no compression: raw rows
        w.add_layer(LayerBanks(0, LayerFormat.of("bf16"), {"gate_up": BankSource("u8", (n,), E, lambda e: [rows[e]])}))
    assert seen == [n] * E
    with pytest.raises(SourceError, match=r"^layer 0 bank down expert 1: row of"):
        with FtwWriter(tmp_path / "bad.ftw", compress_level=3) as w:
            w.add_layer(LayerBanks(0, LayerFormat.of("bf16"), {"down": BankSource("u8", (n,), 2, lambda e: [rows[e, : n - e]])}))


# kills: the seed not passed to the runtime step (its random tokens then differ between runs)
def test_check_runtime_step_is_reproducible_with_a_seed(check_sources):
    from checking import check

    src, path = check_sources["qwen3"]
    runs = [check(src, path, runtime="cpu", seed=11) for _ in range(2)]
    assert all(r.ok for r in runs)
    got = [[layer.runtime for layer in r.layers.values()] for r in runs]
    assert got[0] == got[1] and got[0][0]["tokens"] > 0


# kills: _finish's strict JSON (allow_nan dropped or True: a NaN would make an index no strict
# JSON parser reads) and its message; the footer's flags written as zero; the index cap (an index of exactly 64 MiB is written,
# one byte more is refused, naming the size)
def test_the_index_is_strict_json_within_the_cap(tmp_path):
    from helpers_container import footer

    from ftw.writers import FtwWriter

    with pytest.raises(FtwError, match=r"m\.ftw: the index would hold a NaN or infinite number \(strict JSON has none\)$"):
        with FtwWriter(tmp_path / "m.ftw") as w:
            w.set_provenance({"scale": float(np.random.default_rng().random()) * float("nan")})
    with FtwWriter(tmp_path / "base.ftw") as w:
        w.set_provenance({"pad": ""})
    assert footer((tmp_path / "base.ftw").read_bytes())["flags"] == 0  # docs/FORMAT.md: written as zero
    base = footer((tmp_path / "base.ftw").read_bytes())["index_nbytes"]
    pad = spec.MAX_INDEX_NBYTES - base
    with FtwWriter(tmp_path / "cap.ftw") as w:
        w.set_provenance({"pad": "p" * pad})
    assert footer((tmp_path / "cap.ftw").read_bytes())["index_nbytes"] == spec.MAX_INDEX_NBYTES
    with ftw.open(tmp_path / "cap.ftw") as f:
        assert len(f.provenance["pad"]) == pad
    os.unlink(tmp_path / "cap.ftw")
    with pytest.raises(FtwError, match=rf"over\.ftw: index of {spec.MAX_INDEX_NBYTES + 1} bytes exceeds the format's cap$"):
        with FtwWriter(tmp_path / "over.ftw") as w:
            w.set_provenance({"pad": "p" * (pad + 1)})
    assert sorted(os.listdir(tmp_path)) == ["base.ftw"]


# kills: check 83 (the file not switched to pread for the check: a file cut short mid-check
# would fault on its memory map instead of raising); also that check gives the caller's open
# file back in the mode it came in
def test_check_reads_the_file_with_pread_and_restores_the_callers_mode(check_sources):
    from checking import check

    src, path = check_sources["qwen3"]
    with ftw.open(path) as f:
        modes = []
        report = check(src, f, progress=lambda n=0, layers=0: modes.append(f.pread_only))
        assert report.ok, report.all_problems()
        assert modes and all(modes)  # every step ran with pread
        assert f.pread_only is False
        f.pread_only = True
        check(src, f)
        assert f.pread_only is True


def _mapped_file(path, data: bytes):
    """A FileMap of a new file holding `data`, as the readers map their sources."""
    from ftw.mapped import FileMap

    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        return FileMap(fd, str(path))
    finally:
        os.close(fd)


# kills: _write_chunk 20 (a run of source bytes extended by a chunk of ANOTHER file that starts
# where the run ends in its own file) and 23 (a run extended by a chunk of the same file at
# offset 2 x the run's length, not adjacent): both copy the wrong bytes. The layouts line up
# on purpose: rows of two shards at the same offsets, gate then up at a gap of one tensor
def test_source_runs_join_only_adjacent_bytes_of_one_file(tmp_path):
    from ftw.banks import BankSource, LayerBanks
    from ftw.writers import FtwWriter

    H, I = 40, 30  # noqa: E741
    L, M = 2 * I * H, H * I  # bytes of one piece: half a gate_up row (bf16), half a down row
    rng = np.random.default_rng()
    a_bytes = rng.integers(0, 256, 3 * L, dtype=np.uint8)
    b_bytes = rng.integers(0, 256, 3 * L, dtype=np.uint8)
    a = np.frombuffer(_mapped_file(tmp_path / "a.bin", a_bytes.tobytes()), dtype=np.uint8)
    b = np.frombuffer(_mapped_file(tmp_path / "b.bin", b_bytes.tobytes()), dtype=np.uint8)
    rows = {
        # a's run [0, L), then b's [L, 2L): b's chunk starts where a's run ends
        "gate_up": BankSource("bf16", (2 * I, H), 1, lambda e: [a[:L], b[L : 2 * L]]),
        # a's run [0, M), then a's [2M, 3M): 2M is the run's length doubled, not its end
        "down": BankSource("bf16", (H, I), 1, lambda e: [a[:M], a[2 * M : 3 * M]]),
    }
    path = tmp_path / "m.ftw"
    with FtwWriter(path) as w:
        w.add_layer(LayerBanks(0, LayerFormat.of("bf16"), rows))
    with ftw.open(path) as f:
        got = {k: f.bank(0, k).reshape(-1).view(np.uint8) for k in rows}
        assert np.array_equal(got["gate_up"], np.concatenate([a_bytes[:L], b_bytes[L : 2 * L]]))
        assert np.array_equal(got["down"], np.concatenate([a_bytes[:M], a_bytes[2 * M : 3 * M]]))
        f.verify()


CUT_AFTER_A_ROWS_READ = """
import os, sys
import numpy as np
from ftw import mapped
from ftw.banks import BankSource, LayerBanks
from ftw.errors import SourceError
from ftw.formats import LayerFormat
from ftw.writers import FtwWriter

src, dst, E, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
fd = os.open(src, os.O_RDONLY)
rows = np.frombuffer(mapped.FileMap(fd, src), dtype=np.uint8).reshape(E, n)
os.close(fd)
real_read_span = mapped.read_span

def read_span_then_cut(view):  # the source is cut short just after the first row's pread
    out = real_read_span(view)
    os.truncate(src, 0)
    return out

mapped.read_span = read_span_then_cut
try:
    with FtwWriter(dst, compress_level=3, threads=1) as w:
        w.add_layer(LayerBanks(0, LayerFormat.of("bf16"), {"gate_up": BankSource("u8", (n,), E, lambda e: [rows[e]])}))
except SourceError as e:
    print("SourceError", e)
    sys.exit(3)
print("written")
"""


# kills: _compress_bank 11 (a row compressed from its memory map, not from the bytes pread
# just read): the source cut short between the two reads is then a SIGBUS in the compressor,
# not a SourceError naming the file at the next row's pread. The cut comes from a stand-in
# read_span (the real one, then truncate), which makes that race happen every time; it runs
# in a child, so a signal death is a return code. The same bank is first compressed from a
# map in this process, so that mutmut knows the test reaches _compress_bank
def test_compression_reads_source_rows_with_pread(tmp_path):
    import subprocess
    import sys
    import textwrap

    from ftw.banks import BankSource, LayerBanks
    from ftw.writers import FtwWriter

    E, n = 6, 4096
    data = np.random.default_rng().integers(0, 4, (E, n), dtype=np.uint8)  # 2 bits of 8: worth compressing
    rows = np.frombuffer(_mapped_file(tmp_path / "src.bin", data.tobytes()), dtype=np.uint8).reshape(E, n)
    with FtwWriter(tmp_path / "m.ftw", compress_level=3) as w:
        w.add_layer(LayerBanks(0, LayerFormat.of("bf16"), {"gate_up": BankSource("u8", (n,), E, lambda e: [rows[e]])}))
    with ftw.open(tmp_path / "m.ftw") as f:
        assert f.layers[0]["gate_up"].codec == "zstd"
        assert np.array_equal(f.bank(0, "gate_up"), data)
    out = tmp_path / "out"
    out.mkdir()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(CUT_AFTER_A_ROWS_READ), str(tmp_path / "src.bin"),
                        str(out / "x.ftw"), str(E), str(n)], capture_output=True, text=True, cwd=root, timeout=120)
    assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)  # -7 would be SIGBUS
    assert p.stdout.startswith(f"SourceError {tmp_path / 'src.bin'}: file shrank"), p.stdout
    assert os.listdir(out) == []


# -- ftw/container.py ------------------------------------------------------------------------


# kills: FtwFile.blob_bytes 1, 2 (a public method nothing in ftw calls: every blob's bytes, which
# hash to its checksum); read_row_into 10-13 (a raw row read with pread_only: its offset and
# the destination passed on)
def test_blob_bytes_and_raw_rows_read_with_pread_are_the_files_bytes(tmp_path):
    import xxhash
    from helpers_container import write_sample

    path = tmp_path / "m.ftw"
    exp = write_sample(path, np.random.default_rng())
    data = path.read_bytes()
    with ftw.open(path) as f:
        labels = []
        for label, blob in f.blobs():
            got = f.blob_bytes(blob)
            assert bytes(got) == data[blob.offset : blob.offset + blob.nbytes], label
            assert xxhash.xxh3_64_hexdigest(got) == blob.xxh3, label
            labels.append(label)
        assert "attachment tokenizer.model" in labels and "layer 3 bank down_global" in labels
        f.pread_only = True
        for (layer, name), arr in exp.banks.items():
            info = f.layers[layer][name]
            assert info.codec == "raw"
            for e in range(info.num_experts):
                out = np.full(info.row_nbytes, 0xA5, np.uint8)
                f.read_row_into(info, e, out)
                assert np.array_equal(out, arr[e].reshape(-1).view(np.uint8)), (layer, name, e)


# kills: _decode_rows 36, 37, 41, 42 (the frame pass of verify: a file cut short under it is a
# FormatError naming the file, the right error class, not a SourceError or a TypeError) and 48,
# 52 (the frame decoded is the one pread just read, not one fetched again through the map).
# The file is cut right after the frame pass's first pread (a stand-in read_exact: the real
# one, then truncate): that frame still decodes from the bytes read, the next read names its
# offset; read again through the map, the first frame meets the map's own size check instead
def test_verify_decodes_the_frames_it_read_and_names_a_cut_files_offset(tmp_path, monkeypatch):
    from ftw import container
    from ftw.errors import FormatError
    from helpers_container import index_of, write_sample

    path = tmp_path / "m.ftw"
    write_sample(path, np.random.default_rng(), level=3)
    data = path.read_bytes()
    with ftw.open(path) as f:
        compressed = [b for banks in f.layers.values() for b in banks.values() if b.row_table is not None]
        for b in compressed:
            f.bank(b.layer, b.name)  # reads and caches its row table: the cut hits frames only
        first = compressed[0]  # verify's first frame task
        d = index_of(data)["layers"][str(first.layer)]["banks"][first.name]["row_table"]
        table = np.frombuffer(data, "<u8", first.num_experts + 1, d["offset"])
        total = sum(b.nbytes for _, b in f.blobs())
        seen, frames = [0], []
        real_read_exact = container.read_exact

        def read_then_cut(fd, dst, offset, *args, **kwargs):
            real_read_exact(fd, dst, offset, *args, **kwargs)
            if seen[0] == total:  # the checksum pass is over: this is the first frame's read
                frames.append(offset)
                os.truncate(path, 0)

        monkeypatch.setattr(container, "read_exact", read_then_cut)
        second = first.blob.offset + int(table[1])
        with pytest.raises(FormatError, match=rf"^{path}: file shrank while being read \(no bytes at offset {second}\)$"):
            f.verify(threads=1, progress=lambda n: seen.__setitem__(0, seen[0] + n))
        assert frames == [first.blob.offset]


def _zstd_frame(fhd: int, header_rest: bytes, blocks: list[tuple[int, int, bytes]], checksum: bool = False) -> bytes:
    """A zstd frame put together by hand (RFC 8878): magic, frame header descriptor, the rest
    of the header, blocks (last flag, block type, stored bytes; the header's size is the
    stored length, or the run length given as the payload's length for RLE blocks)."""
    out = b"\x28\xb5\x2f\xfd" + bytes([fhd]) + header_rest
    for last, kind, payload in blocks:
        size = len(payload)
        stored = payload[:1] if kind == 1 else payload
        out += (last | kind << 1 | size << 3).to_bytes(3, "little") + stored
    return out + (b"\x11\x22\x33\x44" if checksum else b"")


# kills: _zstd_frame_nbytes 4-6, 10, 12, 15, 18-23, 36, 37, 39, 43-46, 51, 53, 56: the stored
# size of a frame from its block headers: a content checksum (4 bytes after the last block)
# counted only where the descriptor says so (not for a dictionary id flag), RLE blocks storing
# one byte, a reserved block type refused, a frame whose next block header is cut short, an
# empty last block ending the frame exactly, and the messages
def test_zstd_frame_sizes_come_from_the_block_headers():
    import zstandard

    from ftw.container import _zstd_frame_nbytes

    rng = np.random.default_rng()
    raw = rng.integers(0, 256, 37, dtype=np.uint8).tobytes()
    run = bytes([int(rng.integers(1, 256))]) * 1000
    single_segment, has_checksum, dict_id_1_byte = 0x20, 0x04, 0x01
    cases = {
        # header: [dictionary id (1 byte)], content size (1 byte, single segment)
        "dictionary id, no checksum": _zstd_frame(single_segment | dict_id_1_byte, b"\x07\x80", [(1, 0, raw)]),
        "checksum": _zstd_frame(single_segment | has_checksum, b"\x80", [(1, 0, raw)], checksum=True),
        "rle then raw": _zstd_frame(single_segment, b"\x80", [(0, 1, run), (1, 0, raw)]),
        "raw then rle": _zstd_frame(single_segment | has_checksum, b"\x80", [(0, 0, raw), (1, 1, run)], checksum=True),
        "empty input": zstandard.ZstdCompressor(write_content_size=True).compress(b""),
        "zstd's own, with checksum": zstandard.ZstdCompressor(write_checksum=True).compress(run * 300),
    }
    for what, frame in cases.items():  # with or without bytes after it
        assert _zstd_frame_nbytes(memoryview(frame)) == len(frame), what
        assert _zstd_frame_nbytes(memoryview(frame + b"\xff" * 9)) == len(frame), what
    assert len(cases["empty input"]) == 9  # its one empty last block ends the frame exactly
    with pytest.raises(ValueError, match=r"^reserved block type$"):
        _zstd_frame_nbytes(memoryview(_zstd_frame(single_segment, b"\x80", [(0, 0, raw), (1, 3, raw)])))
    # a block that is not the last, then one byte: the next header is cut short (that byte
    # alone would read as an empty last block)
    with pytest.raises(ValueError, match=r"^frame cut short$"):
        _zstd_frame_nbytes(memoryview(_zstd_frame(single_segment, b"\x80", [(0, 0, raw)]) + b"\x01"))
    with pytest.raises(ValueError, match=r"^not a zstd frame \(skippable frames and others are not rows\)$"):
        _zstd_frame_nbytes(memoryview(b"\x50\x2a\x4d\x18" + b"\x00" * 12))  # a skippable frame


# kills: _join_planes 8, 31-39 (byte planes of 1-, 4- and 8-byte items: docs/FORMAT.md defines
# zstd-bytesplit for any item size, though this writer uses it only for 2-byte items). The file
# is written with plain zstd rows that ARE the byte planes, then relabelled zstd-bytesplit
@pytest.mark.parametrize("dtype", ["u8", "f32", "f64"])
def test_bytesplit_rows_of_any_item_size_read_back(tmp_path, dtype):
    from helpers_container import index_of, with_index

    from ftw.banks import BankSource, LayerBanks
    from ftw.writers import FtwWriter
    from ftw.writers.ftw_writer import split_planes

    E, n = 5, 3000
    npd = spec.numpy_dtype(dtype)
    rows = np.random.default_rng().integers(1, 5, (E, n)).astype(npd)  # few values: compressible
    planes = np.stack([split_planes(memoryview(r.tobytes()), npd.itemsize).view(npd) for r in rows])
    path = tmp_path / "m.ftw"
    with FtwWriter(path, compress_level=3) as w:
        w.add_layer(LayerBanks(0, LayerFormat.of("bf16"), {"gate_up": BankSource(dtype, (n,), E, lambda e: [planes[e]])}))
    data = path.read_bytes()
    ix = index_of(data)
    assert ix["layers"]["0"]["banks"]["gate_up"]["codec"] == "zstd"
    ix["layers"]["0"]["banks"]["gate_up"]["codec"] = "zstd-bytesplit"
    path.write_bytes(with_index(data, ix))
    with ftw.open(path) as f:
        assert np.array_equal(f.bank(0, "gate_up"), rows)
        assert np.array_equal(f.expert_row(0, "gate_up", E - 1), rows[E - 1])


# kills: read_into 4 (a destination of more than one dimension read as its first dimension's
# rows), 8-11 (the bounds: a read at offset 0 is allowed, a negative offset or one past the end
# refused with a FormatError naming the range, not an OSError or a short read)
def test_read_into_takes_any_contiguous_destination_within_the_file(tmp_path):
    from ftw.errors import FormatError
    from helpers_container import write_sample

    path = tmp_path / "m.ftw"
    write_sample(path, np.random.default_rng())
    data = path.read_bytes()
    with ftw.open(path) as f:
        head = np.full(8, 0xA5, np.uint8)
        f.read_into(0, head)
        assert head.tobytes() == data[:8]
        tail = np.full((3, 2), -1.5, np.float32)  # 24 bytes in 2 dimensions
        f.read_into(f.size - 24, tail)
        assert tail.tobytes() == data[-24:]
        with pytest.raises(FormatError, match=rf"^{path}: read of \[-1, 7\) past the end of the file$"):
            f.read_into(-1, head)
        with pytest.raises(FormatError, match=rf"^{path}: read of \[{f.size - 4}, {f.size + 4}\) past the end of the file$"):
            f.read_into(f.size - 4, head)
        with pytest.raises(FormatError, match=rf"^{path}: read of \[{f.size - 8}, {f.size + 16}\) past the end of the file$"):
            f.read_into(f.size - 8, tail)  # its bytes, not its 3 rows, run past the end


# kills: _row_table 15, 16, 20, 21: a compressed bank's row table read from a file cut short
# since it was opened is a FormatError naming the file and the table's offset
def test_a_row_table_cut_off_is_a_format_error_naming_its_offset(tmp_path):
    from ftw.errors import FormatError
    from helpers_container import write_sample

    path = tmp_path / "m.ftw"
    write_sample(path, np.random.default_rng(), level=3)
    with ftw.open(path) as f:
        b = next(b for banks in f.layers.values() for b in banks.values() if b.row_table is not None)
        os.truncate(path, b.row_table.offset)
        with pytest.raises(FormatError, match=rf"^{path}: file shrank while being read \(no bytes at offset {b.row_table.offset}\)$"):
            f.row_frame(b, 0)


# kills: read_into 24 (the message of a file cut short under a read) and 26 (a short read
# continued at the wrong offset: preadv may return less than asked, here from a stand-in that
# reads at most 1000 bytes a call, as it does for more than 2 GiB on Linux)
def test_read_into_continues_short_reads_and_names_a_cut_file(tmp_path, monkeypatch):
    from ftw.errors import FormatError
    from helpers_container import write_sample

    path = tmp_path / "m.ftw"
    write_sample(path, np.random.default_rng())
    data = path.read_bytes()
    real_preadv = os.preadv

    def short_preadv(fd, buffers, offset):
        return real_preadv(fd, [memoryview(buffers[0])[:1000]], offset)

    with ftw.open(path) as f:
        monkeypatch.setattr(os, "preadv", short_preadv)
        out = np.full(5000, 0xA5, np.uint8)
        f.read_into(4096, out)
        assert out.tobytes() == data[4096 : 4096 + 5000]
        monkeypatch.setattr(os, "preadv", real_preadv)
        os.truncate(path, 6000)
        with pytest.raises(FormatError, match=rf"^{path}: file shrank while reading at offset 6000$"):
            f.read_into(4096, out)


# kills: verify 3, 5 (the first bad blob named in file order, not in the order of the labels),
# 36, 47 (a blob of more than one 1 MiB piece: the last piece's size, the pieces' offsets) and
# 40, 41, 45, 46 (its checksum pass on a file cut short since it was mapped: a FormatError
# naming the file and the next blob's offset; the file is cut when the first blob is counted)
def test_verify_hashes_blobs_in_file_order_in_pieces_and_names_a_cut(tmp_path):
    from ftw.errors import ChecksumError, FormatError
    from helpers_container import index_of, patch_blob, write_sample

    from ftw.writers import FtwWriter

    rng = np.random.default_rng()
    big = rng.integers(0, 256, (1 << 20) + 12345, dtype=np.uint8).tobytes()  # two pieces
    path = tmp_path / "big.ftw"
    with FtwWriter(path) as w:
        w.add_attachment("big.bin", big)
        w.add_attachment("small.txt", b"after the big one")
    with ftw.open(path) as f:
        assert f.verify(threads=1) == len(big) + 17
        assert f.attachment("big.bin") == big

    path = tmp_path / "m.ftw"
    write_sample(path, rng)
    data = path.read_bytes()
    ix = index_of(data)
    bank = ix["layers"]["1"]["banks"]["down"]  # before every tensor and attachment in the file
    attachment = ix["attachments"]["config.json"]  # its label sorts first
    assert bank["offset"] < attachment["offset"]
    bad = tmp_path / "bad.ftw"
    bad.write_bytes(patch_blob(patch_blob(data, bank, 3, b"\xff\x00", False), attachment, 0, b"[", False))
    with ftw.open(bad) as f:
        with pytest.raises(ChecksumError, match=rf"^{bad}: layer 1 bank down: checksum mismatch \(data corrupt\)$"):
            f.verify()

    with ftw.open(path) as f:
        blobs = sorted((b for _, b in f.blobs() if b.nbytes), key=lambda b: b.offset)
        with pytest.raises(FormatError, match=rf"^{path}: file shrank while being read \(no bytes at offset {blobs[1].offset}\)$"):
            f.verify(threads=1, progress=lambda n: os.truncate(path, 0))


# kills: layer_dims 2 (a layer whose I differs from the model's moe_intermediate_size: GGUF's
# per-layer widths), 7 (a file without a model: a GGUF layer's I needs its options), 10, 11
# (the message when a layer's banks cannot give H and I); bank_info_of 2, 3 (the message for
# a layer the file lacks); check_layer 11, 17, 18 (reading rules: ds_fp4 files before 0.2
# stored the packed banks as i8, which a reader still takes)
def test_layer_dims_from_the_model_or_the_banks_and_older_dtypes_read(tmp_path):
    from ftw.banks import BankSource, LayerBanks
    from ftw.errors import FormatError
    from ftw.writers import FtwWriter
    from ftw.writers.convert import convert

    rng = np.random.default_rng()
    H, I, I1, E = 64, 32, 96, 3  # noqa: E741
    model = ModelShape("test", H, I, E, 2, 3, [1, 2], "silu", layer_intermediate_sizes={1: I1})

    def banks(fmt, i):
        out = {}
        for name, s in fmt.banks(H, i).items():
            if s.optional:
                continue
            dt = spec.numpy_dtype(s.dtypes[0])
            arr = rng.integers(1, 120, (E, *s.row_shape)).astype(np.uint8).view(dt) if dt.itemsize == 1 else \
                (rng.standard_normal((E, *s.row_shape)).astype(np.float32).view(np.uint32) >> 16).astype(dt)
            out[name] = BankSource(s.dtypes[0], s.row_shape, E, lambda e, a=arr: [a[e]])
        return out

    path = tmp_path / "m.ftw"
    ds = LayerFormat.of("ds_fp4", {"act_block": 128, "scale_fmt": "ue8m0"})
    with FtwWriter(path) as w:
        w.set_model(model)
        w.add_layer(LayerBanks(1, LayerFormat.of("bf16"), banks(LayerFormat.of("bf16"), I1)))
        w.add_layer(LayerBanks(2, ds, banks(ds, I)))
    with ftw.open(path) as f:
        assert f.layer_dims(1) == (H, I1) and f.layer_dims(2) == (H, I)
        f.check_layer(1)
        with pytest.raises(FtwError, match=rf"^{path}: no MoE layer 5 \(has \[1, 2\]\)$"):
            f.bank_info_of(5)

    def older_ds_fp4(ix):  # as files before 0.2 stored it
        for name in ("gate_up", "down"):
            ix["layers"]["2"]["banks"][name]["dtype"] = "i8"

    older = _edited_copy(tmp_path, path, older_ds_fp4)
    with ftw.open(older) as f:
        assert f.layers[2]["down"].dtype == "i8"
        f.check_layer(2)
        f.verify()

    gguf = tmp_path / "g.ftw"
    convert(os.path.join(os.path.dirname(__file__), "..", "samples", "gguf", "qwen3moe-Q4_K_M.gguf"), gguf)

    def no_model(ix):
        ix["model"] = None

    with ftw.open(gguf) as f:
        want = {layer: (f.model.hidden_size, f.model.intermediate_size(layer)) for layer in f.layers}
    bare = _edited_copy(tmp_path, gguf, no_model)
    with ftw.open(bare) as f:
        assert f.model is None and len(want) == 3
        assert {layer: f.layer_dims(layer) for layer in f.layers} == want

    def no_down(ix):
        ix["model"] = None
        del ix["layers"]["1"]["banks"]["down"]

    cut = _edited_copy(tmp_path, gguf, no_down)
    with ftw.open(cut) as f:
        with pytest.raises(FormatError, match=rf"^{cut}: layer 1 \({re.escape(str(f.layer_formats[1]))}\): banks \['gate_up'\] do not give H and I$"):
            f.layer_dims(1)


# kills: verify 94 (the frame tasks start at every step-th row up to E, not at rows below the
# step): with tasks of one row (FRAME_TASK_NBYTES forced down to one row's bytes, as a bank of
# rows over 32 MiB has), a bad frame in the last expert is still decoded and refused
def test_verify_frame_tasks_cover_every_row(tmp_path, monkeypatch):
    from ftw import container
    from ftw.errors import FormatError
    from helpers_container import index_of, patch_blob, write_sample

    path = tmp_path / "z.ftw"
    write_sample(path, np.random.default_rng(), level=3, num_experts=6)
    data = path.read_bytes()
    with ftw.open(path) as f:
        b = next(b for banks in f.layers.values() for b in banks.values() if b.row_table is not None)
    desc = index_of(data)["layers"][str(b.layer)]["banks"][b.name]
    last = int(np.frombuffer(data, "<u8", b.num_experts + 1, desc["row_table"]["offset"])[-2])
    path.write_bytes(patch_blob(data, desc, last, b"\0\0\0\0", reseal=True))  # not a zstd frame
    monkeypatch.setattr(container, "FRAME_TASK_NBYTES", b.row_nbytes)
    with ftw.open(path) as f:
        with pytest.raises(FormatError, match=rf"^{path}: layer {b.layer} bank {b.name} expert 5: corrupt zstd frame header"):
            f.verify()


# kills: FtwFile._fd_open 1, 2 and close 3, 4 (descriptor 0 taken for closed: a process whose
# stdin is closed gets 0 for the file it opens, and close() must close it)
def test_a_file_opened_on_descriptor_0_reads(tmp_path):
    from helpers_container import write_sample

    path = tmp_path / "m.ftw"
    exp = write_sample(path, np.random.default_rng())
    saved = os.dup(0)
    try:
        os.close(0)
        with ftw.open(path) as f:
            assert f._fd == 0
            assert f.attachment("tokenizer.model") == exp.attachments["tokenizer.model"]
            assert f.verify() > 0
        with pytest.raises(OSError):
            os.fstat(0)  # closed with the file
    finally:
        os.dup2(saved, 0)
        os.close(saved)


# kills: FtwWriter._flush_copy 17 (a source file cut short under the writer named in the
# error) and add_layer 22 (a layer added twice named)
def test_writer_names_a_cut_source_and_a_layer_added_twice(tmp_path):
    from ftw.banks import BankSource, LayerBanks
    from ftw.errors import SourceError
    from ftw.writers import FtwWriter

    E, n = 3, 5000
    data = np.random.default_rng().integers(0, 256, (E, n), dtype=np.uint8)
    src = tmp_path / "src.bin"
    rows = np.frombuffer(_mapped_file(src, data.tobytes()), dtype=np.uint8).reshape(E, n)

    def row(e):
        if e == E - 1:  # rows 0 and 1 wait in the run of adjacent bytes, not yet copied
            os.truncate(src, 0)
        return [rows[e]]

    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(SourceError, match=rf"^{src}: file shrank while being read \(no bytes at offset 0\)$"):
        with FtwWriter(out / "m.ftw") as w:
            w.add_layer(LayerBanks(0, LayerFormat.of("bf16"), {"gate_up": BankSource("u8", (n,), E, row)}))
    assert os.listdir(out) == []
    bank = {"gate_up": BankSource("u8", (n,), E, lambda e: [data[e]])}
    with pytest.raises(FtwError, match=rf"^{out / 'm.ftw'}: layer 4 added twice$"):
        with FtwWriter(out / "m.ftw") as w:
            w.add_layer(LayerBanks(4, LayerFormat.of("bf16"), bank))
            w.add_layer(LayerBanks(4, LayerFormat.of("bf16"), bank))
    assert os.listdir(out) == []


# kills: FtwWriter.__init__ 8 (the message for threads < 1) and 34, 35, 44, 45 (a writer given
# no model and no provenance writes "model": null and "provenance": {} under those keys, not
# under other names a reader ignores)
def test_writer_defaults_in_the_index_and_its_thread_count_checked(tmp_path):
    from helpers_container import index_of

    from ftw.writers import FtwWriter

    with pytest.raises(FtwError, match=r"^threads must be at least 1, got 0$"):
        FtwWriter(tmp_path / "m.ftw", threads=0)
    with FtwWriter(tmp_path / "m.ftw") as w:
        w.add_attachment("a.txt", b"x")
    ix = index_of((tmp_path / "m.ftw").read_bytes())
    assert set(ix) == {"model", "layer_quant_formats", "layers", "tensors", "attachments", "provenance"}
    assert ix["model"] is None and ix["provenance"] == {} and ix["layers"] == {} and list(ix["attachments"]) == ["a.txt"]


def _blob_desc(ix, where):
    """The descriptor at an index path such as 'layers.1.banks.down' or 'attachments.a'."""
    d = ix
    for part in where.split(".", 3 if where.startswith("layers.") else 1):
        d = d[part]
    return d


# kills: _Index.blob 15, 26, 36, 40, 43, 51 and FtwFile._bank 16, 19, 20, 32, 57: each check of
# a blob or bank descriptor names the path of the offending value in the index (down to
# .offset / .nbytes) and says what was expected; exactly MAX_EXPERTS experts are allowed
@pytest.mark.parametrize("where,key,value,message", [
    ("layers.1.banks.down", "offset", "4096", r"layers\.1\.banks\.down\.offset: expected a non-negative integer, got '4096'"),
    ("tensors.model.norm.weight", "nbytes", -1, r"tensors\.model\.norm\.weight\.nbytes: expected a non-negative integer, got -1"),
    ("attachments.config.json", "xxh3", "0X" + "0" * 14, r"attachments\.config\.json: xxh3 must be 16 lower-case hex digits"),
    ("layers.3.banks.gate_up", "offset", 4097, r"layers\.3\.banks\.gate_up: offset 4097 is not 4096-aligned"),
    ("tensors.scalar", "offset", 1 << 40, r"tensors\.scalar: bytes \[1099511627776, 1099511627784\) outside the data area \[4096, \d+\)"),
    ("layers.1.banks.down", "shape", [], r"layers\.1\.banks\.down: a bank's shape starts with the expert count"),
    ("layers.1.banks.down", "codec", "lz4", r"layers\.1\.banks\.down: unknown codec 'lz4'"),
    # at the limit of experts the shape is taken, and found not to fit the bytes; one more is refused
    ("layers.1.banks.down", "shape", [spec.MAX_EXPERTS, 64, 32],
     rf"layers\.1\.banks\.down: 16384 bytes do not hold bf16 \[{spec.MAX_EXPERTS}, 64, 32\]"),
    ("layers.1.banks.down", "shape", [spec.MAX_EXPERTS + 1, 64, 32],
     rf"layers\.1\.banks\.down: {spec.MAX_EXPERTS + 1} experts, past the format's limit of {spec.MAX_EXPERTS} \(FORMAT\.md 1\.1\)"),
])
def test_a_bad_blob_descriptor_is_named_by_its_index_path(tmp_path, where, key, value, message):
    from ftw.errors import FormatError
    from helpers_container import write_sample

    path = tmp_path / "m.ftw"
    write_sample(path, np.random.default_rng())

    def edit(ix):
        _blob_desc(ix, where)[key] = value

    bad = _edited_copy(tmp_path, path, edit)
    with pytest.raises(FormatError, match=rf"^{bad}: index {message}$"):
        ftw.open(bad)


# kills: _Index.dtype_shape 8, 18, 19 (MAX_DIMS dimensions allowed), 26, 30, 31, 37, FtwFile._bank 71, 78, 82, 84 and _layer_id 8: the messages of a
# bad dtype, row table and layer key name their index path; a compressed bank may claim exactly
# ZSTD_MAX_RATIO times its stored bytes (the most a zstd frame expands), not one byte more
def test_bad_dtypes_row_tables_ratios_and_layer_keys_are_named_by_index_path(tmp_path):
    from ftw.errors import FormatError
    from helpers_container import write_sample

    path = tmp_path / "z.ftw"
    write_sample(path, np.random.default_rng(), level=3)
    with ftw.open(path) as f:
        gate_up = f.layers[1]["gate_up"]
    assert gate_up.codec == "zstd-bytesplit" and gate_up.shape == (4, 64, 64)
    assert gate_up.raw_nbytes == spec.ZSTD_MAX_RATIO  # one stored byte may claim it all

    def bank(**changes):
        def edit(ix):
            ix["layers"]["1"]["banks"]["gate_up"].update(changes)
        return _edited_copy(tmp_path, path, edit)

    def refused(bad, message):
        with pytest.raises(FormatError, match=rf"^{bad}: index {message}$"):
            ftw.open(bad)

    refused(bank(dtype="bf17"), r"layers\.1\.banks\.gate_up: unknown dtype 'bf17'")
    refused(bank(row_table={"offset": -8, "nbytes": 40, "xxh3": "0" * 16}),
            r"layers\.1\.banks\.gate_up\.row_table\.offset: expected a non-negative integer, got -8")
    with ftw.open(path) as f:
        table = f.layers[1]["gate_up"].row_table
    refused(bank(row_table={"offset": table.offset, "nbytes": 16, "xxh3": table.xxh3}),
            r"layers\.1\.banks\.gate_up: row table of 16 bytes for 4 experts")
    at_ratio = bank(nbytes=1)
    with ftw.open(at_ratio) as f:  # opens: the ratio holds; the row table no longer partitions it
        with pytest.raises(FormatError, match=r"row table does not partition the bank's 1 bytes$"):
            f.expert_row(1, "gate_up", 0)
    refused(bank(nbytes=1, shape=[4, 64, 65]), r"layers\.1\.banks\.gate_up: 1 compressed bytes cannot hold bf16 \[4, 64, 65\]")

    def leading_zero(ix):
        for key in ("layers", "layer_quant_formats"):
            ix[key]["01"] = ix[key].pop("1")

    refused(_edited_copy(tmp_path, path, leading_zero), r"layers\.01: layer keys are decimal layer indices without leading zeros")

    def dims(n):  # the f64 scalar as an array of n dimensions of 1
        def edit(ix):
            ix["tensors"]["scalar"]["shape"] = [1] * n
        return _edited_copy(tmp_path, path, edit)

    with ftw.open(dims(spec.MAX_DIMS)) as f:
        assert f.tensor("scalar").shape == (1,) * spec.MAX_DIMS
    refused(dims(spec.MAX_DIMS + 1), rf"tensors\.scalar: shape must be a list of at most {spec.MAX_DIMS} dimensions")

    def tensor_shape(shape):
        def edit(ix):
            ix["tensors"]["scalar"]["shape"] = shape
        return _edited_copy(tmp_path, path, edit)

    refused(tensor_shape([1, -1]), r"tensors\.scalar\.shape: expected a non-negative integer, got -1")
    refused(tensor_shape([1 << 40, 1 << 40]), r"tensors\.scalar: shape \[1099511627776, 1099511627776\] is too large for any array")


# kills: ExpertFormat.check_banks 35, 36, 39-42: a layer with some of its format's optional banks
# (the expert biases) but not all is refused, naming those it has and those it lacks
def test_a_layer_with_part_of_its_optional_banks_is_refused_naming_both():
    from ftw.errors import FormatError
    from ftw.formats.base import get_format

    bf16 = get_format("bf16")
    H, I = 64, 64  # noqa: E741
    specs = bf16.banks(H, I, {})
    optional = [n for n, s in specs.items() if s.optional]
    assert optional == ["gate_up_bias", "down_bias"]
    shapes = {n: (s.dtypes[0], s.row_shape) for n, s in specs.items()}
    bf16.check_banks(shapes, H, I, {}, "here")
    bf16.check_banks({n: v for n, v in shapes.items() if n not in optional}, H, I, {}, "here")
    with pytest.raises(FormatError, match=r"^here: bf16 layer has gate_up_bias without down_bias$"):
        bf16.check_banks({n: v for n, v in shapes.items() if n != "down_bias"}, H, I, {}, "here")


# kills: get_format 3 and Activation.validate 5: an unknown format or activation is refused
# listing the known ones, comma separated
def test_unknown_formats_and_activations_list_the_known_ones():
    from ftw.errors import FormatError
    from ftw.formats.base import FORMATS, get_format
    from ftw.formats.layer import ACTIVATIONS

    with pytest.raises(UnsupportedError, match=rf"^layer format 'nope' is not known to this ftw \(known: {', '.join(FORMATS)}\)$"):
        get_format("nope")
    assert len(FORMATS) > 2 and list(ACTIVATIONS) == ["silu", "swiglu_oai"]
    with pytest.raises(FormatError, match=r"^activation: kind 'gelu' is not an activation ftw knows \(silu, swiglu_oai\)$"):
        Activation("gelu")


# kills: Selection.from_json 3, 9, 11, 14 (experts_only absent reads as false), 18, 20 (every
# layer of the list a non-negative int), 25, 28 (the messages)
def test_the_selection_record_is_read_strictly_with_experts_only_defaulting_to_false(tmp_path):
    from ftw.container import Selection
    from ftw.errors import FormatError
    from helpers_container import write_sample

    path = tmp_path / "m.ftw"
    write_sample(path, np.random.default_rng())

    def with_selection(value):
        def edit(ix):
            ix["selection"] = value
        return _edited_copy(tmp_path, path, edit)

    with ftw.open(with_selection({"layers": [3]})) as f:
        assert f.selection == Selection((3,), False) and f.selection.partial
    for value, message in [
        ("layers 3", "must be an object"),
        ({"layers": [3, -1], "experts_only": False}, "layers must be null or a list of layer indices"),
        ({"layers": [3, True]}, "layers must be null or a list of layer indices"),
        ({"layers": None, "experts_only": "yes"}, "experts_only must be true or false"),
    ]:
        bad = with_selection(value)
        with pytest.raises(FormatError, match=rf"^{bad}: index selection: {message}$"):
            ftw.open(bad)


# kills: FtwFile._parse 22 (a provenance that is not an object read as {}), 28 (the selection's
# errors name the file), 40, 42, 53, 55 (a missing layers or layer_quant_formats is an empty
# object, docs/FORMAT.md), 45 (its path named), 62, 63, 67, 68 (MAX_LAYERS layers are parsed, one
# more is refused at once, naming "layers"), 78, 82, 96, 118, 127 (the paths in other messages),
# 141, 143 (a missing tensors or attachments section is empty too)
def test_index_sections_missing_or_odd_read_as_the_format_says(tmp_path):
    from ftw.errors import FormatError
    from helpers_container import write_sample

    path = tmp_path / "m.ftw"
    exp = write_sample(path, np.random.default_rng())

    def edited(edit):
        return _edited_copy(tmp_path, path, edit)

    def no_layers(ix):
        del ix["layers"], ix["layer_quant_formats"], ix["tensors"]
        ix["provenance"] = ["not", "an", "object"]

    with ftw.open(edited(no_layers)) as f:
        assert f.layers == {} and f.layer_formats == {} and f.tensors == {} and f.provenance == {}
        assert f.attachment("config.json") == exp.attachments["config.json"]

    def no_attachments(ix):
        del ix["attachments"]
        ix["tensors"]["scalar"]["meta"] = "not an object"

    with ftw.open(edited(no_attachments)) as f:
        assert f.attachments == {} and f.tensors["scalar"].meta == {}
        assert f.tensor("scalar") == exp.tensors["scalar"]

    def refused(edit, message):
        bad = edited(edit)
        with pytest.raises(FormatError, match=rf"^{bad}: index {message}$"):
            ftw.open(bad)

    refused(lambda ix: ix.update(layer_quant_formats=[]), "layer_quant_formats: expected an object")
    refused(lambda ix: ix.update(selection=[3]), "selection: must be an object")
    refused(lambda ix: ix.update(tensors=[]), "tensors: expected an object")
    refused(lambda ix: ix.update(attachments=[]), "attachments: expected an object")
    refused(lambda ix: ix["tensors"].update(scalar=[]), r"tensors\.scalar: expected an object")
    refused(lambda ix: ix["tensors"]["scalar"].update(shape=[2]), r"tensors\.scalar: 8 bytes do not hold f64 \[2\]")
    refused(lambda ix: ix["layers"].update({"1": []}), r"layers\.1: expected an object")
    refused(lambda ix: ix["layers"]["1"]["banks"]["down"].update(shape=[8, 64, 16]),  # its bytes still fit
            r"layers\.1: banks disagree on the expert count: \[4, 8\]")
    refused(lambda ix: ix["layer_quant_formats"].update({"7": {"name": "bf16", "options": {}}}),
            "layer_quant_formats: layer 7 has a format but no banks")
    # exactly the limit: parsed (and the first layer found without a format); one more: refused
    refused(lambda ix: ix.update(layers={str(i): {} for i in range(spec.MAX_LAYERS)}),
            "layers.0: has no entry in layer_quant_formats")
    refused(lambda ix: ix.update(layers={str(i): {} for i in range(spec.MAX_LAYERS + 1)}),
            rf"layers: {spec.MAX_LAYERS + 1} layers, past the format's limit of {spec.MAX_LAYERS} \(FORMAT\.md 1\.1\)")


# kills: FtwFile._pread 8, 10 (an OS error or a short read while opening names the file and the
# offset: stand-in preads, EIO and one byte short) and _read_index 7 (a file of exactly
# MIN_FILE_NBYTES, a preamble page and a footer around an empty index, is not "too small": it
# gets as far as its index), 48 (the index range in the message)
def test_opening_names_read_errors_and_the_smallest_file_reaches_its_index(tmp_path, monkeypatch):
    import errno

    import xxhash
    from ftw.errors import FormatError
    from helpers_container import footer, seal_footer, write_sample, with_footer

    path = tmp_path / "m.ftw"
    write_sample(path, np.random.default_rng())
    data = path.read_bytes()
    f0 = footer(data)
    smallest = tmp_path / "smallest.ftw"
    smallest.write_bytes(data[: spec.ALIGNMENT] + seal_footer(
        {**f0, "index_offset": spec.ALIGNMENT, "index_nbytes": 0, "index_xxh3": xxhash.xxh3_64_intdigest(b"")}))
    assert os.path.getsize(smallest) == spec.MIN_FILE_NBYTES
    with pytest.raises(FormatError, match=rf"^{smallest}: index is not valid JSON"):
        ftw.open(smallest)
    shifted = tmp_path / "shifted.ftw"
    shifted.write_bytes(with_footer(data, index_offset=f0["index_offset"] - 8))
    end = f0["index_offset"] - 8 + f0["index_nbytes"]
    with pytest.raises(FormatError, match=rf"^{shifted}: index \[{f0['index_offset'] - 8}, {end}\) must end where the footer starts \({len(data) - spec.FOOTER.size}\); truncated or appended to\?$"):
        ftw.open(shifted)

    real_pread = os.pread

    def failing_pread(fd, n, offset):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "pread", failing_pread)
    with pytest.raises(FtwError, match=rf"^{path}: cannot read at offset 0: {os.strerror(errno.EIO)}$"):
        ftw.open(path)
    monkeypatch.setattr(os, "pread", lambda fd, n, offset: real_pread(fd, n, offset)[:-1])
    with pytest.raises(FormatError, match=rf"^{path}: short read at offset 0$"):
        ftw.open(path)


# kills: ExpertFormat.check_options 8 (a legacy option skipped when reading, and the options
# after it still checked), 9, 10, 12-14 (an unknown option's message lists the format's options,
# comma separated, or says "none"), 32-35 (the alternatives a GGUF layer needs, and a required option)
def test_options_after_a_legacy_one_are_checked_and_unknown_ones_list_the_choices():
    from ftw.errors import FormatError

    legacy_first = {"name": "ds_fp4", "options": {"swiglu_limit": 7.0, "act_block": 0}}
    with pytest.raises(FormatError, match=r"^here: ds_fp4 option 'act_block' must be "):
        LayerFormat.from_json(legacy_first, "here")
    ok = LayerFormat.from_json({"name": "ds_fp4", "options": {"swiglu_limit": 7.0, "act_block": 64}}, "here")
    assert dict(ok.options) == {"swiglu_limit": 7.0, "act_block": 64}
    with pytest.raises(FormatError, match=r"^here: ds_fp4 has no option 'block' \(options: act_block, scale_fmt\)$"):
        LayerFormat.of("ds_fp4", {"block": 1}, "here")
    with pytest.raises(FormatError, match=r"^here: bf16 has no option 'block' \(options: none\)$"):
        LayerFormat.of("bf16", {"block": 1}, "here")
    with pytest.raises(FormatError, match=r"^here: gguf needs options gate_up_type\+down_type or gate_type\+up_type\+down_type$"):
        LayerFormat.of("gguf", {"down_type": "Q4_K"}, "here")
    with pytest.raises(FormatError, match=r"^here: affine needs option 'bits' \(bits per value\)$"):
        LayerFormat.of("affine", {"group_size": 64}, "here")


# kills: loader._check_fits 11 (banks that need exactly the machine's memory are loaded; one
# byte less memory and they are refused, naming the file and both sizes). A stand-in sysconf
# reports the memory: 1-byte pages, as many as the test needs
def test_load_needing_exactly_the_machines_memory_goes_ahead(mixed_file, monkeypatch):
    path, expected, _ = mixed_file
    with ftw.open(path) as f:
        need = sum(b.raw_nbytes for banks in f.layers.values() for b in banks.values())
        nlayers = len(f.layers)
    real_sysconf = os.sysconf

    def memory(nbytes):
        return lambda name: {"SC_PHYS_PAGES": nbytes, "SC_PAGE_SIZE": 1}.get(name) or real_sysconf(name)

    monkeypatch.setattr(os, "sysconf", memory(need))
    eb = load_expert_banks(path)
    for layer, arrays in expected.items():
        for name, a in arrays.items():
            assert np.array_equal(eb.banks[name][layer], a), (name, layer)
    monkeypatch.setattr(os, "sysconf", memory(need - 1))
    with pytest.raises(FtwError, match=rf"^{path}: the banks of {nlayers} layer\(s\) take {need} bytes decoded, more than "
                                       rf"this machine's {need - 1} bytes of memory$"):
        load_expert_banks(path)
