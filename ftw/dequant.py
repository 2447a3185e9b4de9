"""Dequantize one expert of a layer, in any canonical format, to float64 weights.

This is the numeric reference ``ftw check`` compares both sides with, written from the
formulas in LAYOUTS.md and nothing else. Input: the expert's rows as ``FtwFile.expert_row``
or ``BankSource.row_array`` return them (numpy views in the spec's dtypes). Output:
``{"gate": [I, H], "up": [I, H], "down": [H, I]}`` plus ``gate_bias``/``up_bias``/``down_bias``
where the format has biases.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from .errors import UnsupportedError
from .formats import LayerFormat

Rows = Mapping[str, np.ndarray]
Weights = dict[str, np.ndarray]

E2M1 = np.array(
    [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64
)


def _e4m3_table() -> np.ndarray:
    b = np.arange(256)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = b & 0x7
    normal = (1 + man / 8) * np.exp2(exp - 7.0)
    sub = (man / 8) * 2.0**-6
    out = sign * np.where(exp == 0, sub, normal)
    out[(b & 0x7F) == 0x7F] = np.nan  # e4m3fn has no inf; S.1111.111 is NaN
    return out


E4M3 = _e4m3_table()
E8M0 = np.exp2(np.arange(256, dtype=np.float64) - 127)
E8M0[255] = np.nan


def bf16(u16: np.ndarray) -> np.ndarray:
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def fp4(packed: np.ndarray) -> np.ndarray:
    """[..., n] packed bytes -> [..., 2n] values; the low nibble holds the first element."""
    b = np.asarray(packed).view(np.uint8)
    out = np.empty(b.shape[:-1] + (b.shape[-1] * 2,), dtype=np.float64)
    out[..., 0::2] = E2M1[b & 0xF]
    out[..., 1::2] = E2M1[b >> 4]
    return out


def _blocks(scale: np.ndarray, cols: int) -> np.ndarray:
    """Repeat per-block scales [rows, cols / g] along the input axis to [rows, cols]."""
    g = cols // scale.shape[-1]
    return np.repeat(scale, g, axis=-1)


def _split(gate_up: np.ndarray, I: int, down: np.ndarray) -> Weights:
    return {"gate": gate_up[:I], "up": gate_up[I:], "down": down}


def _biases(w: Weights, rows: Rows, decode: Callable[[np.ndarray], np.ndarray], I: int) -> Weights:
    if "gate_up_bias" in rows and rows["gate_up_bias"].size:
        gub = decode(rows["gate_up_bias"])
        w["gate_bias"], w["up_bias"] = gub[:I], gub[I:]
    if "down_bias" in rows and rows["down_bias"].size:
        w["down_bias"] = decode(rows["down_bias"])
    return w


def _dq_bf16(fmt: LayerFormat, rows: Rows) -> Weights:
    gu = bf16(rows["gate_up"])
    I = gu.shape[0] // 2
    return _biases(_split(gu, I, bf16(rows["down"])), rows, bf16, I)


def _dq_fp8_block(fmt: LayerFormat, rows: Rows) -> Weights:
    bo, bi = fmt.options.get("block_size", [128, 128])

    def one(w: np.ndarray, scale: np.ndarray, row_block: np.ndarray) -> np.ndarray:
        s = np.asarray(scale, dtype=np.float64)[row_block][:, np.arange(w.shape[1]) // bi]
        return E4M3[w] * s

    gu, gus = rows["gate_up"], rows["gate_up_scale"]
    I = gu.shape[0] // 2
    r = np.arange(2 * I)
    gate_blocks = -(-I // bo)
    gu_block = np.where(r < I, r // bo, gate_blocks + (r - I) // bo)
    d = rows["down"]
    return _split(one(gu, gus, gu_block), I, one(d, rows["down_scale"], np.arange(d.shape[0]) // bo))


def _dq_nvfp4(fmt: LayerFormat, rows: Rows) -> Weights:
    def one(p: str) -> np.ndarray:
        v = fp4(rows[p])
        s = _blocks(E4M3[rows[p + "_scale"]], v.shape[-1])
        return v * s * np.asarray(rows[p + "_global"], dtype=np.float64)[:, None]

    gu = one("gate_up")
    return _split(gu, gu.shape[0] // 2, one("down"))


def _dq_e8m0_fp4(fmt: LayerFormat, rows: Rows) -> Weights:
    def one(p: str) -> np.ndarray:
        v = fp4(rows[p])
        return v * _blocks(E8M0[rows[p + "_scale"]], v.shape[-1])

    gu = one("gate_up")
    I = gu.shape[0] // 2
    return _biases(_split(gu, I, one("down")), rows, bf16, I)


def _dq_mxfp8(fmt: LayerFormat, rows: Rows) -> Weights:
    def one(p: str) -> np.ndarray:
        v = E4M3[rows[p]]
        return v * _blocks(E8M0[rows[p + "_scale"]], v.shape[-1])

    gu = one("gate_up")
    return _split(gu, gu.shape[0] // 2, one("down"))


def unpack_bits(words: np.ndarray, bits: int) -> np.ndarray:
    """MLX packing: each row is an LSB-first bit stream of `bits`-bit unsigned values."""
    b = np.ascontiguousarray(words).view(np.uint8)
    stream = np.unpackbits(b, axis=-1, bitorder="little")
    vals = stream.reshape(*stream.shape[:-1], -1, bits).astype(np.int64)
    return (vals << np.arange(bits)).sum(-1).astype(np.float64)


def _dq_affine(fmt: LayerFormat, rows: Rows) -> Weights:
    bits = fmt.options["bits"]

    def num(a: np.ndarray) -> np.ndarray:  # bf16 scales arrive as their uint16 bit patterns
        return bf16(a) if a.dtype == np.uint16 else np.asarray(a, dtype=np.float64)

    def one(p: str) -> np.ndarray:
        q = unpack_bits(rows[p], bits)
        cols = q.shape[-1]
        return q * _blocks(num(rows[p + "_scale"]), cols) + _blocks(num(rows[p + "_offset"]), cols)

    gu = one("gate_up")
    return _split(gu, gu.shape[0] // 2, one("down"))


def _dq_gguf(fmt: LayerFormat, rows: Rows) -> Weights:
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    opts = fmt.options
    gate_t = Q[opts.get("gate_type", opts.get("gate_up_type"))]
    up_t = Q[opts.get("up_type", opts.get("gate_up_type"))]
    down_t = Q[opts["down_type"]]
    gu = np.asarray(rows["gate_up"]).view(np.uint8).reshape(-1)
    down = dequantize(np.asarray(rows["down"]).view(np.uint8).reshape(rows["down"].shape[0], -1), down_t)
    H, I = down.shape
    gate_nbytes = _ggml_nbytes(gate_t, I * H)
    gate = dequantize(gu[:gate_nbytes].reshape(I, -1), gate_t)
    up = dequantize(gu[gate_nbytes:].reshape(I, -1), up_t)
    w = {"gate": gate.astype(np.float64), "up": up.astype(np.float64), "down": down.astype(np.float64)}
    return _biases(w, rows, lambda a: np.asarray(a, dtype=np.float64), I)


def _ggml_nbytes(qtype, n_values: int) -> int:
    from gguf.constants import GGML_QUANT_SIZES

    block, nbytes = GGML_QUANT_SIZES[qtype]
    return n_values // block * nbytes


DEQUANTIZERS: dict[str, Callable[[LayerFormat, Rows], Weights]] = {
    "bf16": _dq_bf16,
    "fp8_block": _dq_fp8_block,
    "nvfp4": _dq_nvfp4,
    "mxfp4": _dq_e8m0_fp4,
    "ds_fp4": _dq_e8m0_fp4,
    "mxfp8": _dq_mxfp8,
    "gguf": _dq_gguf,
    "affine": _dq_affine,
}


def dequantize_expert(fmt: LayerFormat, rows: Rows) -> Weights:
    try:
        fn = DEQUANTIZERS[fmt.name]
    except KeyError:
        raise UnsupportedError(f"no dequantizer for layer format {fmt.key()}") from None
    try:
        return fn(fmt, rows)
    except NotImplementedError as e:  # gguf.quants lacks a few types (Q8_1, Q8_K, integer types)
        raise UnsupportedError(f"cannot dequantize layer format {fmt.key()}: {e}") from None
