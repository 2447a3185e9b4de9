"""Every GGUF sample through `ftw convert` and back: banks, formats, tensors, metadata."""

from __future__ import annotations

import json
import os

import gguf
import numpy as np
import pytest

import ftw
from ftw.readers.gguf_reader import METADATA_ATTACHMENT
from ftw.writers.convert import convert

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "samples", "gguf")
MANIFEST = json.load(open(os.path.join(SAMPLES, "manifest.json")))


@pytest.mark.parametrize("name", list(MANIFEST["samples"]))
def test_sample_converts_with_per_layer_formats(tmp_path, name):
    want = MANIFEST["samples"][name]
    dst = tmp_path / "out.ftw"
    convert(os.path.join(SAMPLES, name), dst)
    src = {t.name: t for f in want["files"] for t in gguf.GGUFReader(os.path.join(SAMPLES, f)).tensors}
    with ftw.open(dst) as f:
        f.verify()
        assert {str(k): v.to_json() for k, v in f.layer_formats.items()} == want["layer_formats"]
        assert f.model.moe_layers == want["model"]["moe_layers"]
        E = f.model.num_experts
        for layer in f.model.moe_layers:
            p = f"blk.{layer}."
            parts = ([src[p + "ffn_gate_up_exps.weight"]] if p + "ffn_gate_up_exps.weight" in src
                     else [src[p + "ffn_gate_exps.weight"], src[p + "ffn_up_exps.weight"]])
            for e in range(E):
                assert f.expert_row(layer, "gate_up", e).tobytes() == b"".join(t.data[e].tobytes() for t in parts)
                assert f.expert_row(layer, "down", e).tobytes() == src[p + "ffn_down_exps.weight"].data[e].tobytes()
        for name_, info in f.tensors.items():
            assert f.tensor(name_).tobytes() == src[name_].data.tobytes(), name_
            assert info.meta["ggml_type"] == src[name_].tensor_type.name
        meta = tmp_path / "meta.gguf"
        meta.write_bytes(f.attachment(METADATA_ATTACHMENT))
    g = gguf.GGUFReader(meta)
    assert g.fields["general.architecture"].contents() == want["arch"]
    assert len(g.fields["tokenizer.ggml.tokens"].contents()) == 32
    assert np.all(np.asarray(g.fields["tokenizer.ggml.token_type"].contents()) >= 1)
