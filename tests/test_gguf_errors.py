"""Bad GGUF input: each case is one ftw error, on one line, naming the file and the tensor/key."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from ftw.errors import FtwError, SourceError, UnsupportedError
from ftw.readers.gguf_reader import GgufReader, open_gguf
from gguf_testlib import ARR, STR, U32, T, moe_file, write_gguf

LAYERS = {0: ("Q4_0", "Q4_0", "Q8_0"), 1: ("Q8_0", "Q8_0", "Q4_0")}


@pytest.fixture
def rng():
    return np.random.default_rng(int.from_bytes(os.urandom(4), "little"))


def refused(cls, path, *match):
    with pytest.raises(cls) as ei:
        GgufReader(str(path)).plan()
    msg = str(ei.value)
    assert "\n" not in msg
    for m in match:
        assert m in msg, msg
    return msg


def test_truncated_in_tensor_data(tmp_path, rng):
    b = moe_file(tmp_path / "t.gguf", rng, LAYERS, random_bytes=True)
    cut = b.offsets["blk.1.ffn_up_exps.weight"] + 100
    with open(b.path, "r+b") as f:
        f.truncate(cut)
    refused(SourceError, b.path, b.path, "blk.1.ffn_up_exps.weight", "past the end")


def test_truncated_in_header(tmp_path, rng):
    b = moe_file(tmp_path / "t.gguf", rng, LAYERS, random_bytes=True)
    with open(b.path, "r+b") as f:
        f.truncate(450)  # past the count check, inside the key/values or tensor infos
    refused(SourceError, b.path, b.path, "truncated GGUF header")


def test_tensor_data_past_the_end(tmp_path):
    data = bytes(34 * 8)
    write_gguf(tmp_path / "p.gguf", [("general.architecture", STR, "qwen3moe")],
               [T("blk.0.ffn_down_exps.weight", (32, 8), 8, data, offset=1 << 20)])
    refused(SourceError, tmp_path / "p.gguf", "blk.0.ffn_down_exps.weight", "past the end")


def test_misaligned_offset(tmp_path):
    write_gguf(tmp_path / "o.gguf", [("general.architecture", STR, "qwen3moe")],
               [T("x.weight", (32, 1), 8, bytes(34)), T("y.weight", (32, 1), 8, bytes(34), offset=7)])
    refused(SourceError, tmp_path / "o.gguf", "y.weight", "alignment")


def test_missing_expert_tensor(tmp_path, rng):
    b = moe_file(tmp_path / "m.gguf", rng, LAYERS, random_bytes=True, drop={"blk.1.ffn_up_exps.weight"})
    msg = refused(SourceError, b.path, "layer 1", "blk.1.ffn_up_exps.weight", "missing")
    assert "down" not in msg  # the first missing one, not a list


def test_missing_down_after_fused(tmp_path, rng):
    b = moe_file(tmp_path / "m.gguf", rng, {0: ("fused", "Q8_0", "Q8_0")}, random_bytes=True,
                 drop={"blk.0.ffn_down_exps.weight"})
    refused(SourceError, b.path, "blk.0.ffn_down_exps.weight", "missing")


def test_shape_disagrees_with_metadata(tmp_path, rng):
    b = moe_file(tmp_path / "s.gguf", rng, LAYERS, random_bytes=True, meta_I=512)
    refused(SourceError, b.path, "blk.0.ffn_gate_exps.weight", "[256, 512, 2]", "qwen3moe.* metadata")


def test_expert_count_disagrees(tmp_path, rng):
    b = moe_file(tmp_path / "s.gguf", rng, LAYERS, random_bytes=True, E=2)
    data = open(b.path, "rb").read().replace(b"qwen3moe.expert_count\x04\x00\x00\x00\x02", b"qwen3moe.expert_count\x04\x00\x00\x00\x03")
    open(b.path, "wb").write(data)
    refused(SourceError, b.path, "blk.0.ffn_gate_exps.weight", "expected [H, I, E] = [256, 256, 3]")


def test_unknown_type_id_42(tmp_path):
    """newer llama.cpp's Q2_0 (64 values in 18 bytes), unknown to gguf 0.19"""
    write_gguf(tmp_path / "q.gguf", [("general.architecture", STR, "qwen3moe")],
               [T("blk.0.ffn_gate_exps.weight", (256, 4, 2), 42, bytes(18 * 4 * 4 * 2))])
    msg = refused(UnsupportedError, tmp_path / "q.gguf", "blk.0.ffn_gate_exps.weight", "type id 42")
    assert str(tmp_path / "q.gguf") in msg


