"""The fused decode step (csrc/cuda/experts_kernels.cuh: one launch for gate_up and down,
experts_decode_staged with kFused or experts_decode_fused; FTW_CUDA_FUSED=1 forces it, =0 two
launches) against the float64 reference with tests/test_cuda_kernels.py's tolerance
(||out - ref|| / ||ref|| < 4e-3, the same stated arithmetic: exact bf16 weights, float32 sums,
the activation rounded to bf16 once).

- both kernels: every format the staged kernel serves (bf16 and fp8_block through
  FTW_CUDA_DECODE=staged), and bf16 and fp8_block register-fed (experts_decode_fused);
  T = 1, 3 and 8, tokens sharing experts (T=3: half of each token's experts are token 0's;
  8same: all eight tokens the same experts), expert biases (bf16, mxfp4); the staged kernel
  also with 7 blocks (FTW_CUDA_FUSED_GRID: many gate_up items per block and down items per
  warp, the weight ring running from gate_up items into down items); the same cases in two
  launches;
- a sequence of steps captured in one CUDA graph on one workspace and replayed with new inputs:
  every step right, and the workspace's counters zero after each replay (the last block resets
  them for the next launch);
- counters found not zero at launch (a workspace not zero-filled): reported through
  read_error as FormatError, not a hang, and the next step is right again.
GPU only (marked gpu, skipped elsewhere).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from ftw.errors import FormatError  # noqa: E402
from ftw.formats import Activation, LayerFormat  # noqa: E402
from ftw.runtime import cuda_experts as ce  # noqa: E402
from test_cuda_kernels import ACTS, Reference, bf16_x, make_banks, rel_err, routing, run, tol  # noqa: E402

FORMATS = ["nvfp4", "mxfp4", "ds_fp4", "mxfp8", "bf16", "fp8_block"]
# (format, decode kernel): the staged kernel's formats, then bf16 and fp8_block both ways
KERNELS = [(n, "staged") for n in FORMATS] + [("bf16", "classic"), ("fp8_block", "classic")]
SYNC_OFFSET, SYNC_WORDS = 256, 3 + 128  # csrc/cuda/experts.cu Layout: the fused decode's counters
CASES = [(n, k, c, launch) for n, k in KERNELS for c in ("1", "3", "8", "8same")
         for launch in (("fused", "fused-grid7", "two") if k == "staged" else ("fused", "two"))]


def use_kernel(kernel, launch, monkeypatch):
    monkeypatch.setenv("FTW_CUDA_DECODE", kernel)
    monkeypatch.setenv("FTW_CUDA_FUSED", "0" if launch == "two" else "1")
    if launch == "fused-grid7":
        monkeypatch.setenv("FTW_CUDA_FUSED_GRID", "7")


def shared_routing(T, K, E, rng):
    """Token 0's experts at random; every later token keeps a random half of them and adds others."""
    base = rng.choice(E, K, replace=False)
    rows = [base]
    for _ in range(1, T):
        keep = rng.choice(base, K // 2, replace=False)
        rest = rng.choice(np.setdiff1d(np.arange(E), keep), K - K // 2, replace=False)
        rows.append(rng.permutation(np.concatenate([keep, rest])))
    return np.stack(rows).astype(np.int32), rng.uniform(0.05, 1.0, (T, K)).astype(np.float32)


def act_of(name):
    return ACTS["swiglu_oai"] if name == "mxfp4" else ACTS["silu_limit"]


@pytest.mark.parametrize(("name", "kernel", "case", "launch"), CASES)
def test_step_against_the_reference(name, kernel, case, launch, monkeypatch):
    use_kernel(kernel, launch, monkeypatch)
    H, I, E, K = 512, 256, 32, 8  # noqa: E741
    T = int(case[0])
    rng = np.random.default_rng([31, FORMATS.index(name), len(kernel), T, len(case), len(launch)])
    opts, banks = make_banks(name, H, I, E, rng, biases=name in ("bf16", "mxfp4"))
    x, x64 = bf16_x(T, H, rng)
    if case == "8same":
        ids, wts = routing(T, K, E, rng, same=True)
    elif T == 3:
        ids, wts = shared_routing(T, K, E, rng)
    else:
        ids, wts = routing(T, K, E, rng)
    out = run(name, opts, banks, x, ids, wts, act_of(name))
    ref = Reference(name, opts, banks, H, I).forward(x64, ids, wts, act_of(name))
    assert rel_err(out, ref) < tol(name)


def sync_words(ws):
    return ws[SYNC_OFFSET:SYNC_OFFSET + 4 * SYNC_WORDS].view(torch.int32)


@pytest.mark.parametrize(("name", "kernel", "launch"),
                         [(n, k, "fused") for n, k in KERNELS] + [(n, "staged", "fused-grid7") for n in FORMATS])
def test_graph_replays_a_sequence_of_steps(name, kernel, launch, monkeypatch):
    use_kernel(kernel, launch, monkeypatch)
    rng = np.random.default_rng([32, FORMATS.index(name), len(kernel), len(launch)])
    H, I, E, K, T, steps = 256, 128, 16, 8, 4, 3  # noqa: E741
    opts, banks = make_banks(name, H, I, E, rng, biases=name in ("bf16", "mxfp4"))
    view = ce.identity_view(LayerFormat.of(name, opts), banks)
    act = act_of(name)
    xs = [torch.zeros((T, H), dtype=torch.bfloat16, device="cuda") for _ in range(steps)]
    ids = [torch.zeros((T, K), dtype=torch.int32, device="cuda") for _ in range(steps)]
    wts = [torch.zeros((T, K), dtype=torch.float32, device="cuda") for _ in range(steps)]
    outs = [torch.empty((T, H), dtype=torch.float32, device="cuda") for _ in range(steps)]
    ws = torch.zeros(ce._runtime.cuda_experts_workspace_bytes(T, K, I, E), dtype=torch.uint8, device="cuda")
    for i in ids:
        i.copy_(torch.from_numpy(routing(T, K, E, rng)[0]))

    def step_all():
        for s in range(steps):
            ce.experts_forward(view, xs[s], ids[s], wts[s], act, out=outs[s], ws=ws, check=False)

    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):  # warm-up outside capture
        step_all()
    torch.cuda.current_stream().wait_stream(st)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step_all()
    ref_model = Reference(name, opts, banks, H, I)
    for replay in range(3):  # new inputs each replay, same graph and workspace
        refs = []
        for s in range(steps):
            x, x64 = bf16_x(T, H, rng)
            i_np, w_np = shared_routing(T, K, E, rng) if s == 1 else routing(T, K, E, rng, same=s == 2)
            xs[s].copy_(x), ids[s].copy_(torch.from_numpy(i_np)), wts[s].copy_(torch.from_numpy(w_np))
            refs.append(ref_model.forward(x64, i_np, w_np, act))
        graph.replay()
        torch.cuda.synchronize()
        assert ce.read_error(ws) is None
        assert not bool(sync_words(ws).any()), f"replay {replay}: counters left {sync_words(ws).nonzero().tolist()}"
        for s in range(steps):
            assert rel_err(outs[s], refs[s]) < tol(name), f"replay {replay}, step {s}"


@pytest.mark.parametrize(("name", "kernel"), [("nvfp4", "staged"), ("bf16", "classic")])
def test_counters_not_zero_are_reported_then_reset(name, kernel, monkeypatch):
    use_kernel(kernel, "fused", monkeypatch)
    rng = np.random.default_rng([33, len(name)])
    H, I, E, K, T = 256, 128, 8, 2, 1  # noqa: E741
    opts, banks = make_banks(name, H, I, E, rng)
    view = ce.identity_view(LayerFormat.of(name, opts), banks)
    ws = torch.zeros(ce._runtime.cuda_experts_workspace_bytes(T, K, I, E), dtype=torch.uint8, device="cuda")
    sync_words(ws)[1] = -(1 << 30)  # "out cleared by every block": never reached this launch
    x, x64 = bf16_x(T, H, rng)
    ids, wts = routing(T, K, E, rng)
    args = (view, x, torch.from_numpy(ids).cuda(), torch.from_numpy(wts).cuda(), Activation("silu"))
    ce.experts_forward(*args, ws=ws, check=False)
    torch.cuda.synchronize()
    with pytest.raises(FormatError, match="counters in the workspace were not zero"):
        ce.read_error(ws)
    assert not bool(sync_words(ws).any())  # the last block reset them
    out = ce.experts_forward(*args, ws=ws)
    ref = Reference(name, opts, banks, H, I).forward(x64, ids, wts, Activation("silu"))
    assert rel_err(out, ref) < tol(name)
