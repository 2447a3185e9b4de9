"""Issue 9, sections 2, 4 and 5, on the container side: verify proves every zstd frame, the
index is strict JSON, the v1.1 limits fail fast naming themselves, a closed file and bad
thread counts are FtwErrors, and a compressed row decodes straight into its destination.

Files are built byte by byte here (preamble, blobs, index, sealed footer), not with the
writer, so a test can put in any frame the writer would never produce.
"""

from __future__ import annotations

import json
import os
import time
import tracemalloc

import numpy as np
import pytest
import xxhash
import zstandard

import ftw
from ftw import spec
from ftw.errors import FormatError, FtwError

FORMAT = {"name": "robust_test", "options": {}}  # unknown to ftw: only the container is exercised


def build(path, banks: dict, *, tensors: dict | None = None, index_extra: dict | None = None,
          layers_override: dict | None = None) -> None:
    """banks: {(layer, name): (dtype, shape, rows)}, rows = list of stored row bytes (frames),
    or one bytes object for a raw bank. Each blob at the next 4096 boundary."""
    body = bytearray(spec.PREAMBLE.pack(spec.PREAMBLE_MAGIC, spec.MAJOR, spec.MINOR))

    def blob(data: bytes) -> dict:
        body.extend(bytes(spec.align_up(len(body)) - len(body)))
        off = len(body)
        body.extend(data)
        return {"offset": off, "nbytes": len(data), "xxh3": xxhash.xxh3_64_hexdigest(data)}

    layers, formats = {}, {}
    for (layer, name), (dtype, shape, rows) in banks.items():
        d = {"dtype": dtype, "shape": list(shape)}
        if isinstance(rows, bytes):
            d.update(codec="raw", **blob(rows))
        else:
            table = np.zeros(len(rows) + 1, "<u8")
            table[1:] = np.cumsum([len(r) for r in rows])
            d.update(codec="zstd", **blob(b"".join(rows)), row_table=blob(table.tobytes()))
        layers.setdefault(str(layer), {"banks": {}})["banks"][name] = d
        formats[str(layer)] = FORMAT
    index = {"model": None, "layer_quant_formats": formats, "layers": layers_override or layers,
             "tensors": {n: {"dtype": dt, "shape": list(a.shape), **blob(a.tobytes())}
                         for n, (dt, a) in (tensors or {}).items()},
             "attachments": {}, "provenance": {}}
    index.update(index_extra or {})
    write_index(path, bytes(body), json.dumps(index).encode())


def write_index(path, body: bytes, raw: bytes) -> None:
    body = body + bytes(spec.align_up(len(body)) - len(body))
    offset = len(body)
    footer = spec.FOOTER.pack(spec.FOOTER_MAGIC, spec.MAJOR, spec.MINOR, 0, offset, len(raw),
                              xxhash.xxh3_64_intdigest(raw), 0)[:-8]
    with open(path, "wb") as f:
        f.write(body + raw + footer + xxhash.xxh3_64_intdigest(footer).to_bytes(8, "little"))


def frame(data: bytes, **kw) -> bytes:
    return zstandard.ZstdCompressor(level=3, **kw).compress(data)


@pytest.fixture
def rows(rng):
    """Three 4 KiB rows of compressible but random data (fresh every run)."""
    return [bytes(rng.integers(0, 4, 4096, dtype=np.uint8)) for _ in range(3)]


@pytest.fixture
def rng():
    seed = int.from_bytes(os.urandom(8), "little")
    print(f"seed {seed}")
    return np.random.default_rng(seed)


def good_frames(rows):
    return [frame(r, write_content_size=True) for r in rows]


# -- section 4: verify decodes every frame -------------------------------------------------


def test_verify_accepts_honest_frames_and_they_decode_to_the_source(tmp_path, rows):
    p = tmp_path / "ok.ftw"
    build(p, {(0, "gate_up"): ("u8", (3, 4096), good_frames(rows))})
    with ftw.open(p) as f:
        assert f.verify() > 0
        for e, r in enumerate(rows):
            assert f.expert_row(0, "gate_up", e).tobytes() == r


def _bad(rows, e, bad_frame):
    frames = good_frames(rows)
    frames[e] = bad_frame
    return frames


@pytest.mark.parametrize("case", ["skippable", "no_content_size", "wrong_size", "undecodable", "two_frames",
                                  "checksum"])
