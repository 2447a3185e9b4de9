"""Tests that iterate over the format registry (ftw.formats.FORMATS): a format added to it is
tested here without a line changed.

For every registered format:
- a bundled sample (samples/st or samples/gguf) converts to a file that holds layers of it;
- every such sample round-trips: convert, open, verify, load_expert_banks, and the format's
  decoder on the loaded rows agrees with an independent oracle computed from the SOURCE:
    safetensors samples: samples/reference.py (float64, LAYOUTS.md formulas on the raw bytes,
      no ftw code): equal, except nvfp4 from compressed-tensors, whose reader stores the
      float32 reciprocal of the inverse global (rtol 2^-23, docs/ARCHITECTURE.md);
    GGUF samples: gguf.quants.dequantize on the source file's own tensors (float32 output,
      compared in float64: equal);
- every layer's banks have the dtypes and row shapes its BankSpec says, at the layer's H and I;
- its options schema refuses bad values with a FormatError naming the option (and the layer).
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

import ftw
from ftw.errors import FormatError
from ftw.formats import FORMATS, LayerFormat
from ftw.writers.convert import convert

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from samples.reference import load_manifest, reference_dequant  # noqa: E402

ST = load_manifest()["samples"]
GGUF = json.loads((ROOT / "samples" / "gguf" / "manifest.json").read_text())["samples"]

NVFP4_CT_RTOL = 2**-23  # float32(1 / g) against the source's 1 / g: one rounding, <= 2^-24 relative


def _sample_formats() -> dict[str, set[str]]:
    """sample key ('st/<name>' or 'gguf/<file>') -> the layer formats its manifest promises."""
    out = {f"st/{n}": set(e["formats"].values()) for n, e in ST.items()}
    out.update({f"gguf/{n}": {f["name"] for f in e["layer_formats"].values()} for n, e in GGUF.items()})
    return out


SAMPLE_FORMATS = _sample_formats()
# collected once, before any test runs: a format registered inside a test is never listed
FORMAT_NAMES = list(FORMATS)
PAIRS = [(fmt, s) for fmt in FORMAT_NAMES for s in sorted(SAMPLE_FORMATS) if fmt in SAMPLE_FORMATS[s]]


def _source(sample: str) -> Path:
    kind, name = sample.split("/", 1)
    if kind == "st":
        return ROOT / "samples" / ST[name]["path"]
    return ROOT / "samples" / "gguf" / GGUF[name]["files"][0]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """sample key -> its converted FTW file (each sample converted once per module)."""
    out_dir = tmp_path_factory.mktemp("registry")
    done: dict[str, Path] = {}

    def get(sample: str) -> Path:
        if sample not in done:
            dst = out_dir / (sample.replace("/", "_") + ".ftw")
            convert(_source(sample), dst)
            done[sample] = dst
        return done[sample]

    return get


# ----------------------------------------------------------------------------- coverage


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_every_format_has_a_bundled_sample(fmt, converted):
    samples = [s for s in sorted(SAMPLE_FORMATS) if fmt in SAMPLE_FORMATS[s]]
    assert samples, f"format {fmt!r} is registered but no sample in samples/st or samples/gguf has a layer of it"
    with ftw.open(converted(samples[0])) as f:
        layers = [l for l, lf in f.layer_formats.items() if lf.name == fmt]
    assert layers, f"{samples[0]}: its manifest lists {fmt} but the converted file has no {fmt} layer"


def test_every_sample_format_is_registered():
    """The other direction: no sample holds a format the registry does not know."""
    for sample, fmts in SAMPLE_FORMATS.items():
        assert fmts <= set(FORMATS), f"{sample}: {sorted(fmts - set(FORMATS))} not registered"


# ----------------------------------------------------------------------------- oracles


@lru_cache(maxsize=None)
def _st_reference(name: str) -> dict[int, dict]:
    return reference_dequant(ROOT / "samples" / ST[name]["path"], ST[name])


@lru_cache(maxsize=None)
def _gguf_tensors(name: str) -> dict:
    import gguf

    return {t.name: t for f in GGUF[name]["files"] for t in gguf.GGUFReader(ROOT / "samples" / "gguf" / f).tensors}


def _gguf_reference(name: str, layer: int, expert: int) -> dict[str, np.ndarray]:
    """One expert from the source GGUF's own tensors, decoded by gguf.quants (llama.cpp's reference)."""
    from gguf.quants import dequantize

    src = _gguf_tensors(name)
    p = f"blk.{layer}."

    def rows(t):
        return dequantize(np.asarray(t.data[expert]), t.tensor_type).astype(np.float64)

    if p + "ffn_gate_up_exps.weight" in src:
        gu = rows(src[p + "ffn_gate_up_exps.weight"])
        I = gu.shape[0] // 2  # noqa: E741
        w = {"gate": gu[:I], "up": gu[I:]}
    else:
        w = {"gate": rows(src[p + "ffn_gate_exps.weight"]), "up": rows(src[p + "ffn_up_exps.weight"])}
    w["down"] = rows(src[p + "ffn_down_exps.weight"])
    for proj in ("gate", "up", "down"):
        bias = src.get(f"{p}ffn_{proj}_exps.bias")
        if bias is not None:
            w[proj + "_bias"] = np.asarray(bias.data[expert], dtype=np.float64)
    return w


def _oracle(sample: str, layer: int, expert: int) -> dict[str, np.ndarray] | None:
    kind, name = sample.split("/", 1)
    if kind == "gguf":
        return _gguf_reference(name, layer, expert)
    ref = _st_reference(name)
    if layer not in ref:
        return None  # an MTP layer: the manifest's references cover the listed MoE layers
    return {k: v[expert] for k, v in ref[layer].items() if k != "format"}


def _rtol(sample: str, fmt: str) -> float:
    kind, name = sample.split("/", 1)
    if kind == "st" and fmt == "nvfp4" and ST[name]["naming"].get("nvfp4") == "compressed-tensors":
        return NVFP4_CT_RTOL
    return 0.0


# ----------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("fmt,sample", PAIRS)
def test_round_trip_against_oracle(fmt, sample, converted):
    path = converted(sample)
    cls = FORMATS[fmt]
    with ftw.open(path) as f:
        assert f.verify() > 0
        layers = [l for l, lf in f.layer_formats.items() if lf.name == fmt]
        assert layers, f"{sample}: no {fmt} layer after conversion"
        dims = {l: f.layer_dims(l) for l in layers}
        own_banks = {l: list(f.layers[l]) for l in layers}
        banks = ftw.load_expert_banks(f, layers=layers)
        compared = 0
        for l in layers:
            H, I = dims[l]  # noqa: E741
            lf = banks.layer_formats[l]
            assert lf == f.layer_formats[l]
            for e in range(banks.num_experts):
                rows = {b: banks.banks[b][l][e] for b in own_banks[l]}
                got = cls.decode(rows, H, I, lf.options)
                # the file's own decode path (mapped rows) gives the same weights
                direct = f.decode_expert(l, e)
                assert set(direct) == set(got)
                for k in got:
                    np.testing.assert_array_equal(direct[k], got[k], err_msg=f"{sample} layer {l} expert {e} {k}")
                want = _oracle(sample, l, e)
                if want is None:
                    continue
                assert set(want) == set(got), f"{sample} layer {l}: decoded {sorted(got)}, oracle {sorted(want)}"
                for k in want:
                    assert got[k].shape == want[k].shape, (sample, l, e, k)
                    assert np.isfinite(got[k]).all(), (sample, l, e, k)
                    if k in ("gate", "up", "down"):  # (transformers' gpt-oss samples init biases to 0)
                        assert np.abs(got[k]).max() > 0, (sample, l, e, k)
                    np.testing.assert_allclose(got[k], want[k], rtol=_rtol(sample, fmt), atol=0,
                                               err_msg=f"{sample} layer {l} expert {e} {k}")
                compared += 1
    assert compared, f"{sample}: no {fmt} expert compared with an oracle"


@pytest.mark.parametrize("sample", sorted(SAMPLE_FORMATS))
def test_bank_specs_hold_for_every_layer(sample, converted):
    """Each layer's banks against its format's BankSpec rows at the layer's own H and I."""
    with ftw.open(converted(sample)) as f:
        assert f.layer_formats
        for l, lf in f.layer_formats.items():
            H, I = f.layer_dims(l)  # noqa: E741
            assert (H, I) == (f.model.hidden_size, f.model.intermediate_size(l))
            specs = FORMATS[lf.name].banks(H, I, lf.options)
            have = f.layers[l]
            assert set(have) <= set(specs), f"{sample} layer {l}: banks {sorted(set(have) - set(specs))} undeclared"
            for name, spec in specs.items():
                assert spec.name == name
                if name not in have:
                    assert spec.optional, f"{sample} layer {l}: required bank {name} missing"
                    continue
                info = have[name]
                assert spec.accepts(info.dtype, reading=True), f"{sample} layer {l} {name}: {info.dtype} not in {spec.dtypes}"
                assert tuple(info.row_shape) == spec.row_shape, f"{sample} layer {l} {name}"
                assert info.num_experts == f.model.num_experts
                assert tuple(info.shape) == (info.num_experts, *spec.row_shape)


