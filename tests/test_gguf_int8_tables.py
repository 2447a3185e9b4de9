"""The int8 lookup tables gen_tables.py writes for the CUDA decoders, checked on the CPU against the
gguf package's levels through a model of the device code that reads them (no GPU needed).

nibbles_u8 (csrc/formats/gguf/decoders.cuh) splits a word of 8 nibble codes into two words of 4
bytes: per 16-bit half c, lo = prmt(L0, L1, c), hi = prmt(H0, H1, c ^ 0x8888), then
hi + 0x80808080 - lo (LoNegative). prmt's selector nibble picks byte n & 7 of the 8 table bytes, or
with bit 3 set that byte's bit 7 in all 8 bits (sign mode). T = 1's int8 units take the tables
iq4nl_i8_* (magnitudes: bytes 128 + level, u8); the int8 units of several tokens take iq4nl_s8_*
(every byte with bit 7 set: the levels themselves, s8).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")
from gguf import quants  # noqa: E402

GEN = Path(__file__).resolve().parents[1] / "csrc" / "formats" / "gguf" / "gen_tables.py"


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    out = tmp_path_factory.mktemp("tables") / "ggml_tables.h"
    subprocess.run([sys.executable, str(GEN), str(out)], check=True)
    text = out.read_text()
    words = {m[0]: int(m[1], 16) for m in re.findall(r"constexpr uint32_t (\w+) = 0x([0-9A-F]{8})u;", text)}
    flags = {m[0]: m[1] == "true" for m in re.findall(r"constexpr bool (\w+) = (true|false);", text)}
    return words, flags


def prmt(a: np.ndarray, b: int, c: np.ndarray) -> np.ndarray:
    """PTX prmt.b32 (default mode) of the constant table words a, b by selectors c (uint32 arrays)."""
    src = np.array([(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)], np.uint32)
    r = np.zeros_like(c, dtype=np.uint32)
    for i in range(4):
        n = (c >> np.uint32(4 * i)) & np.uint32(15)
        byte = src[n & 7]
        byte = np.where(n & 8, np.where(byte & 0x80, np.uint32(0xFF), np.uint32(0)), byte)
        r |= byte.astype(np.uint32) << np.uint32(8 * i)
    return r


def nibbles_u8_half(words: dict, name: str, c: np.ndarray, lo_negative: bool) -> np.ndarray:
    """nibbles_u8's word of one 16-bit half c of codes, from the tables {name}_{lo,hi}_word{0,1}."""
    lo = prmt(words[f"{name}_lo_word0"], words[f"{name}_lo_word1"], c)
    hi = prmt(words[f"{name}_hi_word0"], words[f"{name}_hi_word1"], c ^ np.uint32(0x8888))
    a, b = (hi, lo) if lo_negative else (lo, hi)
    return ((a.astype(np.uint64) + 0x80808080 - b.astype(np.uint64)) & 0xFFFFFFFF).astype(np.uint32)


def byte_values(w: np.ndarray) -> np.ndarray:
    return np.stack([(w >> np.uint32(8 * i)) & np.uint32(0xFF) for i in range(4)], axis=-1)


def test_iq4nl_tables_give_the_levels(tables):
    """Every 16-bit half of codes (all 65536): the u8 tables give 128 + level per byte, the s8 tables
    the level itself as s8, byte i from code i (so, bit for bit, the s8 word is the u8 word with bit 7
    of each byte flipped: the split before)."""
    words, flags = tables
    levels = np.array(quants.IQ4_NL.kvalues, dtype=np.int64)
    c = np.arange(1 << 16, dtype=np.uint32)
    codes = np.stack([(c >> np.uint32(4 * i)) & np.uint32(15) for i in range(4)], axis=-1)
    u8 = nibbles_u8_half(words, "iq4nl_i8", c, flags["iq4nl_i8_lo_negative"])
    s8 = nibbles_u8_half(words, "iq4nl_s8", c, True)
    assert np.array_equal(byte_values(u8).astype(np.int64), levels[codes] + 128)
    assert np.array_equal(byte_values(s8).astype(np.uint8).view(np.int8).astype(np.int64), levels[codes])
    assert np.array_equal(s8, u8 ^ np.uint32(0x80808080))


def test_iq4nl_s8_tables_have_bit_7_set(tables):
    """A code of the other half selects 0xFF (prmt's sign mode) only if every byte has bit 7 set."""
    words, _ = tables
    for part in ("lo", "hi"):
        for i in (0, 1):
            w = words[f"iq4nl_s8_{part}_word{i}"]
            assert all((w >> (8 * k)) & 0x80 for k in range(4)), f"iq4nl_s8_{part}_word{i} = {w:#010x}"