def test_verify_refuses_every_bad_frame_naming_the_row(tmp_path, rows, case):
    """FORMAT.md rule 14: each of these passes the checksums (the blob is sealed as it is)."""
    r = rows[1]
    good = frame(r, write_content_size=True)
    bad = {
        "skippable": b"\x50\x2a\x4d\x18" + len(r).to_bytes(4, "little") + r,
        "no_content_size": frame(r, write_content_size=False),
        "wrong_size": _declared(r, len(r) + 1),
        "undecodable": good[:-8] + bytes(b ^ 0x5A for b in good[-8:]),
        "two_frames": good + good,
        "checksum": _bad_checksum(r),
    }[case]
    p = tmp_path / f"{case}.ftw"
    build(p, {(0, "gate_up"): ("u8", (3, 4096), _bad(rows, 1, bad))})
    with ftw.open(p) as f:
        with pytest.raises(FormatError) as info:
            f.verify()
    msg = str(info.value)
    assert str(p) in msg and "layer 0 bank gate_up expert 1" in msg, msg


def _declared(r: bytes, size: int) -> bytes:
    """A frame of r whose header claims `size` bytes (the frame content size field patched)."""
    f = bytearray(frame(r, write_content_size=True))
    fhd = f[4]  # frame header descriptor: content size field width, single segment flag
    fcs_bytes = {0: 1 if fhd & 0x20 else 0, 1: 2, 2: 4, 3: 8}[fhd >> 6]
    start = 5 + (0 if fhd & 0x20 else 1)  # window descriptor unless single segment
    value = size - 256 if fcs_bytes == 2 else size
    f[start : start + fcs_bytes] = value.to_bytes(fcs_bytes, "little")
    assert zstandard.frame_content_size(bytes(f)) == size
    return bytes(f)


def _bad_checksum(r: bytes) -> bytes:
    f = bytearray(frame(r, write_content_size=True, write_checksum=True))
    f[-1] ^= 0xFF
    return bytes(f)


def test_verify_checks_frames_on_several_threads_and_names_the_first_bad_row(tmp_path, rng):
    big = [bytes(rng.integers(0, 2, 1 << 16, dtype=np.uint8)) for _ in range(40)]
    frames = [frame(r, write_content_size=True) for r in big]
    frames[37] = _declared(big[37], (1 << 16) - 1)
    p = tmp_path / "many.ftw"
    build(p, {(2, "down"): ("u8", (40, 1 << 16), frames)})
    with ftw.open(p) as f:
        with pytest.raises(FormatError, match="layer 2 bank down expert 37: zstd frame declares 65535 bytes"):
            f.verify(threads=3)


# -- section 4: the index is strict JSON ----------------------------------------------------


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_index_with_nan_is_refused(tmp_path, rows, token):
    p = tmp_path / "nan.ftw"
    build(p, {(0, "gate_up"): ("u8", (3, 4096), good_frames(rows))})
    data = p.read_bytes()
    f = dict(zip(("magic", "major", "minor", "flags", "off", "n", "h", "fh"), spec.FOOTER.unpack(data[-64:])))
    index = json.loads(data[f["off"] : f["off"] + f["n"]])
    index["provenance"] = {"limit": float("nan")}
    raw = json.dumps(index).replace("NaN", token).encode()
    write_index(p, data[: f["off"]], raw)
    with pytest.raises(FormatError, match=f"{token.lstrip('-')} is not JSON"):
        ftw.open(p)


# -- section 5: limits (FORMAT.md 1.1), failing fast ---------------------------------------


def test_layer_index_past_the_limit_is_refused(tmp_path, rows):
    p = tmp_path / "far.ftw"
    build(p, {(spec.MAX_LAYERS, "gate_up"): ("u8", (3, 4096), good_frames(rows))})
    with pytest.raises(FormatError, match=f"layers.{spec.MAX_LAYERS}: layer index .* limit"):
        ftw.open(p)
    build(p, {(spec.MAX_LAYERS - 1, "gate_up"): ("u8", (3, 4096), good_frames(rows))})
    with ftw.open(p) as f:
        assert list(f.layers) == [spec.MAX_LAYERS - 1]


def test_too_many_layers_fail_before_any_is_parsed(tmp_path):
    """300,000 layers once took inspect 204 s; now the count alone refuses them."""
    n = 300_000
    p = tmp_path / "wide.ftw"
    layers = {str(i): {"banks": {}} for i in range(n)}
    build(p, {}, index_extra={"layer_quant_formats": {k: FORMAT for k in layers}}, layers_override=layers)
    t = time.perf_counter()
    with pytest.raises(FormatError, match=f"{n} layers, past the format's limit of {spec.MAX_LAYERS}"):
        ftw.open(p)
    assert time.perf_counter() - t < 30  # a bound against minutes, not a timing measurement


def test_expert_count_past_the_limit_is_refused(tmp_path):
    p = tmp_path / "e.ftw"
    n = spec.MAX_EXPERTS + 1
    build(p, {(0, "gate_up"): ("u8", (n, 1), bytes(n))})
    with pytest.raises(FormatError, match=f"{n} experts, past the format's limit"):
        ftw.open(p)


