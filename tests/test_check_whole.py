"""`ftw check` compares the whole file with what converting the source gives.

Each case edits a correct conversion's index, re-seals it (so `ftw verify` passes), and must
fail check with the difference named. Then readers broken in the four ways a re-laying can go
wrong (gate/up swapped, gpt-oss interleave kept, NVFP4 gate global on up rows, FP8 block
scales mapped wrongly) write files whose bytes match what that same reader re-lays: only the
independent reference from the source's own tensors can catch them, and it must.
"""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
from checking import check
from helpers_container import index_of, with_index

import ftw
from ftw.readers.families import gpt_oss, per_expert
from ftw.writers.convert import convert

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ST = os.path.join(ROOT, "samples", "st", "mixed_bf16_nvfp4")
GGUF = os.path.join(ROOT, "samples", "gguf", "qwen3moe-Q4_K_M.gguf")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    d = tmp_path_factory.mktemp("whole")
    out = {}
    for name, src in (("st", ST), ("gguf", GGUF)):
        dst = d / f"{name}.ftw"
        convert(src, dst)
        out[name] = (src, dst.read_bytes())
    return out


def first_tensor(index, dtype=None):
    return next(n for n, t in sorted(index["tensors"].items()) if dtype is None or t["dtype"] == dtype)


def _drop(key, pick):
    def edit(ix):
        for n in pick(ix):
            del ix[key][n]
    return edit


def _drop_layers(pick):
    def edit(ix):
        for k in pick(ix):
            del ix["layers"][k], ix["layer_quant_formats"][k]
    return edit


def _model(**changes):
    def edit(ix):
        ix["model"].update(changes)
    return edit


def _tensor(change):
    def edit(ix):
        n = first_tensor(ix, "bf16")
        change(ix["tensors"][n])
    return edit


def _set(path_value):
    def edit(ix):
        key, value = path_value
        ix[key] = value
    return edit


ST_EDITS = {
    "one tensor dropped": (_drop("tensors", lambda ix: [first_tensor(ix)]), "missing from the file"),
    "embeddings and lm_head dropped": (
        _drop("tensors", lambda ix: [n for n in ix["tensors"] if "embed" in n or "lm_head" in n]), "embed"),
    "routers dropped": (_drop("tensors", lambda ix: [n for n in ix["tensors"] if n.endswith("mlp.gate.weight")]),
                        "mlp.gate.weight: in the source, missing"),
    "all tensors dropped": (_drop("tensors", lambda ix: list(ix["tensors"])), "missing from the file"),
    "config.json dropped": (_drop("attachments", lambda ix: ["config.json"]), "attachment config.json"),
    "all attachments dropped": (_drop("attachments", lambda ix: list(ix["attachments"])), "attachment"),
    "one MoE layer dropped": (_drop_layers(lambda ix: ["1"]), "layer 1: in the source"),
    "all MoE layers dropped": (_drop_layers(lambda ix: list(ix["layers"])), "missing from the file"),
    "hidden_size": (_model(hidden_size=7), "model.hidden_size"),
    "moe_intermediate_size": (_model(moe_intermediate_size=7), "model.moe_intermediate_size"),
    "num_experts": (_model(num_experts=7), "model.num_experts"),
    "top_k": (_model(top_k=7), "model.top_k"),
    "moe_layers": (_model(moe_layers=[0]), "model.moe_layers"),
    "num_layers": (_model(num_layers=99), "model.num_layers"),
    "activation": (_model(activation={"kind": "silu", "limit": 3.0}), "model.activation"),
    "family": (_model(family="mixtral"), "model.family"),
    "extra": (_model(extra={"x": 1}), "model.extra"),
    "model null": (_set(("model", None)), "model: the file records none"),
    "tensor transposed": (_tensor(lambda t: t.update(shape=t["shape"][::-1])), "file bf16"),
    "tensor flattened": (_tensor(lambda t: t.update(shape=[int(np.prod(t["shape"]))])), "file bf16"),
    "tensor bf16 -> f16": (_tensor(lambda t: t.update(dtype="f16")), "file f16"),
    "tensor bf16 -> u16": (_tensor(lambda t: t.update(dtype="u16")), "file u16"),
    "selection claims --layers 1": (_set(("selection", {"layers": [1], "experts_only": False})),
                                    "not in the source's selection"),
}


def _gguf_meta(change):
    def edit(ix):
        n = next(n for n, t in sorted(ix["tensors"].items()) if t.get("meta", {}).get("ggml_type", "F32") not in ("F32",))
        change(ix["tensors"][n]["meta"])
    return edit


GGUF_EDITS = {
    "ggml_type changed": (_gguf_meta(lambda m: m.update(ggml_type="Q8_0")), "meta"),
    "ggml_shape changed": (_gguf_meta(lambda m: m.update(ggml_shape=m["ggml_shape"][::-1])), "meta"),
    "meta dropped": (_gguf_meta(lambda m: m.clear()), "meta"),
    "metadata attachment dropped": (_drop("attachments", lambda ix: list(ix["attachments"])), "attachment"),
}


