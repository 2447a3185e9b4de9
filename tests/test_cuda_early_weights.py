"""Early weights (FTW_CUDA_EARLY_WEIGHTS=1 forces them on for both decode kernels; by default the
register-fed kernel has them for fp8_block, not bf16, the staged kernel not; csrc/cuda/experts_kernels.cuh: experts_decode's Early,
experts_decode_staged's kOptEarly): a block whose first expert is token 0's k-th (block row or
first item y < K) puts that expert's first chunks in flight before the routing, and the routing
still decides. Against the float64 reference with tests/test_cuda_kernels.py's tolerance
(||out - ref|| / ||ref|| < 4e-3), for the formats this is built for: bf16 and fp8_block
(register-fed) and mxfp8 (staged), at sizes with partial row bands and partial last chunks.

Also the steps the routing must correct, passed without the host check (check=False): token 0
listing an expert twice (block y's first distinct expert is then not token 0's k = y: the early
chunks are dropped and the block primes again) and token 0 routed to an expert that is not
resident (nothing is read early; the expert is skipped and flagged, as without early weights).
GPU only (marked gpu, skipped elsewhere).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from test_cuda_kernels import ACTS, Reference, bf16_x, make_banks, rel_err, routing, run, tol  # noqa: E402

from ftw.formats import LayerFormat  # noqa: E402
from ftw.runtime import cuda_experts as ce  # noqa: E402

FORMATS = ["bf16", "fp8_block", "mxfp8"]
# (H, I): bf16 264 x 168 and fp8_block 272 x 176 as tests/test_cuda_register_shapes.py (partial
# bands of rows, a partial last chunk of a row); mxfp8 256 x 160 as tests/test_cuda_staged.py
# (down rows of 5 units: a partial chunk)
SIZES = {"bf16": (264, 168), "fp8_block": (272, 176), "mxfp8": (256, 160)}


def make_step(name, T, K, same, seed):
    rng = np.random.default_rng(seed)
    H, I = SIZES[name]  # noqa: E741
    E = 16
    opts, banks = make_banks(name, H, I, E, rng, biases=name == "bf16")
    x, x64 = bf16_x(T, H, rng)
    ids, wts = routing(T, K, E, rng, same=same)
    return opts, banks, x, x64, ids, wts, Reference(name, opts, banks, H, I)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("T, K, same", [(1, 8, False), (3, 8, False), (8, 8, True), (8, 8, False), (3, 2, False)])
def test_early_weights_match_float64_reference(name, T, K, same, monkeypatch):
    # K = 2 at T = 3: block rows 2..5 (register-fed) serve experts no token 0 names, unprimed
    monkeypatch.setenv("FTW_CUDA_EARLY_WEIGHTS", "1")
    opts, banks, x, x64, ids, wts, ref = make_step(name, T, K, same, [T, K, int(same), FORMATS.index(name)])
    act = ACTS["silu_limit"]
    out = run(name, opts, banks, x, ids, wts, act)
    assert rel_err(out, ref.forward(x64, ids, wts, act)) < tol(name)


@pytest.mark.parametrize("shape", ["parts2", "parts4", "wide"])
@pytest.mark.parametrize("T", [1, 3, 8])
def test_early_weights_staged_shapes(shape, T, monkeypatch):
    # mxfp8 with down's items split between blocks (each part's first chunks early: they start
    # at the part's chunk) and at 128 registers (kOptWide | kOptEarly); I = 1024: 8 chunks
    monkeypatch.setenv("FTW_CUDA_EARLY_WEIGHTS", "1")
    if shape == "wide":
        monkeypatch.setenv("FTW_CUDA_STAGED_WIDE", "1")
    else:
        monkeypatch.setenv("FTW_CUDA_STAGED_PARTS", shape[-1])
    rng = np.random.default_rng([T, len(shape), 8])
    H, I, E, K = 256, 1024, 12, 8  # noqa: E741
    opts, banks = make_banks("mxfp8", H, I, E, rng)
    x, x64 = bf16_x(T, H, rng)
    ids, wts = routing(T, K, E, rng)
    act = ACTS["silu"]
    out = run("mxfp8", opts, banks, x, ids, wts, act)
    assert rel_err(out, Reference("mxfp8", opts, banks, H, I).forward(x64, ids, wts, act)) < tol("mxfp8")


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("case", ["twice", "not_resident"])
@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("early", ["0", "1"])
def test_early_weights_corrected_by_the_routing(name, case, T, early, monkeypatch):
    # early "0": the same step without early weights, so that a failure here with "1" only is
    # early weights' own
    monkeypatch.setenv("FTW_CUDA_EARLY_WEIGHTS", early)
    opts, banks, x, x64, ids, wts, ref = make_step(name, T, 8, False, [T, len(case), FORMATS.index(name), 1])
    view = ce.identity_view(LayerFormat.of(name, opts), banks)
    ref_wts = wts.copy()
    if case == "twice":
        # token 0's k = 1 repeats k = 0: the step's distinct experts shift down from rank 1, and
        # the repeated expert serves both pairs (the reference adds both, as the kernels do)
        ids[0, 1] = ids[0, 0]
    else:
        gone = int(ids[0, 2])  # skipped wherever it is routed (its pairs add nothing)
        view.slot_of_expert[gone] = -1
        ref_wts[ids == gone] = 0.0
    act = ACTS["silu"]
    ws = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    out = run(name, opts, banks, x, ids, wts, act, view=view, check=False, ws=ws)
    torch.cuda.synchronize()
    assert ce.read_error(ws) == (2 if case == "not_resident" else None)
    assert rel_err(out, ref.forward(x64, ids, ref_wts, act)) < tol(name)
