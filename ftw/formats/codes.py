"""Number codes shared by the format decoders: E2M1, E4M3 (fn), E8M0 and bf16 bit patterns.

Every decoder reads the bytes as the file stores them and maps them through these tables to
float64; nothing here rounds.
"""

from __future__ import annotations

import numpy as np

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
    """bf16 bit patterns (uint16) -> float64."""
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def floats(a: np.ndarray) -> np.ndarray:
    """A float bank row -> float64; bf16 arrives as its uint16 bit patterns."""
    a = np.asarray(a)
    return bf16(a) if a.dtype == np.uint16 else a.astype(np.float64)


def fp4(packed: np.ndarray) -> np.ndarray:
    """[..., n] packed bytes -> [..., 2n] values; the low nibble holds the first element."""
    b = np.asarray(packed).view(np.uint8)
    out = np.empty(b.shape[:-1] + (b.shape[-1] * 2,), dtype=np.float64)
    out[..., 0::2] = E2M1[b & 0xF]
    out[..., 1::2] = E2M1[b >> 4]
    return out


def repeat_blocks(scale: np.ndarray, cols: int) -> np.ndarray:
    """Per-group scales [rows, cols / g] repeated along the input axis to [rows, cols]."""
    g = cols // scale.shape[-1]
    return np.repeat(scale, g, axis=-1)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
