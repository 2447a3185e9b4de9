"""Bad checkpoints: each error names the tensor (or layer) at fault, before any bank byte is read."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from ftw.errors import SourceError, UnsupportedError
from ftw.readers.safetensors_reader import SafetensorsReader, open_safetensors
from st_build import build, family_config, rand_bf16, rand_e4m3, save, write_ckpt


def _tensors(folder):
    from safetensors import safe_open

    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        import torch

        return {n: f.get_tensor(n) for n in f.keys()}, torch


def rewrite(folder, drop=(), add=None, replace=None):
    """Rewrite model.safetensors without `drop`, with `add`/`replace` tensors (st dtype, array)."""
    src, torch = _tensors(folder)
    st = {torch.bfloat16: "BF16", torch.float32: "F32", torch.uint8: "U8", torch.float8_e4m3fn: "F8_E4M3",
          torch.int8: "I8", torch.float8_e8m0fnu: "F8_E8M0"}
    out = {}
    for n, t in src.items():
        if n in drop:
            continue
        out[n] = (st[t.dtype], _np(t, torch))
    out.update(add or {})
    for n, v in (replace or {}).items():
        out[n] = v
    save(os.path.join(folder, "model.safetensors"), out)


def _np(t, torch):
    st_np = {torch.bfloat16: np.uint16, torch.float32: np.float32, torch.uint8: np.uint8,
             torch.float8_e4m3fn: np.uint8, torch.int8: np.int8, torch.float8_e8m0fnu: np.uint8}
    raw = t.contiguous().reshape(-1).view(torch.uint8).numpy()
    return raw.view(st_np[t.dtype]).reshape(tuple(t.shape))


def test_missing_expert_names_tensor(tmp_path):
    folder, _ = build(tmp_path / "ck", "qwen3_moe", ["bf16", "bf16"], E=3)
    rewrite(folder, drop={"model.layers.1.mlp.experts.2.up_proj.weight"})
    with SafetensorsReader(folder) as r:
        r.plan([0])  # the other layer is whole
        with pytest.raises(SourceError, match=r"layer 1: missing expert tensor model.layers.1.mlp.experts.2.up_proj.weight"):
            r.plan([1])
        with pytest.raises(SourceError, match="experts.2.up_proj.weight"):
            r.plan()


def test_missing_scale_names_tensor(tmp_path):
    folder, _ = build(tmp_path / "ck", "deepseek_v3", [None, "fp8_block"], E=3, H=256, I=160)
    rewrite(folder, drop={"model.layers.1.mlp.experts.1.down_proj.weight_scale_inv"})
    with pytest.raises(SourceError, match=r"missing expert tensor model.layers.1.mlp.experts.1.down_proj.weight_scale_inv"):
        SafetensorsReader(folder).plan()


def test_unexpected_expert_tensor(tmp_path):
    folder, _ = build(tmp_path / "ck", "qwen3_moe", ["bf16", "bf16"], E=3)
    rng = np.random.default_rng()
    extra = "model.layers.0.mlp.experts.1.gate_proj.bias"
    rewrite(folder, add={extra: ("BF16", rand_bf16(rng, (32,)))})
    with SafetensorsReader(folder) as r:
        r.plan([1])
        with pytest.raises(SourceError, match=rf"unexpected expert tensor '{extra}'"):
            r.plan([0])
    rewrite(folder, drop={extra}, add={"model.layers.0.mlp.experts.1.fc9.weight": ("BF16", rand_bf16(rng, (32,)))})
    with pytest.raises(SourceError, match="unexpected expert tensor 'model.layers.0.mlp.experts.1.fc9.weight'"):
        SafetensorsReader(folder).plan([0])


def test_mismatched_shapes_between_experts(tmp_path):
    folder, _ = build(tmp_path / "ck", "qwen3_moe", ["bf16"], E=3, H=64, I=32)
    rng = np.random.default_rng()
    name = "model.layers.0.mlp.experts.2.down_proj.weight"
    rewrite(folder, replace={name: ("BF16", rand_bf16(rng, (64, 48)))})
    with pytest.raises(SourceError, match=rf"'{name}' .* is bf16 \[64, 48\], expected bf16 \[64, 32\]"):
        SafetensorsReader(folder).plan()


def test_wrong_dtype(tmp_path):
    folder, _ = build(tmp_path / "ck", "qwen3_moe", ["fp8_block"], E=2, H=256, I=160)
    rng = np.random.default_rng()
    name = "model.layers.0.mlp.experts.1.gate_proj.weight_scale_inv"
    rewrite(folder, replace={name: ("BF16", rand_bf16(rng, (2, 2)))})
    with pytest.raises(SourceError, match=rf"'{name}' .* is bf16 \[2, 2\], expected f32 \[2, 2\]"):
        SafetensorsReader(folder).plan()
    folder, _ = build(tmp_path / "ck2", "qwen3_moe", ["bf16"], E=2)
    name = "model.layers.0.mlp.experts.1.gate_proj.weight"
    rewrite(folder, replace={name: ("F8_E4M3", rand_e4m3(rng, (32, 64)))})
    with pytest.raises(SourceError, match=rf"'{name}' .* is f8_e4m3"):
        SafetensorsReader(folder).plan()


def test_unsupported_expert_dtype(tmp_path):
    rng = np.random.default_rng()
    t = {f"model.layers.0.mlp.experts.{e}.{p}.weight": ("F32", rng.standard_normal(s).astype(np.float32))
         for e in range(2) for p, s in (("gate_proj", (32, 64)), ("up_proj", (32, 64)), ("down_proj", (64, 32)))}
    folder = write_ckpt(str(tmp_path / "ck"), family_config("qwen3_moe", ["bf16"], 2, 64, 32), t)
    with pytest.raises(UnsupportedError, match="is f32; unscaled experts must be bf16"):
        SafetensorsReader(folder).plan()


def test_config_disagrees_with_tensors(tmp_path):
    folder, _ = build(tmp_path / "ck", "qwen3_moe", ["bf16", "bf16"], E=4)
    cfg_path = os.path.join(folder, "config.json")
    cfg = json.load(open(cfg_path))
    json.dump(dict(cfg, num_experts=6), open(cfg_path, "w"))
    with pytest.raises(SourceError, match=r"missing expert tensor model.layers.0.mlp.experts.4.gate_proj.weight"):
        SafetensorsReader(folder).plan()
    json.dump(dict(cfg, num_experts=2), open(cfg_path, "w"))
    with pytest.raises(SourceError, match=r"unexpected expert tensor 'model.layers.0.mlp.experts.2.down_proj.weight': config has 2 experts"):
        SafetensorsReader(folder).plan()
    json.dump(dict(cfg, moe_intermediate_size=16), open(cfg_path, "w"))
    with pytest.raises(SourceError, match=r"expected bf16 \[16, 64\]"):
        SafetensorsReader(folder).plan()
    json.dump(dict(cfg, mlp_only_layers=[1]), open(cfg_path, "w"))
    with pytest.raises(SourceError, match=r"layer 1 has expert tensors .* config makes it dense"):
        SafetensorsReader(folder)


def test_stacked_shape_and_missing(tmp_path):
    folder, _ = build(tmp_path / "ck", "qwen3_5_moe", ["stacked", "stacked"], E=3)
    cfg_path = os.path.join(folder, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["text_config"]["num_experts"] = 4
    json.dump(cfg, open(cfg_path, "w"))
    with pytest.raises(SourceError, match=r"gate_up_proj' .* is bf16 \[3, 64, 64\], expected bf16 \[4, 64, 64\]"):
        SafetensorsReader(folder).plan([1])
    cfg["text_config"]["num_experts"] = 3
    json.dump(cfg, open(cfg_path, "w"))
    rewrite(folder, drop={"model.language_model.layers.1.mlp.experts.down_proj"})
    with SafetensorsReader(folder) as r:
        r.plan([0])
        with pytest.raises(SourceError, match="missing expert tensor model.language_model.layers.1.mlp.experts.down_proj"):
            r.plan([1])


def test_layer_without_experts(tmp_path):
    folder, _ = build(tmp_path / "ck", "gpt_oss", ["mxfp4", "mxfp4"])
    src, _ = _tensors(folder)
    rewrite(folder, drop={n for n in src if n.startswith("model.layers.1.mlp.experts.")})
    with SafetensorsReader(folder) as r:
        r.plan([0])
        with pytest.raises(SourceError, match=r"missing expert tensor model.layers.1.mlp.experts.gate_up_proj_blocks"):
            r.plan([1])
        with pytest.raises(SourceError, match="layer 5 is not a MoE layer"):
            r.plan([5])


def test_gpt_oss_missing_bias(tmp_path):
    folder, _ = build(tmp_path / "ck", "gpt_oss", ["mxfp4"])
    rewrite(folder, drop={"model.layers.0.mlp.experts.down_proj_bias"})
    with pytest.raises(SourceError, match="missing expert tensor model.layers.0.mlp.experts.down_proj_bias"):
        SafetensorsReader(folder).plan()


def test_unknown_family_and_not_a_checkpoint(tmp_path):
    folder, _ = build(tmp_path / "ck", "qwen3_moe", ["bf16"])
    cfg_path = os.path.join(folder, "config.json")
    json.dump({"model_type": "llama"}, open(cfg_path, "w"))
    with pytest.raises(UnsupportedError, match="model_type 'llama' is not a family"):
        open_safetensors(folder)
    assert open_safetensors(str(tmp_path)) is None  # no config.json
    assert open_safetensors(cfg_path) is None  # a file
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    assert open_safetensors(str(empty)) is None  # no shards


def test_truncated_shard_in_sharded_checkpoint(tmp_path):
    folder, _ = build(tmp_path / "ck", "deepseek_v3", [None, "bf16", "bf16"], nshards=2)
    last = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))[-1]
    p = os.path.join(folder, last)
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) - 1)
    with pytest.raises(SourceError, match=rf"{last}: tensor '.*': truncated shard"):
        SafetensorsReader(folder)


def test_open_checkpoint_picks_safetensors_reader(tmp_path):
    from ftw.readers import open_checkpoint

    folder, _ = build(tmp_path / "ck", "mixtral", ["bf16"])
    with open_checkpoint(folder) as r:
        assert isinstance(r, SafetensorsReader) and r.name == "safetensors/mixtral"


def test_threads_share_one_index(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    folder, refs = build(tmp_path / "ck", "qwen3_moe", ["nvfp4_modelopt"] * 4, E=8)
    with SafetensorsReader(folder) as r:
        lbs = r.plan()
        jobs = [(lb, k, e) for lb in lbs for k in lb.banks for e in range(8)]
        with ThreadPoolExecutor(4) as ex:
            rows = list(ex.map(lambda j: j[0].banks[j[1]].row_array(j[2]).tobytes(), jobs))
        assert rows == [lb.banks[k].row_array(e).tobytes() for lb, k, e in jobs]
        assert r.index.bytes_read == sum(r.index.info(t).nbytes for t in r.index.touched)