def test_shape_with_more_than_eight_dims_is_refused(tmp_path):
    p = tmp_path / "d.ftw"
    build(p, {}, tensors={"t": ("u8", np.zeros((1,) * 9, np.uint8))})
    with pytest.raises(FormatError, match="at most 8 dimensions"):
        ftw.open(p)


# -- section 2: API after close(), thread counts ---------------------------------------------


def test_every_call_on_a_closed_file_is_an_ftw_error(tmp_path, rows):
    p = tmp_path / "c.ftw"
    build(p, {(0, "gate_up"): ("u8", (3, 4096), good_frames(rows)), (0, "down"): ("u8", (3, 8), bytes(24))},
          tensors={"t": ("f32", np.ones(4, np.float32))})
    f = ftw.open(p)
    f.close()
    calls = [lambda: f.expert_row(0, "gate_up", 0), lambda: f.expert_row(0, "down", 0), lambda: f.verify(),
             lambda: f.bank(0, "down"), lambda: f.tensor("t"), lambda: ftw.load_expert_banks(f)]
    for call in calls:
        with pytest.raises(FtwError, match="the file is closed"):
            call()


@pytest.mark.parametrize("threads", [-1, 0, 1.5, "2", True])
def test_bad_thread_counts_are_ftw_errors(tmp_path, rows, threads):
    p = tmp_path / "t.ftw"
    build(p, {(0, "gate_up"): ("u8", (3, 4096), good_frames(rows))})
    with ftw.open(p) as f:
        with pytest.raises(FtwError, match="threads must be an integer >= 1"):
            f.verify(threads=threads)
        with pytest.raises(FtwError, match="threads must be an integer >= 1"):
            ftw.load_expert_banks(f, threads=threads)


# -- section 5: a compressed row decodes into its destination --------------------------------


def test_compressed_row_decodes_into_the_destination_without_a_copy(tmp_path, rng):
    """The decoded row is written where it belongs: Python allocates nothing row-sized (the
    old path allocated the decoded bytes, then copied them: 2x the bank at peak)."""
    n = 4 << 20
    data = [bytes(rng.integers(0, 3, n, dtype=np.uint8)) for _ in range(2)]
    p = tmp_path / "big.ftw"
    build(p, {(0, "gate_up"): ("u8", (2, n), [frame(d, write_content_size=True) for d in data])})
    with ftw.open(p) as f:
        info = f.layers[0]["gate_up"]
        dst = np.empty((2, n), np.uint8)
        f.read_row_into(info, 0, dst[1])  # warm caches (row table) outside the measurement
        tracemalloc.start()
        try:
            for e in range(2):
                f.read_row_into(info, e, dst[e])
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < n // 8, peak
        assert dst[0].tobytes() == data[0] and dst[1].tobytes() == data[1]
        loaded = ftw.load_expert_banks(f, threads=2)
        assert loaded.banks["gate_up"][0].tobytes() == data[0] + data[1]


def test_load_of_banks_larger_than_memory_fails_fast(tmp_path, rng):
    """Legal-looking frames may declare more than the machine's memory (a bank may claim up to
    32768 times its stored bytes): load_expert_banks says so naming the file, before
    allocating anything (the frames are never decoded)."""
    phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    E = 64
    row = phys // E + (1 << 20)  # the E rows together: just over physical memory
    data = bytes(rng.integers(0, 256, 70_000, dtype=np.uint8))  # > 65791 bytes: a 4-byte size field
    big = _declared(data, row) if row < 1 << 32 else None
    if big is None:
        pytest.skip("rows of 4 GiB or more need an 8-byte size field")
    p = tmp_path / "huge.ftw"
    build(p, {(0, "down"): ("u8", (E, row), [big] * E)})
    with ftw.open(p) as f:  # within rule 11: 64 x 70 KB may claim up to 147 GB
        t = time.perf_counter()
        with pytest.raises(FtwError, match="the banks of 1 layer.* more than this machine's"):
            ftw.load_expert_banks(f)
        assert time.perf_counter() - t < 10


def test_verify_of_a_compressed_file_cut_short_is_a_format_error(tmp_path, rows):
    """Cut after open: the checksum and frame passes read with pread, so the result is a
    FormatError naming the file, never a SIGBUS (run in a child: a SIGBUS would kill pytest)."""
    import subprocess
    import sys

    p = tmp_path / "cut.ftw"
    build(p, {(0, "gate_up"): ("u8", (3, 4096), good_frames(rows)), (1, "down"): ("u8", (3, 4096), good_frames(rows))})
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = f"""
import os, sys
sys.path[:0] = [{root!r}]
import ftw
from ftw.errors import FormatError
f = ftw.open({str(p)!r})
os.truncate({str(p)!r}, 4096 + 100)
try:
    f.verify(threads=2)
except FormatError as e:
    print("FormatError", e)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("FormatError") and str(p) in r.stdout, (r.returncode, r.stdout, r.stderr)
