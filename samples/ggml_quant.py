"""Quantize float rows with llama.cpp's own ggml (the copy compiled into the xllamacpp wheel).

gguf.quants only quantizes the simple types; the K and IQ types need ggml's real quantizer so
the sample files hold blocks a real llama-quantize run could have produced. Used only by the
sample maker and the tests, never by the readers.
"""

from __future__ import annotations

import ctypes
import os
from functools import lru_cache

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType


@lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    import xllamacpp  # the wheel ships ggml linked into its extension module

    lib = ctypes.CDLL(os.path.join(os.path.dirname(xllamacpp.__file__), "xllamacpp.abi3.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
    ]
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    return lib


def row_nbytes(qtype: GGMLQuantizationType, n_per_row: int) -> int:
    block, nbytes = GGML_QUANT_SIZES[qtype]
    return n_per_row // block * nbytes


def quantize(values: np.ndarray, qtype: GGMLQuantizationType | str) -> np.ndarray:
    """[..., n] float -> [..., row_bytes] uint8 of ggml blocks, quantized by ggml itself."""
    qtype = GGMLQuantizationType[qtype] if isinstance(qtype, str) else qtype
    lib = _lib()
    src = np.ascontiguousarray(values, dtype=np.float32)
    n = src.shape[-1]
    rows = src.size // n
    rb = row_nbytes(qtype, n)
    if lib.ggml_row_size(int(qtype), n) != rb:
        raise ValueError(f"ggml and gguf disagree on the row size of {qtype.name}")
    dst = np.zeros((rows, rb), dtype=np.uint8)
    lib.ggml_quantize_init(int(qtype))  # builds the IQ grids; a no-op for other types
    # the IQ1/IQ2 quantizers refuse to run without an importance matrix: uniform weights
    # give the plain least-squares choice
    imatrix = np.ones(n, dtype=np.float32) if lib.ggml_quantize_requires_imatrix(int(qtype)) else None
    written = lib.ggml_quantize_chunk(
        int(qtype), src.ctypes.data, dst.ctypes.data, 0, rows, n,
        None if imatrix is None else imatrix.ctypes.data,
    )
    if written != dst.nbytes:
        raise RuntimeError(f"ggml_quantize_chunk wrote {written} bytes for {qtype.name}, expected {dst.nbytes}")
    return dst.reshape(src.shape[:-1] + (rb,))
