"""Bad input: every refusal is an FtwError whose message names the file (and the layer and
bank when the fault is in data). Index edits are re-sealed so they reach the semantic checks."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest

import ftw
from ftw import spec
from ftw.errors import ChecksumError, FormatError, FtwError

from helpers_container import (  # noqa: F401 (rng: fixture)
    E, H, I, blobs_of, flip_bit, footer, index_of, patch_blob, rng, with_footer, with_index, write_sample,
)


@pytest.fixture(params=[None, 3], ids=["raw", "zstd3"])
def sample(request, tmp_path, rng):
    path = tmp_path / "model.ftw"
    write_sample(path, rng, level=request.param)
    return path


@pytest.fixture
def zsample(tmp_path, rng):
    path = tmp_path / "z.ftw"
    write_sample(path, rng, level=3)
    return path


def refused(path, data: bytes, error=FormatError, match: str | None = None) -> FtwError:
    """Write data at path and check that opening it (or, failing that, verifying) refuses it."""
    path = path.with_name("bad-" + path.name)  # the original stays for the next edit
    path.write_bytes(data)
    with pytest.raises(error) as info:
        with ftw.open(path) as f:
            f.verify()
    msg = str(info.value)
    assert str(path) in msg, msg
    if match:
        assert match in msg, msg
    return info.value


def edited(path, edit) -> bytes:
    """The file at path with edit(index) applied to its index JSON, re-sealed."""
    data = path.read_bytes()
    index = index_of(data)
    edit(index)
    return with_index(data, index)


def boundaries(data: bytes) -> set[int]:
    f = footer(data)
    cuts = {0, 1, 4, 8, 63, 64, 65, 4095, 4096, 4097}
    for _, d in blobs_of(index_of(data)):
        cuts |= {d["offset"], d["offset"] + 1, d["offset"] + d["nbytes"] - 1, d["offset"] + d["nbytes"]}
    start, end = f["index_offset"], len(data) - spec.FOOTER.size
    cuts |= {start - 1, start, start + 1, end - 1, end, end + 1, len(data) - 8, len(data) - 1}
    return {c for c in cuts if 0 <= c < len(data)}


# -- truncation and bit flips -----------------------------------------------------------


def test_truncated_at_every_structural_boundary(sample):
    data = sample.read_bytes()
    cuts = boundaries(data)
    assert len(cuts) > 40
    for cut in sorted(cuts):
        refused(sample, data[:cut])


def test_flipped_bit_in_preamble_magic_and_version(sample):
    data = sample.read_bytes()
    for pos in range(8):
        for bit in range(8):
            refused(sample, flip_bit(data, pos, bit))


def test_flipped_bit_anywhere_in_footer(sample):
    data = sample.read_bytes()
    for pos in range(len(data) - spec.FOOTER.size, len(data)):
        for bit in range(8):
            refused(sample, flip_bit(data, pos, bit))


def test_flipped_bit_in_index(sample, rng):
    data = sample.read_bytes()
    f = footer(data)
    for pos in rng.integers(f["index_offset"], f["index_offset"] + f["index_nbytes"], 40):
        refused(sample, flip_bit(data, int(pos), int(rng.integers(8))), ChecksumError, "index checksum")


def test_flipped_bit_in_each_blob_is_caught_by_verify_naming_it(sample, rng):
    data = sample.read_bytes()
    for label, d in blobs_of(index_of(data)):
        if d["nbytes"] == 0:
            continue
        pos = d["offset"] + int(rng.integers(d["nbytes"]))
        sample.write_bytes(flip_bit(data, pos, int(rng.integers(8))))
        with ftw.open(sample) as f:  # opening never reads data: only verify can tell
            with pytest.raises(ChecksumError) as info:
                f.verify(threads=2)
        assert str(sample) in str(info.value) and f"{label}:" in str(info.value), (label, str(info.value))


# -- footer and index placement ---------------------------------------------------------


def test_declared_index_larger_than_cap_is_refused_before_reading_it(sample, monkeypatch):
    data = sample.read_bytes()
    big = spec.MAX_INDEX_NBYTES + 1
    bad = with_footer(data, index_nbytes=big)  # the cap is checked before where the index lies
    sample.write_bytes(bad)
    reads = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, off: reads.append(n) or real(fd, n, off))
    with pytest.raises(FormatError, match="exceeds the cap"):
        ftw.open(sample)
    assert max(reads) <= spec.FOOTER.size


@pytest.mark.parametrize("delta_offset,delta_nbytes", [(-1, 0), (1, 0), (0, 1), (0, -1), (-4096, 0)])
def test_index_must_end_where_footer_starts(sample, delta_offset, delta_nbytes):
    data = sample.read_bytes()
    f = footer(data)
    bad = with_footer(data, index_offset=f["index_offset"] + delta_offset,
                      index_nbytes=f["index_nbytes"] + delta_nbytes)
    refused(sample, bad, FormatError, "must end where the footer starts")


def test_index_inside_preamble_page_is_refused(sample):
    data = sample.read_bytes()
    refused(sample, with_footer(data, index_offset=100, index_nbytes=len(data) - 64 - 100), FormatError)


def test_appended_bytes_are_refused(sample):
    refused(sample, sample.read_bytes() + b"\0" * 10)


# -- versions -----------------------------------------------------------------------------


def _preamble_version(data: bytes, major: int, minor: int = spec.MINOR) -> bytes:
    return data[:4] + major.to_bytes(2, "little") + minor.to_bytes(2, "little") + data[8:]


def test_unknown_major_version_is_refused(sample):
    data = sample.read_bytes()
    both = with_footer(_preamble_version(data, spec.MAJOR + 1), major=spec.MAJOR + 1)
    refused(sample, both, FormatError, f"major version {spec.MAJOR + 1}")
    refused(sample, _preamble_version(data, spec.MAJOR + 1), FormatError, f"major version {spec.MAJOR + 1}")
    refused(sample, with_footer(data, major=spec.MAJOR + 1), FormatError, f"major version {spec.MAJOR + 1}")
    refused(sample, _preamble_version(data, 0), FormatError, "major version 0")


def test_preamble_and_footer_versions_must_agree(sample):
    data = sample.read_bytes()
    refused(sample, with_footer(data, minor=spec.MINOR + 1), FormatError, "preamble says")


def test_footer_flags_and_reserved_are_ignored(sample):
    data = sample.read_bytes()
    sample.write_bytes(with_footer(data, flags=0xFFFF))
    with ftw.open(sample) as f:
        f.verify()


# -- index content ------------------------------------------------------------------------


@pytest.mark.parametrize("raw,match", [
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe{}", "not valid JSON"),
    (b'{"layers": {}', "not valid JSON"),
    (b"", "not valid JSON"),
    (b"[" * 100000 + b"]" * 100000, "not valid JSON"),
    (b"[]", "root: expected an object"),
    (b'"text"', "root: expected an object"),
    (b"null", "root: expected an object"),
])
def test_invalid_index_json(sample, raw, match):
    refused(sample, with_index(sample.read_bytes(), raw), FormatError, match)


def _first_bank(index, codec=None):
    for key, layer in index["layers"].items():
        for name, bank in layer["banks"].items():
            if codec is None or bank["codec"] == codec:
                return key, name, bank
    raise LookupError(codec)


def _bank(key, name):
    return lambda ix: ix["layers"][key]["banks"][name]


BAD_EDITS = {
    # wrong types
    "layers is a list": (lambda ix: ix.update(layers=[]), "layers: expected an object"),
    "tensors is a string": (lambda ix: ix.update(tensors="x"), "tensors: expected an object"),
    "attachments is a list": (lambda ix: ix.update(attachments=[1]), "attachments: expected an object"),
    "formats is null": (lambda ix: ix.update(layer_quant_formats=None), "layer_quant_formats"),
    "model is a list": (lambda ix: ix.update(model=[]), "model must be an object"),
    "model H negative": (lambda ix: ix["model"].update(hidden_size=-1), "model.hidden_size"),
    "model layers strings": (lambda ix: ix["model"].update(moe_layers=["1"]), "moe_layers"),
    "banks missing": (lambda ix: ix["layers"]["1"].pop("banks"), "layers.1.banks"),
    "layer key not a number": (lambda ix: ix["layers"].update(x=ix["layers"]["1"]), "layers.x"),
    "layer key leading zero": (lambda ix: ix["layers"].update({"01": ix["layers"].pop("1")}), "layers.01"),
    "layer key superscript": (lambda ix: ix["layers"].update({"\u00b2": ix["layers"].pop("1")}), "decimal"),
    "layer key arabic digit": (lambda ix: ix["layers"].update({"\u0663": ix["layers"].pop("3")}), "decimal"),
    "layer without format": (lambda ix: ix["layer_quant_formats"].pop("1"), "no entry in layer_quant_formats"),
    "format without layer": (lambda ix: ix["layer_quant_formats"].update({"7": {"name": "bf16"}}), "format but no banks"),
    "format not an object": (lambda ix: ix["layer_quant_formats"].update({"1": "bf16"}), "layer format"),
    "format options a list": (lambda ix: ix["layer_quant_formats"]["1"].update(options=[]), "options"),
    "shape a string": (lambda ix: _bank("1", "down")(ix).update(shape="4,64,32"), "shape must be a list"),
    "shape too many dims": (lambda ix: _bank("1", "down")(ix).update(shape=[1] * 9), "at most 8"),
    "shape negative": (lambda ix: _bank("1", "down")(ix).update(shape=[E, -H, -I]), "non-negative"),
    "shape float": (lambda ix: _bank("1", "down")(ix).update(shape=[E, H, 32.0]), "non-negative integer"),
    "shape bool": (lambda ix: _bank("1", "down")(ix).update(shape=[E, H, True]), "non-negative integer"),
    "bank shape empty": (lambda ix: _bank("3", "gate_up")(ix).update(shape=[], nbytes=1), "expert count"),
    "shape too large for any array": (
        lambda ix: ix["tensors"]["scalar"].update(shape=[1 << 40, 1 << 40, 0], nbytes=0), "too large"),
    "offset missing": (lambda ix: _bank("3", "down")(ix).pop("offset"), "offset"),
    "offset string": (lambda ix: _bank("3", "down")(ix).update(offset="4096"), "offset"),
    "offset negative": (lambda ix: _bank("3", "down")(ix).update(offset=-4096), "offset"),
    "offset bool": (lambda ix: ix["attachments"]["empty.txt"].update(offset=True), "offset"),
    "nbytes float": (lambda ix: ix["attachments"]["config.json"].update(nbytes=1.5), "nbytes"),
    "xxh3 short": (lambda ix: _bank("3", "down")(ix).update(xxh3="abc"), "xxh3"),
    "xxh3 not hex": (lambda ix: _bank("3", "down")(ix).update(xxh3="z" * 16), "xxh3"),
    "xxh3 upper case": (lambda ix: _bank("3", "down")(ix).update(xxh3="ABCDEF0123456789"), "xxh3"),
    "xxh3 0x prefix": (lambda ix: _bank("3", "down")(ix).update(xxh3="0x" + "0" * 14), "xxh3"),
    "xxh3 a number": (lambda ix: _bank("3", "down")(ix).update(xxh3=12345), "xxh3"),
    "unknown dtype": (lambda ix: _bank("3", "down")(ix).update(dtype="u4"), "unknown dtype 'u4'"),
    "dtype a list": (lambda ix: _bank("3", "down")(ix).update(dtype=["u8"]), "unknown dtype ['u8']"),
    "codec an object": (lambda ix: _bank("3", "down")(ix).update(codec={"raw": 1}), "unknown codec"),
    "bank descriptor a string": (lambda ix: ix["layers"]["3"]["banks"].update(down="raw"), "layers.3.banks.down"),
    "dtype missing": (lambda ix: ix["tensors"]["scalar"].pop("dtype"), "unknown dtype None"),
    "unknown codec": (lambda ix: _bank("3", "down")(ix).update(codec="lz4"), "unknown codec 'lz4'"),
    "codec missing": (lambda ix: _bank("3", "down")(ix).pop("codec"), "unknown codec None"),
    "compressed without row table": (lambda ix: _bank("3", "down")(ix).update(codec="zstd"), "row_table"),
    "tensor entry a list": (lambda ix: ix["tensors"].update(x=[]), "tensors.x"),
    "attachment not a blob": (lambda ix: ix["attachments"].update(x={"offset": 4096}), "attachments.x"),
}


@pytest.mark.parametrize("label", list(BAD_EDITS))
def test_malformed_index_is_refused_naming_the_field(sample, label):
    edit, match = BAD_EDITS[label]
    refused(sample, edited(sample, edit), FormatError, match)


def test_raw_bank_dtype_times_shape_must_match_bytes(sample):
    def grow(ix):
        _bank("3", "gate_up")(ix)["shape"] = [E, 2 * I, H // 2 + 1]

    refused(sample, edited(sample, grow), FormatError, "do not hold u8")
    refused(sample, edited(sample, lambda ix: _bank("3", "down")(ix).update(dtype="bf16")),
            FormatError, "do not hold bf16")
    refused(sample, edited(sample, lambda ix: ix["tensors"]["model.norm.weight"].update(shape=[H + 1])),
            FormatError, "tensors.model.norm.weight")
    refused(sample, edited(sample, lambda ix: ix["tensors"]["scalar"].update(dtype="f32")),
            FormatError, "do not hold f32")


def test_banks_of_a_layer_must_agree_on_expert_count(sample):
    def split(ix):  # same bytes (4-bit data stays raw), twice the experts: only the E check objects
        _bank("3", "gate_up")(ix)["shape"] = [2 * E, I, H // 2]

    refused(sample, edited(sample, split), FormatError, "disagree on the expert count")


def test_blob_offsets_out_of_file(sample):
    data = sample.read_bytes()
    idx_start = footer(data)["index_offset"]
    refused(sample, edited(sample, lambda ix: _bank("3", "down")(ix).update(offset=spec.align_up(len(data)))),
            FormatError, "outside the data area")
    refused(sample, edited(sample, lambda ix: _bank("3", "down")(ix).update(offset=1 << 62)),
            FormatError, "outside the data area")
    refused(sample, edited(sample, lambda ix: _bank("3", "down")(ix).update(offset=0)),
            FormatError, "outside the data area")

    def into_index(ix):  # the last blob grown over the start of the index
        last = max((d for _, d in blobs_of(ix)), key=lambda d: d["offset"])
        last["nbytes"] = idx_start - last["offset"] + 1
        last.pop("shape", None)

    err = refused(sample, edited(sample, into_index), FormatError)
    assert "outside the data area" in str(err) or "do not hold" in str(err)


def test_blob_offsets_unaligned(sample):
    refused(sample, edited(sample, lambda ix: _bank("3", "down")(ix).update(offset=_bank("3", "down")(ix)["offset"] + 8)),
            FormatError, "not 4096-aligned")


def test_overlapping_blobs(sample):
    def overlap(ix):
        a, b = _bank("3", "gate_up_scale")(ix), _bank("3", "down_scale")(ix)
        b["offset"] = a["offset"]  # same size class, both in range: only the overlap check objects
        b["xxh3"] = a["xxh3"]

    refused(sample, edited(sample, overlap), FormatError, "overlaps")

    def attachment_over_tensor(ix):
        t = ix["tensors"]["model.norm.weight"]
        ix["attachments"]["alias"] = {"offset": t["offset"], "nbytes": 1, "xxh3": "0" * 16}

    refused(sample, edited(sample, attachment_over_tensor), FormatError, "overlaps")


def test_zero_byte_blobs_may_share_offsets(sample):
    def alias(ix):
        t = ix["tensors"]["model.norm.weight"]
        ix["attachments"]["nothing"] = {"offset": t["offset"], "nbytes": 0, "xxh3": "2d06800538d394c2"}

    sample.write_bytes(edited(sample, alias))
    with ftw.open(sample) as f:
        assert f.attachment("nothing") == b""
        f.verify()


# -- compressed banks ---------------------------------------------------------------------


def _zbank(path):
    key, name, bank = _first_bank(index_of(path.read_bytes()), spec.ZSTD_BYTESPLIT)
    return int(key), name, bank


def _table(data: bytes, bank: dict) -> np.ndarray:
    t = bank["row_table"]
    return np.frombuffer(data, "<u8", t["nbytes"] // 8, t["offset"]).copy()


def _read_all_rows(path, layer, name):
    with ftw.open(path) as f:
        for e in range(f.layers[layer][name].num_experts):
            f.expert_row(layer, name, e)


def test_corrupt_zstd_frame_magic(zsample):
    layer, name, bank = _zbank(zsample)
    data = zsample.read_bytes()
    e = E - 1
    start = int(_table(data, bank)[e])
    zsample.write_bytes(patch_blob(data, bank, start, b"\0\0\0\0", reseal=True))
    with pytest.raises(FormatError) as info:
        _read_all_rows(zsample, layer, name)
    msg = str(info.value)
    assert str(zsample) in msg and f"layer {layer} bank {name} expert {e}" in msg, msg
    with ftw.open(zsample) as f:  # checksums were re-sealed: verify decodes every frame and refuses
        with pytest.raises(FormatError, match=f"layer {layer} bank {name} expert {e}: corrupt zstd frame header"):
            f.verify()
        with pytest.raises(FormatError):
            f.bank(layer, name)


def test_zstd_frame_of_the_wrong_size(zsample):
    layer, name, bank = _zbank(zsample)

    def shrink(ix):
        b = ix["layers"][str(layer)]["banks"][name]
        b["shape"] = [b["shape"][0], b["shape"][1] - 1, *b["shape"][2:]]

    zsample.write_bytes(edited(zsample, shrink))
    with pytest.raises(FormatError, match="zstd frame declares") as info:
        _read_all_rows(zsample, layer, name)
    assert str(zsample) in str(info.value)


def test_zstd_frame_cut_short_by_row_table(zsample):
    layer, name, bank = _zbank(zsample)
    data = zsample.read_bytes()
    table = _table(data, bank)
    table[1] -= 5  # frame 0 loses its tail; frame 1 gains it as a bad head
    zsample.write_bytes(patch_blob(data, bank["row_table"], 0, table.tobytes(), reseal=True))
    with ftw.open(zsample) as f:
        for e in (0, 1):
            with pytest.raises(FormatError, match=f"layer {layer} bank {name} expert {e}"):
                f.expert_row(layer, name, e)


@pytest.mark.parametrize("how", ["first not 0", "last not nbytes", "decreasing", "beyond blob"])
def test_bad_row_table(zsample, how):
    layer, name, bank = _zbank(zsample)
    data = zsample.read_bytes()
    table = _table(data, bank)
    if how == "first not 0":
        table[0] = 1
    elif how == "last not nbytes":
        table[-1] -= 1
    elif how == "decreasing":
        table[1], table[2] = table[2], table[1]
    else:
        table[2] = bank["nbytes"] + 4096
    zsample.write_bytes(patch_blob(data, bank["row_table"], 0, table.tobytes(), reseal=True))
    for action in ("verify", "row", "bank"):
        with ftw.open(zsample) as f:
            with pytest.raises(FormatError, match="row table does not partition") as info:
                if action == "verify":
                    f.verify()
                elif action == "row":
                    f.expert_row(layer, name, 0)
                else:
                    f.bank(layer, name)
        assert str(zsample) in str(info.value) and f"layer {layer} bank {name}" in str(info.value)


def test_row_table_of_the_wrong_size(zsample):
    layer, name, _ = _zbank(zsample)
    refused(zsample, edited(zsample, lambda ix: ix["layers"][str(layer)]["banks"][name]["row_table"].update(
        nbytes=8 * E)), FormatError, "row table of")


def test_compressed_shape_beyond_zstd_ratio(zsample):
    layer, name, _ = _zbank(zsample)
    refused(zsample, edited(zsample, lambda ix: ix["layers"][str(layer)]["banks"][name].update(
        shape=[E, 1 << 20, 1 << 20])), FormatError, "cannot hold")


# -- reading what is not there, and files that are not files ------------------------------


def test_missing_names_are_ftw_errors_naming_the_file(sample):
    with ftw.open(sample) as f:
        for call in (lambda: f.bank(2, "gate_up"), lambda: f.bank(1, "nope"),
                     lambda: f.expert_row(1, "down", E), lambda: f.expert_row(1, "down", -1),
                     lambda: f.tensor("nope"), lambda: f.attachment("nope")):
            with pytest.raises(FtwError) as info:
                call()
            assert str(sample) in str(info.value)


def test_not_a_file(tmp_path):
    for path in (tmp_path, tmp_path / "missing.ftw"):
        with pytest.raises(FtwError, match=str(path)):
            ftw.open(path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(FormatError, match="not a regular file"):
        ftw.open(fifo)  # refused at once, not waited on
    small = tmp_path / "small.ftw"
    small.write_bytes(b"FTW\0" + bytes(100))
    with pytest.raises(FormatError, match="too small"):
        ftw.open(small)


def test_not_an_ftw_file(tmp_path, rng):
    p = tmp_path / "x.safetensors"
    p.write_bytes(rng.integers(0, 256, 10000, dtype=np.uint8).tobytes())
    with pytest.raises(FormatError, match="bad magic"):
        ftw.open(p)


def test_copy_of_valid_index_still_opens(sample):
    """Guard for the edits above: re-sealing an unchanged index gives a file that opens."""
    data = sample.read_bytes()
    sample.write_bytes(with_index(data, copy.deepcopy(index_of(data))))
    with ftw.open(sample) as f:
        f.verify()


def test_bytes_after_a_zstd_frame_are_refused(zsample):
    """A slot holds exactly one frame: zstd libraries would decode the first and drop the rest."""
    layer, name, bank = _zbank(zsample)
    data = zsample.read_bytes()
    table = _table(data, bank)
    table[1] = table[2]  # slot 0 now holds frames 0 and 1; slot 1 is empty
    zsample.write_bytes(patch_blob(data, bank["row_table"], 0, table.tobytes(), reseal=True))
    with ftw.open(zsample) as f:
        # checksums and the table's shape are fine; verify proves every frame (FORMAT.md rule 14)
        with pytest.raises(FormatError, match=f"expert 0: the row's .* bytes hold a .*-byte zstd frame"):
            f.verify()
        with pytest.raises(FormatError, match=f"expert 0: the row's .* bytes hold a .*-byte zstd frame"):
            f.expert_row(layer, name, 0)
        with pytest.raises(FormatError, match="expert 1: corrupt zstd frame header"):
            f.expert_row(layer, name, 1)


def test_skippable_zstd_frame_is_not_a_row(zsample):
    layer, name, bank = _zbank(zsample)
    data = zsample.read_bytes()
    start = int(_table(data, bank)[0])
    zsample.write_bytes(patch_blob(data, bank, start, b"\x50\x2a\x4d\x18", reseal=True))
    with ftw.open(zsample) as f:
        with pytest.raises(FormatError, match="expert 0: corrupt zstd frame header"):
            f.expert_row(layer, name, 0)
