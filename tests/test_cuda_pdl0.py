"""Phase 0 of a decode step launched as a programmatic dependent of the stream's previous kernel
(FTW_CUDA_PDL0=1; csrc/cuda/experts_kernels.cuh, phase0_wait): its blocks may become resident
while the previous step's phase 1 still runs, and must not read or write anything (act, out, the
error word) before that kernel is complete. Steps are therefore launched back to back on one
stream, sharing one workspace (act is rewritten by every step's phase 0 while the step before
reads it in its phase 1), each with its own x, routing and output, eagerly and captured in a CUDA
graph; every output against the float64 reference with tests/test_cuda_kernels.py's tolerance
(||out - ref|| / ||ref|| < 4e-3). Formats: bf16, fp8_block (register-fed decode), mxfp8 and
nvfp4 (staged decode). GPU only (marked gpu, skipped elsewhere).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from test_cuda_kernels import (  # noqa: E402
    ACTS, Reference, bf16_x, make_banks, rel_err, routing, run_back_to_back, tol)

from ftw.formats import LayerFormat  # noqa: E402
from ftw.runtime import cuda_experts as ce  # noqa: E402

FORMATS = ["bf16", "fp8_block", "mxfp8", "nvfp4"]
# sizes with partial row bands (bf16, fp8_block: as tests/test_cuda_register_shapes.py) and
# partial last chunks (mxfp8, nvfp4: I = 160)
SIZES = {"bf16": (264, 168), "fp8_block": (272, 176), "mxfp8": (256, 160), "nvfp4": (256, 160)}
STEPS = 6


def run_steps(name, T, graph, seed):
    rng = np.random.default_rng(seed)
    H, I = SIZES[name]  # noqa: E741
    E, K = 16, 8
    opts, banks = make_banks(name, H, I, E, rng)
    view = ce.identity_view(LayerFormat.of(name, opts), banks)
    ref = Reference(name, opts, banks, H, I)
    act = ACTS["silu_limit"]
    inputs = []
    for _ in range(STEPS):
        x, x64 = bf16_x(T, H, rng)
        ids, wts = routing(T, K, E, rng)
        inputs.append((x, x64, ids, wts))
    outs = run_back_to_back(view, inputs, act, graph, K, I, E)
    return [rel_err(out, ref.forward(x64, ids, wts, act)) for (_, x64, ids, wts), out in zip(inputs, outs)], tol(name)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("T", [1, 3, 8])
@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("pdl0", ["1", "0"])
def test_back_to_back_steps_match_float64_reference(name, T, graph, pdl0, monkeypatch):
    # pdl0 "0": the same steps launched one after another, so that a failure with "1" only is the
    # programmatic launch's own
    monkeypatch.setenv("FTW_CUDA_PDL0", pdl0)
    errs, bound = run_steps(name, T, graph, [T, int(graph), FORMATS.index(name)])
    assert max(errs) < bound, errs


@pytest.mark.parametrize("early", ["1", "0"])
def test_back_to_back_with_early_weights(early, monkeypatch):
    # early weights read topk_ids and the slot table first: after phase0_wait too
    monkeypatch.setenv("FTW_CUDA_PDL0", "1")
    monkeypatch.setenv("FTW_CUDA_EARLY_WEIGHTS", early)
    for name in ("bf16", "mxfp8"):
        errs, bound = run_steps(name, 1, False, [int(early), FORMATS.index(name), 9])
        assert max(errs) < bound, (name, errs)
