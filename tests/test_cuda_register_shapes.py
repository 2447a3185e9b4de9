"""The register-fed decode kernel's shapes (csrc/cuda/experts_kernels.cuh, RegisterShape; the
lists in csrc/formats/bf16/cuda.cu and csrc/formats/fp8_block/cuda.cu) against the float64
reference, each chosen by FTW_CUDA_REGISTER_SHAPE as the benchmarks choose them, at sizes where
the row bands and the last chunk of a row are partial: rows past the matrix and units past the
row are read clamped (no predicate) and must not reach the output. Tolerance and reference as in
tests/test_cuda_kernels.py (REL_TOL: the one bf16 rounding of the activation between the phases).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from test_cuda_kernels import ACTS, REL_TOL, Reference, bf16_x, make_banks, rel_err, routing, run  # noqa: E402

import numpy as np  # noqa: E402

from ftw.formats import LayerFormat  # noqa: E402
from ftw.runtime import cuda_experts as ce  # noqa: E402

# "legacy": RegisterShape<> in the legacy loop (the decode before shapes); 1..4: the lists' others
SHAPES = ["default", "legacy", "1", "2", "3", "4"]

# (H, I): bf16 H = 264 is 33 units (a partial last chunk of gate_up) and 8.25 bands of 32 down
# rows; I = 168 is 10.5 bands of 16 gate rows and 21 units (a partial last chunk of down).
# fp8_block H = 272 is 17 units and 8.5 bands of 32 down rows; I = 176 is 11 units.
SIZES = {"bf16": (264, 168), "fp8_block": (272, 176)}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ["bf16", "fp8_block"])
@pytest.mark.parametrize("T, same", [(1, False), (3, False), (8, True)])
def test_register_shape_matches_float64_reference(name, shape, T, same, monkeypatch):
    if shape == "default":
        monkeypatch.delenv("FTW_CUDA_REGISTER_SHAPE", raising=False)
    else:
        monkeypatch.setenv("FTW_CUDA_REGISTER_SHAPE", shape)
    rng = np.random.default_rng([T, SHAPES.index(shape), len(name)])
    H, I = SIZES[name]  # noqa: E741
    E, K = 12, 8
    opts, banks = make_banks(name, H, I, E, rng, biases=name == "bf16")
    x, x64 = bf16_x(T, H, rng)
    ids, wts = routing(T, K, E, rng, same=same)
    act = ACTS["silu_limit"]
    out = run(name, opts, banks, x, ids, wts, act)
    ref = Reference(name, opts, banks, H, I).forward(x64, ids, wts, act)
    assert rel_err(out, ref) < REL_TOL


def bf16_bits(a: np.ndarray) -> np.ndarray:
    u = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


# fp8_block's general scale lookup (every block size the host accepts, bf16 scales): 128 x 128
# float32 blocks take their own (one load per chunk, shared by a block's tiles) unless
# FTW_CUDA_FP8_SCALES=any; bi = 192 is no power of two (a division per chunk), bo = 32 and 64
# split a tile band over several scale rows.
@pytest.mark.parametrize("block, scale, force_any", [
    ((128, 128), "f32", True), ((128, 128), "bf16", False), ((64, 192), "f32", False), ((32, 64), "bf16", False)])
@pytest.mark.parametrize("T", [1, 8])
def test_fp8_block_scale_lookups(block, scale, force_any, T, monkeypatch):
    monkeypatch.delenv("FTW_CUDA_REGISTER_SHAPE", raising=False)
    if force_any:
        monkeypatch.setenv("FTW_CUDA_FP8_SCALES", "any")
    else:
        monkeypatch.delenv("FTW_CUDA_FP8_SCALES", raising=False)
    rng = np.random.default_rng([T, block[0], block[1], len(scale)])
    H, I = SIZES["fp8_block"]  # noqa: E741
    E, K = 12, 8
    opts, banks = make_banks("fp8_block", H, I, E, rng, block=block)
    if scale == "bf16":  # the reference decodes the same rounded scales
        for k in ("gate_up_scale", "down_scale"):
            banks[k] = bf16_bits(banks[k])
    x, x64 = bf16_x(T, H, rng)
    ids, wts = routing(T, K, E, rng)
    act = ACTS["silu"]
    view = ce.identity_view(LayerFormat.of("fp8_block", opts), banks)
    assert view.banks["down_scale"].dtype == (torch.bfloat16 if scale == "bf16" else torch.float32)
    out = run("fp8_block", opts, banks, x, ids, wts, act, view=view)
    ref = Reference("fp8_block", opts, banks, H, I).forward(x64, ids, wts, act)
    assert rel_err(out, ref) < REL_TOL
