"""Layer filtering: reading layer k maps only layer k's expert bytes, and a broken other layer
does not matter until it is asked for."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from ftw.errors import SourceError
from ftw.readers.safetensors_index import SafetensorsIndex
from ftw.readers.safetensors_reader import SafetensorsReader
from st_build import build, save


def read_all(lb):
    for src in lb.banks.values():
        for e in range(src.num_experts):
            for p in src.row(e):
                np.ascontiguousarray(p).reshape(-1).view(np.uint8).sum()  # touch every byte


def split_by_layer(folder):
    """Rewrite a one-file checkpoint as one shard per decoder layer (+ one for the rest), with an index."""
    idx = SafetensorsIndex(folder)
    shards: dict[str, dict] = {}
    for n in idx.names():
        m = re.match(r"^(?:model\.)?layers\.(\d+)\.", n)
        key = f"layer{int(m.group(1)):03d}.safetensors" if m else "rest.safetensors"
        info = idx.info(n)
        shards.setdefault(key, {})[n] = (info.st_dtype, np.array(idx.array(n)))
    idx.close()
    os.remove(os.path.join(folder, "model.safetensors"))
    wm = {}
    for fn, t in shards.items():
        save(os.path.join(folder, fn), t)
        wm.update({n: fn for n in t})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": wm}, f)


@pytest.mark.parametrize("fmt", ["bf16", "fp8_block", "nvfp4_modelopt", "stacked"])
def test_one_layer_touches_only_its_bytes(tmp_path, fmt):
    n = 4
    folder, refs = build(tmp_path / "ck", "qwen3_moe", [fmt] * n, E=3, H=256, I=160)
    with SafetensorsReader(folder) as r:
        [lb] = r.plan([2])
        r.layer_formats()
        assert r.index.bytes_read == 0, "planning reads headers only"
        read_all(lb)
        prefix = "model.layers.2.mlp.experts."
        assert r.index.touched and all(t.startswith(prefix) for t in r.index.touched)
        own = sum(r.index.info(t).nbytes for t in r.index.names()
                  if t.startswith(prefix) and not t.endswith("input_scale"))
        assert r.index.bytes_read == own
        one = r.index.bytes_read
        for lb in r.plan():
            read_all(lb)
        assert r.index.bytes_read == n * one


def test_other_layers_unreadable(tmp_path):
    folder, refs = build(tmp_path / "ck", "deepseek_v3", [None, "fp8_block", "nvfp4_ct", "bf16"], E=3, H=256, I=160)
    split_by_layer(folder)
    r = SafetensorsReader(folder)
    # after opening, every other layer's data is gone: only layer 2's shard is still whole
    for L in (0, 1, 3):
        p = os.path.join(folder, f"layer{L:03d}.safetensors")
        with open(p, "r+b") as f:
            f.truncate(16)
    [lb] = r.plan([2])
    from test_readers_families import check_layer

    check_layer(lb, refs[2], "nvfp4_ct")
    [lb1] = r.plan([1])  # planning still works: headers were read at open
    with pytest.raises(SourceError, match="layer001.safetensors: shard changed size"):
        lb1.banks["gate_up"].row(0)
    r.close()


def test_missing_tensor_in_unrequested_layer(tmp_path):
    folder, refs = build(tmp_path / "ck", "mixtral", ["nvfp4_modelopt", "bf16", "nvfp4_modelopt"], E=3)
    split_by_layer(folder)
    p = os.path.join(folder, "model.safetensors.index.json")
    idx = json.load(open(p))
    gone = "model.layers.0.block_sparse_moe.experts.1.w3.weight_scale"
    # rewrite layer 0's shard without one tensor
    st = SafetensorsIndex(folder)
    keep = {n: (st.info(n).st_dtype, np.array(st.array(n))) for n, fn in idx["weight_map"].items()
            if fn == "layer000.safetensors" and n != gone}
    st.close()
    save(os.path.join(folder, "layer000.safetensors"), keep)
    del idx["weight_map"][gone]
    json.dump(idx, open(p, "w"))
    with SafetensorsReader(folder) as r:
        from test_readers_families import check_layer

        for lb in r.plan([1, 2]):
            check_layer(lb, refs[lb.layer], ["nvfp4_modelopt", "bf16", "nvfp4_modelopt"][lb.layer])
        with pytest.raises(SourceError, match=gone.replace(".", r"\.")):
            r.plan([0])
        with pytest.raises(SourceError, match="layer 0"):
            r.layer_formats()


def test_each_shard_is_mapped_once(tmp_path):
    """Every tensor of a shard is a view of the same map (one mapping, one descriptor)."""
    from ftw.readers.safetensors_index import SafetensorsIndex
    import numpy as np

    from safetensors.numpy import save_file

    rng = np.random.default_rng()
    save_file({f"t{i}": rng.standard_normal((8, 8)).astype(np.float32) for i in range(5)},
              str(tmp_path / "model.safetensors"))
    index = SafetensorsIndex(tmp_path)
    bases = set()
    for name in index.names():
        obj = index.array(name)
        while isinstance(obj, (np.ndarray, memoryview)):
            obj = obj.base if isinstance(obj, np.ndarray) else obj.obj
        bases.add(id(obj))
    assert len(bases) == 1
    index.close()
