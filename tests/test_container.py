"""Round trips through FtwWriter and ftw.open: every byte written comes back, aligned."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xxhash

import ftw
from ftw import spec
from ftw.banks import BankSource, LayerBanks
from ftw.formats import LayerFormat
from ftw.writers import FtwWriter

from helpers_container import E, footer, index_of, rng, with_index, write_sample  # noqa: F401 (rng: fixture)


@pytest.fixture(params=[None, 3], ids=["raw", "zstd3"])
def sample(request, tmp_path, rng):
    path = tmp_path / "model.ftw"
    exp = write_sample(path, rng, level=request.param)
    return path, exp, request.param


def test_banks_round_trip(sample):
    path, exp, _ = sample
    with ftw.open(path) as f:
        assert set(f.layers) == {layer for layer, _ in exp.banks}
        for (layer, name), want in exp.banks.items():
            got = f.bank(layer, name)
            info = f.layers[layer][name]
            assert got.shape == want.shape == info.shape
            assert got.dtype == spec.numpy_dtype(info.dtype)
            assert got.tobytes() == want.tobytes(), (layer, name)


def test_expert_row_is_bank_row(sample):
    path, exp, _ = sample
    with ftw.open(path) as f:
        for (layer, name), want in exp.banks.items():
            bank = f.bank(layer, name)
            for e in range(E):
                row = f.expert_row(layer, name, e)
                assert row.shape == want.shape[1:]
                assert row.tobytes() == bank[e].tobytes() == want[e].tobytes(), (layer, name, e)
                out = np.empty(want.shape[1:], bank.dtype)
                f.read_row_into(f.layers[layer][name], e, out)
                assert out.tobytes() == want[e].tobytes()


def test_raw_banks_are_zero_copy_views_of_the_map(sample):
    path, exp, level = sample
    with ftw.open(path) as f:
        for (layer, name), _ in exp.banks.items():
            info = f.layers[layer][name]
            if info.codec != spec.RAW:
                continue
            a = f.bank(layer, name)
            assert not a.flags.writeable and not a.flags.owndata
            row = f.expert_row(layer, name, E - 1)
            assert not row.flags.owndata
            del a, row


def test_codecs_chosen_by_content(tmp_path, rng):
    """bf16 of random normal floats compresses with the byte-plane split; random 4-bit bytes
    do not compress and stay raw."""
    exp = write_sample(tmp_path / "z.ftw", rng, level=3)
    with ftw.open(tmp_path / "z.ftw") as f:
        for (layer, name), _ in exp.banks.items():
            info = f.layers[layer][name]
            if info.dtype == "bf16" and info.row_nbytes >= 4096:  # a 128-byte bias row may not pay
                assert info.codec == spec.ZSTD_BYTESPLIT, (layer, name)
                assert info.blob.nbytes < info.raw_nbytes
                assert info.row_table is not None and info.row_table.nbytes == 8 * (E + 1)
            elif name in ("gate_up", "down") and info.dtype == "u8":
                assert info.codec == spec.RAW, (layer, name)
                assert info.row_table is None and info.blob.nbytes == info.raw_nbytes


def test_compressed_rows_are_independent_frames(tmp_path, rng):
    import zstandard

    exp = write_sample(tmp_path / "z.ftw", rng, level=3)
    with ftw.open(tmp_path / "z.ftw") as f:
        info = f.layers[1]["gate_up"]
        table = np.frombuffer(f.mm, "<u8", E + 1, info.row_table.offset)
        assert table[0] == 0 and table[-1] == info.blob.nbytes
        for e in range(E):
            frame = bytes(f.row_frame(info, e))
            assert zstandard.frame_content_size(frame) == info.row_nbytes
            planes = zstandard.ZstdDecompressor().decompress(frame)
            # plane 0 holds every item's low byte, plane 1 every high byte
            want = exp.banks[(1, "gate_up")][e].reshape(-1)
            half = len(planes) // 2
            assert planes[:half] == (want & 0xFF).astype(np.uint8).tobytes()
            assert planes[half:] == (want >> 8).astype(np.uint8).tobytes()


def test_tensors_attachments_model_provenance(sample):
    path, exp, _ = sample
    with ftw.open(path) as f:
        assert set(f.tensors) == set(exp.tensors)
        for name, want in exp.tensors.items():
            got = f.tensor(name)
            assert got.shape == want.shape and got.tobytes() == want.tobytes(), name
            assert f.tensors[name].meta == exp.tensor_meta[name]
        assert set(f.attachments) == set(exp.attachments)
        for name, want in exp.attachments.items():
            assert f.attachment(name) == want
        assert f.model == exp.model
        assert f.layer_formats == exp.formats
        assert f.provenance["reader"] == "tests"
        assert f.version == (spec.MAJOR, spec.MINOR)


def test_every_blob_aligned_and_disjoint(sample):
    path, _, _ = sample
    with ftw.open(path) as f:
        extents = sorted((b.offset, b.offset + b.nbytes) for _, b in f.blobs())
        for start, end in extents:
            assert start % spec.ALIGNMENT == 0 and start >= spec.ALIGNMENT
        for (_, e0), (s1, _) in zip(extents, extents[1:]):
            assert e0 <= s1
        index_start = footer(path.read_bytes())["index_offset"]
        assert extents[-1][1] <= index_start


def test_index_lists_what_was_written(sample):
    path, exp, level = sample
    data = path.read_bytes()
    index = index_of(data)
    f = footer(data)
    assert f["index_offset"] + f["index_nbytes"] + spec.FOOTER.size == len(data)
    assert data[:4] == spec.PREAMBLE_MAGIC and f["magic"] == spec.FOOTER_MAGIC
    assert index["model"] == exp.model.to_json()
    assert index["layer_quant_formats"] == {str(k): v.to_json() for k, v in exp.formats.items()}
    for (layer, name), arr in exp.banks.items():
        bank = index["layers"][str(layer)]["banks"][name]
        assert bank["shape"] == list(arr.shape)
        assert bank["codec"] in spec.CODECS
        stored = data[bank["offset"] : bank["offset"] + bank["nbytes"]]
        assert xxhash.xxh3_64_hexdigest(stored) == bank["xxh3"]
        if bank["codec"] == spec.RAW:
            assert stored == arr.tobytes()
    for name, arr in exp.tensors.items():
        t = index["tensors"][name]
        assert t["shape"] == list(arr.shape)
        assert data[t["offset"] : t["offset"] + t["nbytes"]] == arr.tobytes()
        assert t.get("meta", {}) == exp.tensor_meta[name]
    for name, want in exp.attachments.items():
        a = index["attachments"][name]
        assert data[a["offset"] : a["offset"] + a["nbytes"]] == want
    json.dumps(index)  # plain JSON all the way down


def test_verify_counts_every_byte_and_reports_progress(sample):
    path, _, _ = sample
    seen = []
    with ftw.open(path) as f:
        total = f.verify(threads=2, progress=seen.append)
        assert total == sum(b.nbytes for _, b in f.blobs())
        assert sum(seen) == total


def test_open_reads_only_preamble_footer_index(sample, monkeypatch):
    path, _, _ = sample
    import os

    reads = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, off: reads.append((n, off)) or real(fd, n, off))
    with ftw.open(path) as f:
        size = f.size
    assert len(reads) == 3
    assert reads[0] == (spec.PREAMBLE.size, 0)
    assert reads[1] == (spec.FOOTER.size, size - spec.FOOTER.size)
    assert reads[2][1] + reads[2][0] == size - spec.FOOTER.size


def test_empty_container_opens(tmp_path):
    with FtwWriter(tmp_path / "empty.ftw"):
        pass
    with ftw.open(tmp_path / "empty.ftw") as f:
        assert f.layers == {} and f.tensors == {} and f.model is None
        assert f.verify() == 0


def test_zero_row_banks_and_zero_experts(tmp_path, rng):
    """[E, 0] placeholders and an E=0 bank are legal and round-trip, raw and compressed."""
    for level in (None, 1):
        path = tmp_path / f"z{level}.ftw"
        with FtwWriter(path, compress_level=level) as w:
            empty = BankSource("bf16", (0,), 5, lambda e: [np.empty(0, np.uint16)])
            data = rng.integers(0, 3, (5, 300), dtype=np.uint8)
            full = BankSource("u8", (300,), 5, lambda e: [data[e]])
            # a format this ftw does not know (a newer writer's): the container carries its
            # banks as bytes, and verify checks them without a format to compare them with
            opaque = LayerFormat("x_future_format")
            w.add_layer(LayerBanks(0, opaque, {"gate_up": full, "down": empty}))
            w.add_layer(LayerBanks(2, opaque, {"gate_up": BankSource("u8", (7,), 0, None)}))
        with ftw.open(path) as f:
            assert f.bank(0, "down").shape == (5, 0)
            assert f.expert_row(0, "down", 4).shape == (0,)
            assert f.bank(0, "gate_up").tobytes() == data.tobytes()
            assert f.bank(2, "gate_up").shape == (0, 7)
            f.verify()


def test_unknown_keys_and_minor_versions_are_ignored(tmp_path, rng):
    path = tmp_path / "m.ftw"
    exp = write_sample(path, rng)
    data = path.read_bytes()
    index = index_of(data)
    index["future_key"] = {"anything": [1, 2]}
    index["layers"]["1"]["future"] = 1
    index["layers"]["1"]["banks"]["down"]["future"] = "x"
    index["tensors"]["model.norm.weight"]["future"] = None
    index["layer_quant_formats"]["3"] = {"name": "nvfp9", "options": {"new": True}}
    data = with_index(data, index, minor=spec.MINOR + 7)
    data = data[:6] + (spec.MINOR + 7).to_bytes(2, "little") + data[8:]
    path.write_bytes(data)
    with ftw.open(path) as f:
        assert f.version == (spec.MAJOR, spec.MINOR + 7)
        assert f.layer_formats[3].name == "nvfp9"  # a newer writer's format still opens
        assert f.bank(1, "down").tobytes() == exp.banks[(1, "down")].tobytes()
        f.verify()


def test_threads_and_pieces_do_not_change_bytes(tmp_path, rng):
    arr = rng.integers(0, 4, (6, 3000), dtype=np.uint8)  # small alphabet: compresses
    paths = []
    for threads in (1, 3):
        p = tmp_path / f"t{threads}.ftw"
        with FtwWriter(p, compress_level=3, threads=threads) as w:
            w.add_layer(LayerBanks(0, LayerFormat.of("bf16"), {
                "gate_up": BankSource("u8", (3000,), 6, lambda e: [arr[e, :1000], arr[e, 1000:]]),
            }))
        paths.append(p)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    with ftw.open(paths[0]) as f:
        assert f.layers[0]["gate_up"].codec == spec.ZSTD
        assert f.bank(0, "gate_up").tobytes() == arr.tobytes()
