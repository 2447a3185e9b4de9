"""Property: whatever is done to a valid FTW file, opening it, verifying it and reading every
bank, row, tensor and attachment raise only FtwError subclasses, finish promptly, and never
touch bytes outside the file.

Mutations are byte-level (bit flips, overwrites, truncation, insertion, deletion) and
index-level (JSON edits), optionally re-sealed (index and footer checksums, and the blob
checksums in the index) so that damage also reaches the checks behind the checksums.
Derandomized with no example database, so CI runs the same cases every time.
"""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis.control import currently_in_test_context, event
from hypothesis import strategies as st

import ftw
from ftw import spec
from ftw.errors import FtwError

from helpers_container import footer, seal_footer, write_sample

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=timedelta(seconds=5),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
HARD_LIMIT_S = 20  # a hang is a failure, not a stuck CI job
ROWS_PER_BANK = 3


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """Valid files to mutate: one with raw banks, one with zstd banks. A fixed seed: the
    property holds for any data, and derandomized CI must replay the same bytes."""
    folder = tmp_path_factory.mktemp("fuzz")
    out = _Bases()
    for label, level in (("raw", None), ("zstd", 3)):
        path = folder / f"{label}.ftw"
        write_sample(path, np.random.default_rng(20261129), level=level, num_experts=3)
        out[label] = path.read_bytes()
    out["target"] = folder / "mutated.ftw"
    return out


class _Bases(dict):
    def __repr__(self) -> str:  # hypothesis prints fixtures of a failing case: not 100 KB of bytes
        return f"<base files {sorted(k for k in self if k != 'target')}>"


# -- the property ---------------------------------------------------------------------------


def _note(label: str) -> None:
    """Count outcomes (pytest --hypothesis-show-statistics) to see how deep mutations reach."""
    if currently_in_test_context():
        event(label)


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"no answer in {HARD_LIMIT_S} s")


def exercise(path) -> None:
    """Everything a user of a file can do with it; only FtwError may come out."""
    size = os.path.getsize(path)
    real_pread = os.pread

    def pread(fd, n, offset):
        assert 0 <= offset and offset + n <= size, f"pread({n}, {offset}) outside a {size}-byte file"
        return real_pread(fd, n, offset)

    os.pread = pread  # by hand: hypothesis reuses function-scoped fixtures across examples
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HARD_LIMIT_S)
    try:
        try:
            f = ftw.open(path)
        except FtwError as e:
            _note(f"open refused: {type(e).__name__}")
            return
        _note("opened")
        with f:
            _use(f, size)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        os.pread = real_pread


def _inside(f, a: np.ndarray, size: int) -> None:
    """A zero-copy array must lie within the file's map."""
    if a.size == 0 or a.flags.owndata:
        return
    base = np.frombuffer(f.mm, np.uint8)
    start = base.ctypes.data
    ptr = a.__array_interface__["data"][0]
    del base
    assert start <= ptr and ptr + a.nbytes <= start + size, "array outside the file's map"


def _attempt(fn, *args):
    try:
        return fn(*args)
    except FtwError as e:
        _note(f"{fn.__name__} refused: {type(e).__name__}")
        return None


def _use(f, size: int) -> None:
    _attempt(f.verify, 1)
    for layer, banks in list(f.layers.items()):
        for name, info in banks.items():
            bank = _attempt(f.bank, layer, name)
            if bank is not None:
                _inside(f, bank, size)
                del bank
            experts = set(range(min(info.num_experts, ROWS_PER_BANK))) | {info.num_experts - 1}
            for e in sorted(experts - {-1}):
                row = _attempt(f.expert_row, layer, name, e)
                if row is not None:
                    _inside(f, row, size)
                    del row
    for name in list(f.tensors):
        t = _attempt(f.tensor, name)
        if t is not None:
            _inside(f, t, size)
            del t
    for name in list(f.attachments):
        _attempt(f.attachment, name)


# -- re-sealing what can be re-sealed --------------------------------------------------------


def reseal_index(data: bytes) -> bytes:
    """Recompute the index and footer checksums where the footer still points at an index."""
    if len(data) < spec.FOOTER.size or data[-spec.FOOTER.size :][:8] != spec.FOOTER_MAGIC:
        return data
    f = footer(data)
    start, end = f["index_offset"], f["index_offset"] + f["index_nbytes"]
    if not (0 <= start <= end == len(data) - spec.FOOTER.size):
        return data
    f["index_xxh3"] = xxhash.xxh3_64_intdigest(data[start:end])
    return data[: -spec.FOOTER.size] + seal_footer(f)


def _blob_dicts(node):
    if isinstance(node, dict):
        if type(node.get("offset")) is int and type(node.get("nbytes")) is int and "xxh3" in node:
            yield node
        for v in node.values():
            yield from _blob_dicts(v)
    elif isinstance(node, list):
        for v in node:
            yield from _blob_dicts(v)


def replace_index(data: bytes, index) -> bytes:
    """data with a new index JSON, footer moved to follow it and re-sealed."""
    f = footer(data)
    raw = json.dumps(index).encode()
    f.update(index_nbytes=len(raw), index_xxh3=xxhash.xxh3_64_intdigest(raw))
    return data[: f["index_offset"]] + raw + seal_footer(f)