def _edited(converted, which, edit, tmp_path):
    src, data = converted[which]
    ix = copy.deepcopy(index_of(data))
    edit(ix)
    path = tmp_path / "edited.ftw"
    path.write_bytes(with_index(data, ix))
    with ftw.open(path):  # sealed: the file opens; only a comparison with the source (or, for a
        pass  # model that contradicts the banks, verify's format check) can see the edit
    return src, path


EDITS = {("st", case): edit for case, edit in ST_EDITS.items()} | {("gguf", case): edit for case, edit in GGUF_EDITS.items()}


@pytest.mark.parametrize("which,case", list(EDITS), ids=[f"{w}-{c}" for w, c in EDITS])
def test_check_names_every_edit_of_a_conversion(converted, tmp_path, which, case):
    edit, expected = EDITS[which, case]
    src, path = _edited(converted, which, edit, tmp_path)
    report = check(src, path)
    assert not report.ok
    assert any(expected in p for p in report.all_problems()), report.all_problems()


def test_every_difference_is_named_not_only_the_first(converted, tmp_path):
    def edit(ix):
        ST_EDITS["top_k"][0](ix)
        ST_EDITS["config.json dropped"][0](ix)
        ST_EDITS["one MoE layer dropped"][0](ix)
    src, path = _edited(converted, "st", edit, tmp_path)
    problems = check(src, path).all_problems()
    assert any("model.top_k" in p for p in problems)
    assert any("attachment config.json" in p for p in problems)
    assert any("layer 1" in p for p in problems)


@pytest.mark.parametrize("how", [dict(), dict(layers=[1, 2]), dict(experts_only=True), dict(compress_level=3),
                                 dict(layers=[0], experts_only=True)])
def test_honest_conversions_pass_and_the_report_says_what_was_selected(tmp_path, how):
    dst = tmp_path / "m.ftw"
    convert(ST, dst, **how)
    report = check(ST, dst)
    assert report.ok, report.all_problems()
    if "layers" in how:
        assert report.selection.startswith(f"layers {'-'.join(map(str, sorted({how['layers'][0], how['layers'][-1]})))} of 0-3")
        assert "--layers" in report.selection
    if how.get("experts_only"):
        assert "--experts-only" in report.selection and report.tensors_compared == 0
    assert all(r.experts_decoded > 0 for r in report.layers.values())


# -- broken readers: caught only by the independent reference ------------------------------


def _swap_gate_up(orig):
    def pair(names, suffix):
        gu, d = orig(names, suffix)
        return [[up, gate] for gate, up in gu], d
    return pair


def _keep_interleave(orig):
    def deinterleave(index, name, last=False):
        def row(e):
            a = index.array(name)[e]
            if last:
                h = a.shape[1] // 2
                return [np.ascontiguousarray(a[:, :h].T), np.ascontiguousarray(a[:, h:].T)]
            h = a.shape[0] // 2
            return [np.ascontiguousarray(a[:h]), np.ascontiguousarray(a[h:])]
        return row
    return deinterleave


def _gate_global_on_up(orig):
    def build(names, dims, index, L, kind):
        fmt, options, rows = orig(names, dims, index, L, kind)
        gate_global = rows["gate_up_global"]
        rows["gate_up_global"] = lambda e: [np.repeat(gate_global(e)[0], 2)]
        return fmt, options, rows
    return build


def _gate_scales_for_up(orig):
    def build(names, dims, index, L, kind, **kw):
        fmt, options, rows = orig(names, dims, index, L, kind, **kw)
        scales = rows["gate_up_scale"]
        rows["gate_up_scale"] = lambda e: [scales(e)[0], scales(e)[0]]
        return fmt, options, rows
    return build


BROKEN = {
    "gate and up swapped": (per_expert, "_pair", _swap_gate_up, "qwen3_moe_bf16"),
    "gpt-oss interleave kept": (gpt_oss, "_deinterleave", _keep_interleave, "gpt_oss_mxfp4"),
    "gpt-oss bf16 interleave kept": (gpt_oss, "_deinterleave", _keep_interleave, "gpt_oss_bf16"),
    "NVFP4 gate's global on up rows": (per_expert, "_nvfp4", _gate_global_on_up, "qwen3_moe_nvfp4_modelopt"),
    "FP8 gate's block scales for up": (per_expert, "_fp8", _gate_scales_for_up, "deepseek_v3_fp8"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_reader_is_caught_by_the_source_reference(tmp_path, monkeypatch, case):
    module, attr, breaker, sample = BROKEN[case]
    src = os.path.join(ROOT, "samples", "st", sample)
    monkeypatch.setattr(module, attr, breaker(getattr(module, attr)))
    dst = tmp_path / "broken.ftw"
    convert(src, dst)
    report = check(src, dst, experts=2)
    problems = report.all_problems()
    assert not report.ok, f"{case}: a broken reader passed check"
    assert any("decoded from the source's own tensors" in p for p in problems), problems
    # and every bank byte matched what the (broken) reader re-lays: only the reference saw it
    assert not any("bytes of" in p for p in problems), problems
