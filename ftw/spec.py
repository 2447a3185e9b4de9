"""FTW v1 constants: the byte layout, the dtype table and the codecs, in one place.

docs/FORMAT.md is the prose version of this module; keep the two in step.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MAJOR = 1
MINOR = 1  # 1.1: the limits of docs/FORMAT.md (layer index, experts, dims)

ALIGNMENT = 4096  # every blob starts on this boundary (mmap, O_DIRECT, pinned copies)
PREAMBLE_MAGIC = b"FTW\x00"
PREAMBLE = struct.Struct("<4sHH56x")  # magic, major, minor, zero padding: 64 bytes at offset 0
FOOTER_MAGIC = b"FTWINDEX"
# magic, major, minor, flags, index_offset, index_nbytes, index_xxh3, reserved(16), footer_xxh3
FOOTER = struct.Struct("<8sHHIQQQ16xQ")
assert PREAMBLE.size == 64 and FOOTER.size == 64

MAX_INDEX_NBYTES = 64 << 20  # a reader refuses a larger index before reading it
# v1.1 bounds (docs/FORMAT.md, "Limits"): no model has more than a few hundred layers or a
# few thousand experts, and without a bound a 42 MiB index of 300,000 layers, or a range
# like --layers 0-10000000000, costs minutes and gigabytes before anything fails
MAX_LAYERS = 1 << 16  # MoE layer indices are < MAX_LAYERS
MAX_EXPERTS = 1 << 16  # experts per bank
MAX_DIMS = 8  # dimensions of a bank or tensor shape
# zstd's densest frame is RLE blocks, 4 bytes for 128 KiB: no frame decodes to more than this
# many times its size, so a compressed bank whose shape claims more is refused at open
ZSTD_MAX_RATIO = 1 << 15
MIN_FILE_NBYTES = ALIGNMENT + FOOTER.size  # preamble page + footer, with an empty index at least


@dataclass(frozen=True)
class DType:
    name: str
    itemsize: int
    numpy: str  # the numpy dtype a zero-copy view uses; formats numpy lacks are viewed as uints
    torch: str  # the torch dtype name the loader views it as


_DTYPES = [
    DType("bf16", 2, "<u2", "bfloat16"),
    DType("f16", 2, "<f2", "float16"),
    DType("f32", 4, "<f4", "float32"),
    DType("f64", 8, "<f8", "float64"),
    DType("f8_e4m3", 1, "u1", "float8_e4m3fn"),
    DType("f8_e5m2", 1, "u1", "float8_e5m2"),
    DType("e8m0", 1, "u1", "uint8"),  # raw exponent bytes: a numeric cast would destroy them
    DType("u8", 1, "u1", "uint8"),
    DType("i8", 1, "i1", "int8"),
    DType("u16", 2, "<u2", "uint16"),
    DType("i16", 2, "<i2", "int16"),
    DType("u32", 4, "<u4", "uint32"),
    DType("i32", 4, "<i4", "int32"),
    DType("u64", 8, "<u8", "uint64"),
    DType("i64", 8, "<i8", "int64"),
    DType("bool", 1, "u1", "bool"),
]
DTYPES: dict[str, DType] = {d.name: d for d in _DTYPES}

# Codecs of a bank. Compressed banks keep each expert row an independent zstd frame, found
# through a row table of E + 1 little-endian u64 offsets relative to the blob's start.
RAW = "raw"
ZSTD = "zstd"
ZSTD_BYTESPLIT = "zstd-bytesplit"  # 16-bit rows split into low-byte then high-byte planes first
CODECS = (RAW, ZSTD, ZSTD_BYTESPLIT)



def dtype(name: str) -> DType:
    from .errors import UnsupportedError

    try:
        return DTYPES[name]
    except KeyError:
        raise UnsupportedError(f"unknown dtype {name!r} (known: {', '.join(DTYPES)})") from None


def numpy_dtype(name: str) -> np.dtype:
    return np.dtype(dtype(name).numpy)


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


def decimal_index(text: str, limit: int | None = None) -> int | None:
    """text as an index when it is canonical ASCII decimal (no sign, no leading zeros, at
    most 18 digits) below limit; else None. str.isdigit() and int() also take '²', Arabic-
    Indic digits and '03', which would give one tensor two names, or die on 5000 digits."""
    if not (0 < len(text) <= 18 and text.isascii() and text.isdigit()) or (text[0] == "0" and text != "0"):
        return None
    n = int(text)
    return n if limit is None or n < limit else None


def shape_problem(shape: tuple[int, ...], itemsize: int) -> str | None:
    """Why a reader refuses this shape (docs/FORMAT.md, rule 9), or None. The converter asks
    too, before its output exists: it must never write a file its own reader refuses."""
    if len(shape) > MAX_DIMS:
        return f"{len(shape)} dimensions (an FTW shape has at most {MAX_DIMS})"
    n = itemsize
    for d in shape:
        n *= max(d, 1)
    # numpy cannot even describe a larger array, empty or not (a zero dim does not help)
    if n >= 1 << 63:
        return f"shape {list(shape)} is too large for any array"
    return None