def test_unknown_type_does_not_crash_inside_gguf(tmp_path):
    import gguf

    write_gguf(tmp_path / "q.gguf", [("general.architecture", STR, "qwen3moe")],
               [T("output.weight", (64, 1), 42, bytes(18))])
    with pytest.raises(ValueError):  # what the gguf package does with it
        gguf.GGUFReader(tmp_path / "q.gguf")
    with pytest.raises(FtwError):
        open_gguf(str(tmp_path / "q.gguf"))


def test_not_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04" + bytes(100))
    refused(SourceError, p, "not a GGUF file")
    q = tmp_path / "x.bin"
    q.write_bytes(b"GGUF")
    assert open_gguf(str(q)) is None  # not ours: another opener may take it
    assert open_gguf(str(tmp_path)) is None


def test_absurd_counts(tmp_path):
    import struct

    p = tmp_path / "c.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 1 << 40) + bytes(64))
    refused(SourceError, p, "more than")


def test_not_moe(tmp_path):
    write_gguf(tmp_path / "d.gguf", [("general.architecture", STR, "llama"), ("llama.block_count", U32, 1)],
               [T("output.weight", (32, 1), 8, bytes(34))])
    refused(UnsupportedError, tmp_path / "d.gguf", "not a MoE model")


def test_missing_metadata_key(tmp_path):
    write_gguf(tmp_path / "k.gguf", [("general.architecture", STR, "qwen3moe"), ("qwen3moe.expert_count", U32, 2)],
               [T("output.weight", (32, 1), 8, bytes(34))])
    refused(SourceError, tmp_path / "k.gguf", "qwen3moe.embedding_length", "missing")


def test_width_array_of_wrong_length(tmp_path, rng):
    b = moe_file(tmp_path / "w.gguf", rng, LAYERS, random_bytes=True, widths=[256, 256, 256])
    refused(SourceError, b.path, "expert_feed_forward_length has 3 entries", "block_count = 2")


def test_bias_without_its_pair(tmp_path, rng):
    b = moe_file(tmp_path / "b.gguf", rng, LAYERS, random_bytes=True, bias=True, drop={"blk.0.ffn_up_exps.bias"})
    refused(SourceError, b.path, "blk.0.ffn_up_exps.bias", "missing")


def test_missing_shard(tmp_path):
    src = os.path.join(os.path.dirname(os.path.dirname(__file__)), "samples", "gguf")
    name = "glm4moe-Q4_K_S-00001-of-00002.gguf"
    shutil.copy(os.path.join(src, name), tmp_path / name)
    refused(SourceError, tmp_path / name, "glm4moe-Q4_K_S-00002-of-00002.gguf", "missing")


def test_shard_with_wrong_split_no(tmp_path):
    src = os.path.join(os.path.dirname(os.path.dirname(__file__)), "samples", "gguf")
    a, b = "glm4moe-Q4_K_S-00001-of-00002.gguf", "glm4moe-Q4_K_S-00002-of-00002.gguf"
    shutil.copy(os.path.join(src, a), tmp_path / a)
    shutil.copy(os.path.join(src, a), tmp_path / b)  # shard 1 twice
    refused(SourceError, tmp_path / b, "split.no is 0, expected 1")


def test_row_not_whole_blocks(tmp_path):
    write_gguf(tmp_path / "r.gguf", [("general.architecture", STR, "qwen3moe")],
               [T("output.weight", (100, 1), 12, bytes(144))])
    refused(SourceError, tmp_path / "r.gguf", "output.weight", "Q4_K blocks of 256")


def test_duplicate_tensor(tmp_path):
    write_gguf(tmp_path / "d.gguf", [("general.architecture", STR, "qwen3moe")],
               [T("x.weight", (32, 1), 8, bytes(34)), T("x.weight", (32, 1), 8, bytes(34))])
    refused(SourceError, tmp_path / "d.gguf", "duplicate tensor x.weight")


def test_big_endian_refused(tmp_path):
    import struct

    p = tmp_path / "be.gguf"
    p.write_bytes(b"GGUF" + struct.pack(">IQQ", 3, 0, 0) + bytes(64))
    refused(UnsupportedError, p, "big-endian")


def test_string_array_count_beyond_file(tmp_path):
    write_gguf(tmp_path / "a.gguf", [("general.architecture", STR, "qwen3moe"),
                                     ("tokenizer.ggml.tokens", ARR, ["a"], STR)], [])
    data = bytearray(open(tmp_path / "a.gguf", "rb").read())
    i = data.index(b"tokenizer.ggml.tokens") + len("tokenizer.ggml.tokens") + 8  # vtype, subtype
    data[i:i + 8] = (1 << 50).to_bytes(8, "little")
    open(tmp_path / "a.gguf", "wb").write(data)
    refused(SourceError, tmp_path / "a.gguf", "tokenizer.ggml.tokens", "truncated")
