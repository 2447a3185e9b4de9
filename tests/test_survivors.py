"""Tests for the mutants a hand-made mutation pass found alive (issue 15). Each names the
mutation it kills; docs/TESTING.md lists them with the mutation score of the core modules."""

from __future__ import annotations

import copy
import os
import shutil

import numpy as np
import pytest
from checking import check
from helpers_container import index_of, patch_blob, rng, with_index, write_sample  # noqa: F401 (rng: fixture)

import ftw
from ftw import loader
from ftw.errors import FormatError
from ftw.layer_ranges import parse_layers
from ftw.writers import atomic
from ftw.writers.convert import convert

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT_OSS = os.path.join(ROOT, "samples", "st", "gpt_oss_mxfp4")
MIXED = os.path.join(ROOT, "samples", "st", "mixed_bf16_nvfp4")


# kills: the leading-zero rule for layer keys removed ("01" would open as layer 1)
def test_layer_key_with_a_leading_zero_in_layers_and_formats_is_refused(tmp_path, rng):  # noqa: F811
    path = tmp_path / "m.ftw"
    write_sample(path, rng)
    data = path.read_bytes()
    ix = copy.deepcopy(index_of(data))
    ix["layers"]["01"] = ix["layers"].pop("1")
    ix["layer_quant_formats"]["01"] = ix["layer_quant_formats"].pop("1")
    bad = tmp_path / "bad.ftw"
    bad.write_bytes(with_index(data, ix))
    with pytest.raises(FormatError, match="layers.01"):
        ftw.open(bad)


# kills: the atomic writer no longer fsyncs the temporary file before the rename
def test_the_temporary_file_is_fsynced_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace, real_link = os.fsync, os.replace, os.link
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: (events.append(("fsync", os.path.realpath(f"/proc/self/fd/{fd}"))), real_fsync(fd))[1])
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: (events.append(("replace", b)), real_replace(a, b))[1])
    monkeypatch.setattr(atomic.os, "link", lambda a, b: (events.append(("link", b)), real_link(a, b))[1])
    dst = tmp_path / "out.bin"
    f = atomic.AtomicFile(dst, force=True)
    f.write(b"x" * 10000)
    f.commit()
    assert dst.read_bytes() == b"x" * 10000
    kinds = [k for k, _ in events]
    into_place = max(i for i, (k, p) in enumerate(events) if k in ("replace", "link") and p == str(dst))
    # the file's own data is synced before the step that puts it at the destination
    assert "fsync" in kinds[:into_place], events


# kills: an aborted writer leaves its temporary file when no reaper process is there to delete it
def test_abort_without_a_reaper_removes_the_temporary_file(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "_anonymous_files_link", lambda folder: False)  # the named-file path
    monkeypatch.setattr(atomic, "_start_reaper", lambda path: None)  # e.g. no shell to run one
    dst = tmp_path / "out.bin"
    f = atomic.AtomicFile(dst)
    f.write(b"partial")
    assert f._named_tmp and os.path.exists(f._named_tmp)
    f.abort()
    assert os.listdir(tmp_path) == []


# kills: "0-3" parsed as 0-2 (the range end excluded)
@pytest.mark.parametrize("text,want", [("0-3", [0, 1, 2, 3]), ("2-2", [2]), ("0-1,5,7-8", [0, 1, 5, 7, 8])])
def test_layer_ranges_include_their_end(text, want):
    assert parse_layers(text) == want


def test_convert_layers_range_takes_the_last_layer_too(tmp_path):
    dst = tmp_path / "m.ftw"
    convert(MIXED, dst, layers=parse_layers("1-3"))
    with ftw.open(dst) as f:
        assert sorted(f.layers) == [1, 2, 3]


# kills: merge takes a placeholder's dtype from the lowest layer even when its bank is empty
def test_merge_placeholder_dtype_comes_from_the_lowest_layer_with_bytes():
    E = 3
    empty_f16 = np.empty((E, 0), dtype=np.float16)
    full_f32 = np.random.default_rng().standard_normal((E, 5)).astype(np.float32)
    fmt = ftw.LayerFormat.of("bf16")
    a = loader.ExpertBanks({"gate_up_bias": {0: empty_f16}}, {0: fmt}, E, {"gate_up_bias": "f16"})
    b = loader.ExpertBanks({"gate_up_bias": {1: full_f32}}, {1: fmt}, E, {"gate_up_bias": "f32"})
    c = loader.ExpertBanks({"down": {2: np.zeros((E, 4), np.uint16)}}, {2: fmt}, E, {"down": "bf16"})
    merged = loader.merge_expert_banks([a, b, c])
    assert merged.banks["gate_up_bias"][2].shape == (E, 0)
    assert merged.banks["gate_up_bias"][2].dtype == np.float32


# kills: the torch placeholder's dtype becomes uint8 (only its shape was checked)
def test_torch_placeholders_keep_the_bank_dtype(tmp_path):
    torch = pytest.importorskip("torch")
    dst = tmp_path / "m.ftw"
    convert(MIXED, dst)  # bf16 layers lack nvfp4's f32 globals and e4m3 scales
    banks = ftw.load_expert_banks(dst, pin=True, threads=2)
    placeholders = [(name, layer, t) for name, per in banks.banks.items() for layer, t in per.items()
                    if t.shape[1:] == (0,)]
    assert {t.dtype for _, _, t in placeholders} >= {torch.float32}, "a placeholder of a non-byte dtype"
    for name, layer, t in placeholders:
        full = next(x for x in banks.banks[name].values() if x.numel())
        assert isinstance(t, torch.Tensor) and t.dtype == full.dtype, (name, layer, t.dtype, full.dtype)


# kills: check compares only expert 0's bytes / skips optional banks / compares attachments by name
def _resealed_edit(tmp_path, src, edit):
    dst = tmp_path / "m.ftw"
    convert(src, dst)
    data = dst.read_bytes()
    data = edit(data, index_of(data))
    dst.write_bytes(data)
    with ftw.open(dst) as f:
        f.verify()  # sealed: only the comparison with the source sees it
    return dst


def _flip_in_row(bank_name, expert, layer=None):
    def edit(data, ix):
        key = layer if layer is not None else next(k for k in ix["layers"] if bank_name in ix["layers"][k]["banks"])
        desc = ix["layers"][key]["banks"][bank_name]
        assert desc["codec"] == "raw"
        row = desc["nbytes"] // desc["shape"][0]
        pos = expert * row + row // 2
        return patch_blob(data, desc, pos, bytes([data[desc["offset"] + pos] ^ 0x01]), reseal=True)
    return edit


def test_check_finds_a_changed_byte_in_expert_1(tmp_path):
    dst = _resealed_edit(tmp_path, MIXED, _flip_in_row("down", 1))
    report = check(MIXED, dst)
    assert not report.ok and any("bank down" in p and "experts 1" in p for p in report.all_problems())


def test_check_compares_expert_biases(tmp_path):
    dst = _resealed_edit(tmp_path, GPT_OSS, _flip_in_row("down_bias", 2))
    report = check(GPT_OSS, dst)
    assert not report.ok and any("bank down_bias" in p for p in report.all_problems())


def test_check_compares_attachment_bytes(tmp_path):
    def edit(data, ix):
        desc = ix["attachments"]["config.json"]
        return patch_blob(data, desc, 2, bytes([data[desc["offset"] + 2] ^ 0x20]), reseal=True)

    dst = _resealed_edit(tmp_path, MIXED, edit)
    report = check(MIXED, dst)
    assert not report.ok and any("attachment config.json: bytes differ" in p for p in report.all_problems())