# ----------------------------------------------------------------------------- options

# per format: (options, the option the error must name); every one is refused by LayerFormat.of
# (writing) and by LayerFormat.from_json (reading a file)
UNKNOWN = ({"bogus": 1}, "bogus")
BAD_OPTIONS: dict[str, list[tuple[dict, str]]] = {
    "bf16": [UNKNOWN, ({"gate_up_type": "Q4_K"}, "gate_up_type")],
    "fp8_block": [
        UNKNOWN,
        ({"block_size": [128]}, "block_size"),
        ({"block_size": [0, 128]}, "block_size"),
        ({"block_size": [128, -1]}, "block_size"),
        ({"block_size": [128.0, 128]}, "block_size"),
        ({"block_size": [True, 128]}, "block_size"),
        ({"block_size": "128x128"}, "block_size"),
        ({"block_size": [128, 128, 128]}, "block_size"),
    ],
    "nvfp4": [UNKNOWN, ({"group_size": 16}, "group_size")],
    "mxfp4": [UNKNOWN, ({"block_size": [1, 32]}, "block_size")],
    "ds_fp4": [
        UNKNOWN,
        ({"act_block": 0}, "act_block"),
        ({"act_block": -128}, "act_block"),
        ({"act_block": 128.0}, "act_block"),
        ({"act_block": "128"}, "act_block"),
        ({"scale_fmt": "e8m0"}, "scale_fmt"),
        ({"scale_fmt": 1}, "scale_fmt"),
    ],
    "mxfp8": [UNKNOWN, ({"bits": 8}, "bits")],
    "affine": [
        ({"bits": 4, "group_size": 64, "bogus": 1}, "bogus"),
        ({"group_size": 64}, "bits"),
        ({"bits": 4}, "group_size"),
        ({"bits": 7, "group_size": 64}, "bits"),
        ({"bits": 1, "group_size": 64}, "bits"),
        ({"bits": 16, "group_size": 64}, "bits"),
        ({"bits": 4.0, "group_size": 64}, "bits"),
        ({"bits": "4", "group_size": 64}, "bits"),
        ({"bits": True, "group_size": 64}, "bits"),
        ({"bits": 4, "group_size": 0}, "group_size"),
        ({"bits": 4, "group_size": -64}, "group_size"),
        ({"bits": 4, "group_size": 64.0}, "group_size"),
    ],
    "gguf": [
        ({"gate_up_type": "Q4_K", "down_type": "Q6_K", "bogus": 1}, "bogus"),
        ({"gate_up_type": "Q4_X", "down_type": "Q6_K"}, "gate_up_type"),
        ({"gate_up_type": 12, "down_type": "Q6_K"}, "gate_up_type"),
        ({"gate_up_type": None, "down_type": "Q6_K"}, "gate_up_type"),
        ({"gate_up_type": "Q4_K", "down_type": "q6_k"}, "down_type"),
        ({"gate_up_type": "Q4_K"}, "down_type"),
        ({"gate_type": "Q4_K", "up_type": "Q5_K", "down_type": "BOGUS"}, "down_type"),
        ({"gate_type": "Q4_K", "up_type": "Q5_X", "down_type": "Q6_K"}, "up_type"),
        ({"gate_up_type": "Q4_K", "gate_type": "Q4_K", "down_type": "Q6_K"}, "gate_up_type"),
        ({"gate_up_type": "Q4_K", "up_type": "Q4_K", "down_type": "Q6_K"}, "gate_up_type"),
        ({"gate_type": "Q4_K", "down_type": "Q6_K"}, "up_type"),
        ({"up_type": "Q4_K", "down_type": "Q6_K"}, "gate_type"),
    ],
}
# a valid options set per format, so the table's bad values are known to be the only problem
GOOD_OPTIONS: dict[str, list[dict]] = {
    "bf16": [{}], "nvfp4": [{}], "mxfp4": [{}], "mxfp8": [{}],
    "fp8_block": [{}, {"block_size": [128, 128]}, {"block_size": [1, 64]}],
    "ds_fp4": [{}, {"act_block": 128, "scale_fmt": "ue8m0"}, {"scale_fmt": "float"}],
    "affine": [{"bits": b, "group_size": g} for b in (2, 3, 4, 5, 6, 8) for g in (32, 64, 128)],
    "gguf": [{"gate_up_type": "Q4_K", "down_type": "Q6_K"},
             {"gate_type": "IQ2_XS", "up_type": "Q4_0", "down_type": "MXFP4"}],
}


