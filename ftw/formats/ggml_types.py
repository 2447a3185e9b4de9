"""The ggml type table: block size and bytes per block of every ggml type, in one place.

It is the gguf package's table (gguf.constants.GGML_QUANT_SIZES) with the one entry where
that table and ggml's bytes disagree fixed. The GGUF reader sizes tensors by it and the gguf
format sizes its banks by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..errors import UnsupportedError

# ggml's block_q8_1 is {half d, half s, int8 qs[32]} = 36 bytes; gguf 0.19's table says 40.
# Q8_1 is a vec-dot scratch type llama.cpp never writes, but if a file holds one, ggml's size
# is the one the bytes follow.
_SIZE_FIXES = {"Q8_1": (32, 36)}

# ggml types whose values numpy can view directly, and the ftw dtype a carried tensor gets
FLOAT_DTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "F64": "f64",
                "I8": "i8", "I16": "i16", "I32": "i32", "I64": "i64"}


@dataclass(frozen=True)
class GgmlType:
    id: int
    name: str
    block: int  # values per block
    nbytes: int  # bytes per block

    @property
    def quantized(self) -> bool:
        return self.name not in FLOAT_DTYPES

    def row_nbytes(self, n: int) -> int:
        return n // self.block * self.nbytes


@lru_cache(maxsize=None)
def _gguf():
    """The gguf package's type enum and size table, imported on first use: safetensors
    conversions never need it (about 60 ms of every command's start)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGMLQuantizationType, GGML_QUANT_SIZES


def ggml_type(type_id: int, where: str) -> GgmlType:
    """The ggml type of an id, refused with the tensor's name when the gguf package lacks it."""
    GGMLQuantizationType, GGML_QUANT_SIZES = _gguf()  # noqa: N806
    try:
        t = GGMLQuantizationType(type_id)
        block, nbytes = _SIZE_FIXES.get(t.name, GGML_QUANT_SIZES[t])
    except (ValueError, KeyError):
        raise UnsupportedError(
            f"{where}: ggml type id {type_id} is unknown to the installed gguf package "
            f"(a newer llama.cpp type such as Q2_0 = 42?); upgrade gguf to read it"
        ) from None
    return GgmlType(type_id, t.name, block, nbytes)


def known_types() -> list[GgmlType]:
    GGMLQuantizationType, GGML_QUANT_SIZES = _gguf()  # noqa: N806
    return [ggml_type(t.value, "") for t in GGMLQuantizationType if t in GGML_QUANT_SIZES]


def ggml_type_named(name: str, where: str = "") -> GgmlType:
    member = _gguf()[0].__members__.get(name) if isinstance(name, str) else None
    if member is None:
        raise UnsupportedError(f"{where}ggml type {name!r:.40} is unknown to the installed gguf package")
    return ggml_type(member.value, where)