def reseal_blobs(data: bytes) -> bytes:
    """Make every in-range blob checksum in the index match the (damaged) bytes, so that
    decoders, not checksums, meet the damage."""
    try:
        f = footer(data)
        index = json.loads(data[f["index_offset"] : len(data) - spec.FOOTER.size])
    except (ValueError, UnicodeDecodeError, Exception):  # noqa: BLE001 - any unreadable index: leave it
        return data
    for d in _blob_dicts(index):
        if 0 <= d["offset"] <= d["offset"] + d["nbytes"] <= len(data):
            d["xxh3"] = xxhash.xxh3_64_hexdigest(data[d["offset"] : d["offset"] + d["nbytes"]])
    return replace_index(data, index)


# -- byte-level mutations -----------------------------------------------------------------


def _position(draw, data: bytes) -> int:
    """Positions biased to where structure lives: preamble, blob edges, index, footer."""
    n = len(data)
    if n == 0:
        return 0
    region = draw(st.sampled_from(["any", "any", "any", "head", "tail", "page"]))
    if region == "head":
        return draw(st.integers(0, min(n - 1, 80)))
    if region == "tail":
        return n - 1 - draw(st.integers(0, min(n - 1, 600)))
    if region == "page":  # around a 4 KiB boundary, where blobs start
        page = draw(st.integers(1, max(1, n // spec.ALIGNMENT)))
        return min(n - 1, max(0, page * spec.ALIGNMENT + draw(st.integers(-8, 24))))
    return draw(st.integers(0, n - 1))


@st.composite
def byte_mutation(draw, data: bytes) -> bytes:
    for _ in range(draw(st.integers(1, 4))):
        # flips and overwrites keep the layout, so more of them get past open to the data
        op = draw(st.sampled_from(["flip", "flip", "overwrite", "overwrite", "truncate", "insert", "delete"]))
        pos = _position(draw, data)
        if op == "flip" and data:
            data = data[:pos] + bytes([data[pos] ^ (1 << draw(st.integers(0, 7)))]) + data[pos + 1 :]
        elif op == "overwrite":
            new = draw(st.binary(min_size=1, max_size=16))
            data = data[:pos] + new + data[pos + len(new) :]
        elif op == "truncate":
            data = data[:pos]
        elif op == "insert":
            data = data[:pos] + draw(st.binary(min_size=1, max_size=64)) + data[pos:]
        else:
            data = data[:pos] + data[pos + draw(st.integers(1, 64)) :]
    seal = draw(st.sampled_from(["none", "index", "index+blobs"]))
    if seal == "index+blobs":
        data = reseal_blobs(data)
    if seal != "none":
        data = reseal_index(data)
    return data


@settings(FUZZ, max_examples=1200)
@given(data=st.data(), base=st.sampled_from(["raw", "zstd"]))
def test_byte_mutations_raise_only_ftw_errors(bases, data, base):
    mutated = data.draw(byte_mutation(bases[base]))
    bases["target"].write_bytes(mutated)
    exercise(bases["target"])


# -- index-level mutations ----------------------------------------------------------------

JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=20),
    st.integers(-(1 << 70), 1 << 70),
    st.sampled_from([0, 1, -1, 8, 4096, 4095, 1 << 20, 1 << 31, (1 << 63) - 1, 1 << 63, 1 << 64]),
    st.sampled_from(list(spec.DTYPES) + list(spec.CODECS) + ["u4", "", "zstd-", "RAW", "0" * 16, "f" * 16]),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=8,
)


def _slots(node, out):
    """Every (container, key) in the JSON tree: where a value can be replaced or removed."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        out.append((node, k))
        _slots(v, out)
    return out


@st.composite
def index_mutation(draw, data: bytes) -> bytes:
    f = footer(data)
    index = json.loads(data[f["index_offset"] : len(data) - spec.FOOTER.size])
    for _ in range(draw(st.integers(1, 3))):
        slots = _slots(index, [])
        node, key = slots[draw(st.integers(0, len(slots) - 1))]
        old = node[key]
        op = draw(st.sampled_from(["replace", "nudge", "delete", "copy", "add"]))
        if op == "nudge" and type(old) is int:
            node[key] = old + draw(st.sampled_from([-4096, -8, -1, 1, 8, 4096, old, -old, 1 << 40]))
        elif op == "delete":
            del node[key]
        elif op == "copy":  # another slot's value: another blob's offset makes overlaps
            other, okey = slots[draw(st.integers(0, len(slots) - 1))]
            node[key] = json.loads(json.dumps(other[okey]))
        elif op == "add" and isinstance(old, dict):
            old[draw(st.text(max_size=8))] = draw(JSON_VALUES)
        else:
            node[key] = draw(JSON_VALUES)
    data = replace_index(data, index)
    if draw(st.booleans()):
        data = reseal_blobs(data)
    return data


@settings(FUZZ, max_examples=1000)
@given(data=st.data(), base=st.sampled_from(["raw", "zstd"]))
def test_index_mutations_raise_only_ftw_errors(bases, data, base):
    mutated = data.draw(index_mutation(bases[base]))
    bases["target"].write_bytes(mutated)
    exercise(bases["target"])


def test_unmutated_bases_pass_the_property(bases):
    """Guard: the property is not vacuous, the bases open and read fully."""
    for label in ("raw", "zstd"):
        bases["target"].write_bytes(bases[label])
        with ftw.open(bases["target"]) as f:
            assert f.layers and f.verify(1) > 0
        exercise(bases["target"])
