"""MLX affine dequantization against an independent pack-then-decode of fresh random values."""

import numpy as np
import pytest

from ftw.formats import LayerFormat


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    """LSB-first bit stream per row, as MLX packs it, in uint32 words."""
    stream = ((q[..., None] >> np.arange(bits)) & 1).astype(np.uint8).reshape(q.shape[0], -1)
    return np.packbits(stream, axis=-1, bitorder="little").view("<u4")


@pytest.mark.parametrize("bits", [2, 3, 4, 6, 8])
def test_affine_matches_scale_times_q_plus_offset(bits):
    rng = np.random.default_rng()
    H, I, gs = 128, 64, 32
    q = {p: rng.integers(0, 2**bits, shape) for p, shape in (("gate_up", (2 * I, H)), ("down", (H, I)))}
    rows, want = {}, {}
    for p, qv in q.items():
        groups = qv.shape[1] // gs
        scale = rng.uniform(0.001, 0.1, (qv.shape[0], groups)).astype(np.float32)
        offset = rng.uniform(-0.5, 0.5, (qv.shape[0], groups)).astype(np.float32)
        rows[p], rows[p + "_scale"], rows[p + "_offset"] = _pack(qv, bits), scale, offset
        want[p] = qv * np.repeat(scale.astype(np.float64), gs, 1) + np.repeat(offset.astype(np.float64), gs, 1)
    w = LayerFormat.of("affine", {"bits": bits, "group_size": gs}).decode(rows, H, I)
    np.testing.assert_array_equal(w["gate"], want["gate_up"][:I])
    np.testing.assert_array_equal(w["up"], want["gate_up"][I:])
    np.testing.assert_array_equal(w["down"], want["down"])
