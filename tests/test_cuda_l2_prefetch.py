"""The decode's L2 prefetch (csrc/cuda/experts_kernels.cuh, "L2 prefetch of weights": phase 0
puts the step's down rows in flight to the L2, or each block its own rows) and phase 1's own
warps per block (FTW_CUDA_KSPLIT_DOWN), against the float64 reference with
tests/test_cuda_kernels.py's tolerance (||out - ref|| / ||ref|| < 4e-3; the same stated
arithmetic). A prefetch changes no value: these check that every mode (FTW_CUDA_L2_PREFETCH, as
the benchmarks choose them) runs through both decode kernels without a fault or a changed sum,
at sizes where bands, rows and bank rows end off any 16-byte or 16 KB bound (the prefetch clips
its ranges inward), with bf16's biases (a down bank of H * 2 bytes), and with the budget too
small for the step (no prefetch). GPU only (marked gpu, skipped elsewhere).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from test_cuda_kernels import ACTS, REL_TOL, Reference, bf16_x, make_banks, rel_err, routing, run  # noqa: E402

# the formats whose decoders opt in (kPrefetchDown); mxfp8 decodes with the staged kernel
FORMATS = ["bf16", "fp8_block", "mxfp8"]
MODES = ["0", "start", "end", "self", "self+end", "start+last"]
# bf16 H = 264: 33 units, 8.25 bands of 32 down rows; I = 168: 10.5 bands of 16 gate rows.
# fp8_block H = 272, I = 176: partial bands and chunks. mxfp8 needs multiples of 32.
SIZES = {"bf16": (264, 168), "fp8_block": (272, 176), "mxfp8": (288, 160)}


def check(name, T, same, seed, monkeypatch, **env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rng = np.random.default_rng(seed)
    H, I = SIZES[name]  # noqa: E741
    E, K = 12, 8
    opts, banks = make_banks(name, H, I, E, rng, biases=name == "bf16")
    x, x64 = bf16_x(T, H, rng)
    ids, wts = routing(T, K, E, rng, same=same)
    act = ACTS["silu_limit"]
    out = run(name, opts, banks, x, ids, wts, act)
    ref = Reference(name, opts, banks, H, I).forward(x64, ids, wts, act)
    assert rel_err(out, ref) < REL_TOL


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("T, same", [(1, False), (3, False), (8, True)])
def test_prefetch_modes_match_float64_reference(name, mode, T, same, monkeypatch):
    check(name, T, same, [T, MODES.index(mode), len(name)], monkeypatch, FTW_CUDA_L2_PREFETCH=mode)


@pytest.mark.parametrize("name", FORMATS)
def test_prefetch_over_budget_is_skipped(name, monkeypatch):
    check(name, 1, False, [7, len(name)], monkeypatch, FTW_CUDA_L2_PREFETCH="start+end", FTW_CUDA_L2_PREFETCH_MAX="16")


@pytest.mark.parametrize("mode", ["start", "self+end"])
def test_prefetch_in_the_register_fed_kernel_of_mxfp8(mode, monkeypatch):
    check("mxfp8", 3, False, [11, len(mode)], monkeypatch, FTW_CUDA_L2_PREFETCH=mode, FTW_CUDA_DECODE="classic")


@pytest.mark.parametrize("ks", ["1", "2", "8"])
@pytest.mark.parametrize("name", ["bf16", "fp8_block"])
def test_down_warps_per_block(name, ks, monkeypatch):
    check(name, 3, False, [13, int(ks), len(name)], monkeypatch, FTW_CUDA_KSPLIT_DOWN=ks)