def test_option_tables_cover_the_registry():
    """A new format brings its rows here: the table is the schema's test."""
    assert set(BAD_OPTIONS) == set(FORMAT_NAMES) == set(GOOD_OPTIONS)


@pytest.mark.parametrize("fmt,options", [(f, o) for f in GOOD_OPTIONS for o in GOOD_OPTIONS[f]])
def test_good_options_accepted(fmt, options):
    lf = LayerFormat.of(fmt, options)
    assert lf.options == options
    assert LayerFormat.from_json(lf.to_json(), "layer 1") == lf


@pytest.mark.parametrize("fmt,options,option", [(f, o, n) for f in BAD_OPTIONS for o, n in BAD_OPTIONS[f]])
def test_bad_options_refused_naming_the_option(fmt, options, option):
    with pytest.raises(FormatError) as w:
        LayerFormat.of(fmt, options, where="layer 7")
    assert repr(option) in str(w.value), str(w.value)
    assert "layer 7" in str(w.value) and fmt in str(w.value)
    # a file's layer format is checked on open too, with the layer named
    with pytest.raises(FormatError) as r:
        LayerFormat.from_json({"name": fmt, "options": options}, "layer 7")
    assert repr(option) in str(r.value) and "layer 7" in str(r.value), str(r.value)


def test_unknown_format_name_opens_but_is_not_made():
    """A newer writer's format name is kept when read; writing one is refused."""
    lf = LayerFormat.from_json({"name": "fp3_future", "options": {"x": 1}}, "layer 2")
    assert not lf.known and lf.options == {"x": 1}
    with pytest.raises(ftw.UnsupportedError, match="fp3_future"):
        LayerFormat.of("fp3_future", {})
