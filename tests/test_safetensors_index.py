"""The shard index: exact dtypes, zero-copy views, bounded and checked headers, counted reads."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from ftw.errors import SourceError, UnsupportedError
from ftw.readers.safetensors_index import MAX_HEADER_NBYTES, SafetensorsIndex
from st_build import rand_bf16, save, save_sharded


def test_views_match_library_written_file(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    src = {
        "bf16": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        "f16": torch.randn(4, generator=g).to(torch.float16),
        "f32": torch.randn(2, 3, generator=g),
        "f64": torch.randn(2, generator=g).to(torch.float64),
        "f8_e4m3": torch.randn(4, 4, generator=g).to(torch.float8_e4m3fn),
        "f8_e5m2": torch.randn(4, generator=g).to(torch.float8_e5m2),
        "e8m0": torch.randint(0, 255, (6,), dtype=torch.uint8, generator=g).view(torch.float8_e8m0fnu),
        "i8": torch.randint(-128, 127, (5,), dtype=torch.int8, generator=g),
        "u8": torch.randint(0, 255, (5,), dtype=torch.uint8, generator=g),
        "i32": torch.randint(-9, 9, (3,), dtype=torch.int32, generator=g),
        "u32": torch.randint(0, 9, (3,), dtype=torch.int32, generator=g).to(torch.uint32),
        "i64": torch.randint(-9, 9, (3,), dtype=torch.int64, generator=g),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(1.5),
        "empty": torch.zeros(0, 4),
    }
    save_file(src, str(tmp_path / "model.safetensors"))
    idx = SafetensorsIndex(tmp_path)
    for name, t in src.items():
        info = idx.info(name)
        want = {"scalar": "f32", "empty": "f32"}.get(name, name)
        assert info.dtype == want
        a = idx.array(name)
        assert a.shape == tuple(t.shape)
        assert a.tobytes() == t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
    idx.close()


def test_zero_copy_and_counting(tmp_path):
    rng = np.random.default_rng()
    a, b = rand_bf16(rng, (64, 64)), rand_bf16(rng, (32,))
    save(tmp_path / "model.safetensors", {"a": ("BF16", a), "b": ("BF16", b)})
    idx = SafetensorsIndex(tmp_path)
    seen = []
    idx.on_read.append(lambda info: seen.append(info.name))
    v = idx.array("a")
    assert not v.flags.writeable and not v.flags.owndata
    assert idx.array("a") is v  # one view per tensor: counted once
    np.testing.assert_array_equal(v, a)
    assert idx.bytes_read == a.nbytes and idx.touched == {"a"} and seen == ["a"]
    idx.array("b")
    assert idx.bytes_read == a.nbytes + b.nbytes
    del v
    idx.close()


def test_glob_without_index_and_duplicates(tmp_path):
    rng = np.random.default_rng()
    save(tmp_path / "a.safetensors", {"x": ("BF16", rand_bf16(rng, (4,)))})
    save(tmp_path / "b.safetensors", {"y": ("BF16", rand_bf16(rng, (4,)))})
    assert sorted(SafetensorsIndex(tmp_path).names()) == ["x", "y"]
    save(tmp_path / "c.safetensors", {"x": ("BF16", rand_bf16(rng, (4,)))})
    with pytest.raises(SourceError, match=r"'x' appears in two shards: .*a.safetensors and .*c.safetensors"):
        SafetensorsIndex(tmp_path)


def test_index_errors(tmp_path):
    rng = np.random.default_rng()
    t = {f"t{i}": ("BF16", rand_bf16(rng, (8,))) for i in range(4)}
    files = save_sharded(tmp_path, t, 2)
    idx = SafetensorsIndex(tmp_path)
    assert idx.shards == [str(tmp_path / f) for f in files]
    os.remove(tmp_path / files[1])
    with pytest.raises(SourceError, match=r"names shard 'model-00002-of-00002.safetensors' \(for tensor 't2'\)"):
        SafetensorsIndex(tmp_path)
    save(tmp_path / files[1], {"t2": t["t2"]})
    with pytest.raises(SourceError, match=r"tensor 't3' is not in shard"):
        SafetensorsIndex(tmp_path)
    with open(tmp_path / "model.safetensors.index.json", "w") as f:
        json.dump({"weight_map": {"t0": "../evil.safetensors"}}, f)
    with pytest.raises(SourceError, match="not a plain file name"):
        SafetensorsIndex(tmp_path)


def _raw(path, header: dict | bytes, data: bytes = b"", length: int | None = None):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(h) if length is None else length
    with open(path, "wb") as f:
        f.write(n.to_bytes(8, "little") + h + data)


@pytest.mark.parametrize(
    "header,data,length,err,match",
    [
        ({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}, b"\0" * 7, None, SourceError,
         r"'w': truncated shard: data ends at byte \d+, file has \d+"),
        ({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 6]}}, b"\0" * 6, None, SourceError,
         r"'w': BF16 x \[4\] needs 8 bytes, data_offsets give 6"),
        ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, None, SourceError, "shape"),
        ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4, None, SourceError, "data_offsets"),
        (b"{not json", b"", None, SourceError, "not valid JSON"),
        (b"[]", b"", None, SourceError, "JSON object"),
        (b"{}", b"", 1 << 40, SourceError, "header claims"),
        (b"{}", b"", MAX_HEADER_NBYTES + 1, SourceError, r"limit"),
    ],
)
def test_bad_headers(tmp_path, header, data, length, err, match):
    _raw(tmp_path / "model.safetensors", header, data, length)
    with pytest.raises(err, match=match):
        SafetensorsIndex(tmp_path)


def test_truncated_short_file(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\1\2\3")
    with pytest.raises(SourceError, match="truncated shard"):
        SafetensorsIndex(tmp_path)


def test_unknown_dtype_named_on_use(tmp_path):
    hdr = {"odd": {"dtype": "F4", "shape": [4], "data_offsets": [0, 2]},
           "ok": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}}
    _raw(tmp_path / "model.safetensors", hdr, b"\1\2\3\4")
    idx = SafetensorsIndex(tmp_path)
    assert idx.array("ok").tolist() == [3, 4]
    with pytest.raises(UnsupportedError, match=r"model.safetensors: tensor 'odd' has dtype 'F4'"):
        idx.array("odd")
    with pytest.raises(SourceError, match="no tensor 'nope'"):
        idx.info("nope")


def test_shard_changed_after_open(tmp_path):
    rng = np.random.default_rng()
    save(tmp_path / "model.safetensors", {"w": ("BF16", rand_bf16(rng, (64,)))})
    idx = SafetensorsIndex(tmp_path)
    with open(tmp_path / "model.safetensors", "r+b") as f:
        f.truncate(40)
    with pytest.raises(SourceError, match="changed size"):
        idx.array("w")


def test_no_shards(tmp_path):
    with pytest.raises(SourceError, match="no \\*.safetensors"):
        SafetensorsIndex(tmp_path)


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ftw.errors import FtwError  # noqa: E402

_entry = st.fixed_dictionaries({
    "dtype": st.one_of(st.sampled_from(["BF16", "F32", "U8", "F8_E8M0", "F4", "C64"]), st.integers(), st.none()),
    "shape": st.one_of(st.lists(st.integers(-2, 6), max_size=3), st.text(max_size=2)),
    "data_offsets": st.one_of(st.lists(st.integers(-4, 80), min_size=0, max_size=3), st.none()),
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.dictionaries(st.text(min_size=1, max_size=4), _entry, max_size=4), data=st.binary(max_size=64),
       junk=st.booleans())
def test_fuzzed_headers_fail_cleanly(tmp_path, header, data, junk):
    """Whatever a stranger's header says, the index either opens and serves it or raises an FtwError."""
    h = os.urandom(12) if junk else json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(len(h).to_bytes(8, "little") + h + data)
    try:
        idx = SafetensorsIndex(tmp_path)
    except FtwError:
        return
    for n in idx.names():
        try:
            a = idx.array(n)
            assert a.nbytes == idx.info(n).nbytes
        except FtwError:
            pass
    idx.close()


def test_release_pages_keeps_views_valid(tmp_path):
    rng = np.random.default_rng()
    a = rand_bf16(rng, (512, 512))  # large enough to be populated in one madvise
    save(tmp_path / "model.safetensors", {"a": ("BF16", a)})
    idx = SafetensorsIndex(tmp_path)
    v = idx.array("a")
    np.testing.assert_array_equal(v, a)
    idx.release_pages()
    np.testing.assert_array_equal(v, a)
    assert idx.array("a") is v and idx.bytes_read == a.nbytes
    del v
    idx.close()
