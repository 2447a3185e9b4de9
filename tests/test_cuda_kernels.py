"""CUDA expert kernels (csrc/cuda/, csrc/formats/*/cuda.cu) against the float64 reference.

Every test needs a GPU (marked `gpu`, skipped elsewhere). Banks are fresh random data in each
format's stored bytes; the reference decodes them with the format registry's float64 decoder
(ftw.formats.get_format(name).decode) and applies ftw.formats.Activation.apply.

Tolerance, the same for every format, as ||out - ref|| / ||ref|| over the whole [T, H] output:
REL_TOL = 4e-3. Weights are decoded exactly to bf16 by every kernel (bf16; e2m1 and e4m3 times
a power of two for mxfp4, ds_fp4 and mxfp8; e2m1 times an e4m3 scale for nvfp4, its float32
global applied to the row's sum; fp8_block's float32 block scale applied to each 64-value
chunk's float32 partial sum), products accumulate in float32 on the tensor cores, and x is
bf16 on both sides; the one rounding is the activation between gate_up and down, stored as bf16
(<= 2^-9 relative per element). Measured on the H200 (bench/bench_kernels.py --accuracy):
0.85e-3 to 1.7e-3 for every format, decode and prefill (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from ftw.errors import FormatError, UnsupportedError  # noqa: E402
from ftw.formats import Activation, LayerFormat, get_format  # noqa: E402
from ftw.runtime import cuda_experts as ce  # noqa: E402

if not ce.cuda_formats():
    pytest.skip("ftw._runtime was built without CUDA", allow_module_level=True)

REL_TOL = 4e-3
GPU_FORMATS = ["bf16", "fp8_block", "nvfp4", "mxfp4", "ds_fp4", "mxfp8"]


def tol(name: str) -> float:
    return REL_TOL


# ---- random banks in each format's stored bytes ------------------------------------------------


def bf16_bits(a: np.ndarray) -> np.ndarray:
    u = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def e4m3_bytes(a: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.asarray(a, dtype=np.float32)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def make_banks(name: str, H: int, I: int, E: int, rng: np.random.Generator, *, biases: bool = False,  # noqa: E741
               spread: float = 4.0, block=(128, 128)) -> tuple[dict, dict[str, np.ndarray]]:
    """Random banks [E, *row] of format `name`; dot products of a unit-normal x with a row come
    out with a standard deviation near `spread` (so values reach clamps of 7 or 10)."""
    opts: dict = {}
    b: dict[str, np.ndarray] = {}

    def sigma(n_in):
        return spread / np.sqrt(n_in)

    def normal(shape, s=1.0):
        return rng.standard_normal(shape).astype(np.float32) * s

    if name == "bf16":
        b["gate_up"] = bf16_bits(normal((E, 2 * I, H), sigma(H)))
        b["down"] = bf16_bits(normal((E, H, I), sigma(I)))
    elif name == "fp8_block":
        bo, bi = block
        opts["block_size"] = [bo, bi]
        cd = lambda a, c: -(-a // c)  # noqa: E731
        for bank, rows, cols, n_in, srows in (("gate_up", 2 * I, H, H, 2 * cd(I, bo)), ("down", H, I, I, cd(H, bo))):
            b[bank] = e4m3_bytes(normal((E, rows, cols), 16.0))
            b[bank + "_scale"] = (sigma(n_in) / 16 * rng.uniform(0.5, 2.0, (E, srows, cd(cols, bi)))).astype(np.float32)
    elif name == "mxfp8":
        for bank, rows, cols in (("gate_up", 2 * I, H), ("down", H, I)):
            b[bank] = e4m3_bytes(normal((E, rows, cols), 16.0))
            base = 127 + int(np.round(np.log2(sigma(cols) / 16)))
            b[bank + "_scale"] = rng.integers(base - 1, base + 2, (E, rows, cols // 32)).astype(np.uint8)
    elif name == "nvfp4":
        for bank, rows, cols in (("gate_up", 2 * I, H), ("down", H, I)):
            b[bank] = rng.integers(0, 256, (E, rows, cols // 2)).astype(np.uint8)
            b[bank + "_scale"] = e4m3_bytes(rng.uniform(0.5, 4.0, (E, rows, cols // 16)))
            b[bank + "_global"] = (sigma(cols) / (3.0 * 2.0) * rng.uniform(0.5, 2.0, (E, rows))).astype(np.float32)
    elif name in ("mxfp4", "ds_fp4"):
        if name == "ds_fp4":
            opts["act_block"] = 128
        for bank, rows, cols in (("gate_up", 2 * I, H), ("down", H, I)):
            b[bank] = rng.integers(0, 256, (E, rows, cols // 2)).astype(np.uint8)
            base = 127 + int(np.round(np.log2(sigma(cols) / 3.0)))
            b[bank + "_scale"] = rng.integers(base - 1, base + 2, (E, rows, cols // 32)).astype(np.uint8)
        biases = biases or name == "mxfp4"
    else:
        raise ValueError(name)
    if biases:
        b["gate_up_bias"] = bf16_bits(normal((E, 2 * I), 1.0))
        b["down_bias"] = bf16_bits(normal((E, H), 0.5))
    return opts, b


class Reference:
    """float64 forward of one layer from its banks, through the registry's decoder."""

    def __init__(self, name: str, opts: dict, banks: dict[str, np.ndarray], H: int, I: int):  # noqa: E741
        self.fmt, self.opts, self.banks, self.H, self.I = get_format(name), opts, banks, H, I
        self.cache: dict[int, dict] = {}

    def weights(self, e: int) -> dict:
        if e not in self.cache:
            rows = {k: v[e] for k, v in self.banks.items()}
            self.cache[e] = self.fmt.decode(rows, self.H, self.I, self.opts)
        return self.cache[e]

    def gate_up(self, x: np.ndarray, e: int) -> tuple[np.ndarray, np.ndarray]:
        w = self.weights(e)
        return w["gate"] @ x + w.get("gate_bias", 0.0), w["up"] @ x + w.get("up_bias", 0.0)

    def forward(self, x: np.ndarray, ids: np.ndarray, wts: np.ndarray, act: Activation) -> np.ndarray:
        out = np.zeros((x.shape[0], self.H))
        for t in range(x.shape[0]):
            for k in range(ids.shape[1]):
                e = int(ids[t, k])
                g, u = self.gate_up(x[t], e)
                w = self.weights(e)
                out[t] += float(wts[t, k]) * (w["down"] @ act.apply(g, u) + w.get("down_bias", 0.0))
        return out


def routing(T: int, K: int, E: int, rng: np.random.Generator, same: bool = False):
    if same:
        ids = np.tile(rng.choice(E, K, replace=False), (T, 1))
    else:
        ids = np.stack([rng.choice(E, K, replace=False) for _ in range(T)])
    wts = rng.uniform(0.05, 1.0, (T, K)).astype(np.float32)
    return ids.astype(np.int32), wts


def bf16_x(T: int, H: int, rng: np.random.Generator) -> tuple[torch.Tensor, np.ndarray]:
    x = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32)).to(torch.bfloat16)
    return x.cuda(), x.float().double().numpy()


def rel_err(out: torch.Tensor, ref: np.ndarray) -> float:
    o = out.double().cpu().numpy()
    assert np.isfinite(o).all(), "non-finite output"
    return float(np.linalg.norm(o - ref) / np.linalg.norm(ref))


def run(name, opts, banks, x, ids, wts, act, view=None, **kw):
    view = view or ce.identity_view(LayerFormat.of(name, opts), banks)
    return ce.experts_forward(view, x, torch.from_numpy(ids).cuda(), torch.from_numpy(wts).cuda(), act, **kw)


def run_back_to_back(view, inputs, act, graph: bool, K: int, I: int, E: int) -> list[torch.Tensor]:  # noqa: E741
    """Steps [(x, x64, ids, wts), ...] (x [T, H] on the device, the rest on the host) launched back to
    back on one stream sharing one workspace, eagerly or captured in a CUDA graph and replayed once
    (the kernels' first launches, lazy module loading, run outside the capture); each step's output."""
    T, H = inputs[0][0].shape
    steps = [(x, torch.from_numpy(ids).cuda(), torch.from_numpy(wts).cuda(),
              torch.full((T, H), float("nan"), dtype=torch.float32, device="cuda")) for x, _, ids, wts in inputs]
    ws = torch.empty(ce._runtime.cuda_experts_workspace_bytes(T, K, I, E, H), dtype=torch.uint8, device="cuda")

    def launch():
        for x, ids_d, wts_d, out in steps:
            ce.experts_forward(view, x, ids_d, wts_d, act, out=out, ws=ws, check=False)

    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            launch()
        torch.cuda.current_stream().wait_stream(s)
        for *_, out in steps:
            out.fill_(float("nan"))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            launch()
        g.replay()
    else:
        launch()
    torch.cuda.synchronize()
    assert ce.read_error(ws) is None
    return [out for *_, out in steps]


ACTS = {
    "silu": Activation("silu"),
    "silu_limit": Activation("silu", limit=10.0),
    "swiglu_oai": Activation("swiglu_oai", alpha=1.702, limit=7.0),
}


# ---- tests ---------------------------------------------------------------------------------------


def test_every_safetensors_format_has_a_cuda_kernel():
    assert sorted(ce.cuda_formats()) == sorted(GPU_FORMATS + ["gguf"])  # gguf: tests/test_cuda_kernels_gguf.py


@pytest.mark.parametrize("name", GPU_FORMATS)
@pytest.mark.parametrize("T", [1, 3, 8, 12])  # 12 > 8: the routed (prefill) path at a small T
def test_decode_matches_float64_reference(name, T):
    rng = np.random.default_rng([T, GPU_FORMATS.index(name)])
    H, I, E, K = 256, 160, 16, 8  # I = 160: fp8_block's fused gate_up scales with I % 128 != 0  # noqa: E741
    opts, banks = make_banks(name, H, I, E, rng)
    x, x64 = bf16_x(T, H, rng)
    ids, wts = routing(T, K, E, rng)
    act = ACTS["swiglu_oai"] if name == "mxfp4" else ACTS["silu_limit"]
    out = run(name, opts, banks, x, ids, wts, act)
    ref = Reference(name, opts, banks, H, I).forward(x64, ids, wts, act)
    assert rel_err(out, ref) < tol(name)


@pytest.mark.parametrize("name", GPU_FORMATS)
def test_decode_of_tokens_far_apart_in_magnitude(name):
    """Tokens scaled by 2^24, 2^-24, 1 and 2^12 in one step, each within tolerance of its own
    reference row (not only of the whole output, which the 2^24 token dominates): x and the
    activations keep bf16's range through both phases, a kernel that rounds them to a narrower
    type (f16: 2^-24 .. 65504) without a per-token scale fails here."""
    rng = np.random.default_rng([11, GPU_FORMATS.index(name)])
    H, I, E, K, T = 256, 160, 16, 8, 4  # noqa: E741
    opts, banks = make_banks(name, H, I, E, rng)
    x32 = rng.standard_normal((T, H)).astype(np.float32) * np.array([[2.0**24], [2.0**-24], [1.0], [2.0**12]],
                                                                    dtype=np.float32)
    xt = torch.from_numpy(x32).to(torch.bfloat16)
    x64 = xt.float().double().numpy()
    ids, wts = routing(T, K, E, rng)
    act = ACTS["silu"]
    out = run(name, opts, banks, xt.cuda(), ids, wts, act).double().cpu().numpy()
    ref = Reference(name, opts, banks, H, I).forward(x64, ids, wts, act)
    assert np.isfinite(out).all()
    for t in range(T):
        assert np.linalg.norm(out[t] - ref[t]) / np.linalg.norm(ref[t]) < tol(name), t


@pytest.mark.parametrize("name", GPU_FORMATS)
@pytest.mark.parametrize("act_name", list(ACTS))
def test_activations_reach_their_clamps(name, act_name):
    rng = np.random.default_rng([7, GPU_FORMATS.index(name), list(ACTS).index(act_name)])
    H, I, E, K, T = 128, 64, 8, 4, 4  # noqa: E741
    opts, banks = make_banks(name, H, I, E, rng, biases=name in ("bf16", "mxfp4"), spread=12.0)
    x, x64 = bf16_x(T, H, rng)
    ids, wts = routing(T, K, E, rng)
    act = ACTS[act_name]
    ref_model = Reference(name, opts, banks, H, I)
    if act.limit is not None:  # the data must exercise the clamp, or the test proves nothing about it
        g, u = ref_model.gate_up(x64[0], int(ids[0, 0]))
        assert (g > act.limit).any() and (np.abs(u) > act.limit).any()
    out = run(name, opts, banks, x, ids, wts, act)
    assert rel_err(out, ref_model.forward(x64, ids, wts, act)) < tol(name)


@pytest.mark.parametrize("name", GPU_FORMATS)
def test_prefill_grouped_by_expert(name):
    rng = np.random.default_rng([11, GPU_FORMATS.index(name)])
    H, I, E, K, T = 256, 128, 12, 4, 150  # noqa: E741  150 * 4 pairs: the prefill tiles (64 pairs)
    opts, banks = make_banks(name, H, I, E, rng)
    x, x64 = bf16_x(T, H, rng)
    ids, wts = routing(T, K, E, rng)
    act = ACTS["silu"]
    out = run(name, opts, banks, x, ids, wts, act)
    assert rel_err(out, Reference(name, opts, banks, H, I).forward(x64, ids, wts, act)) < tol(name)


@pytest.mark.parametrize("name", ["nvfp4", "bf16"])
def test_slots_found_through_the_table(name):
    """A pool-like view: experts sit in shuffled slots among spare ones; unrouted experts absent."""
    rng = np.random.default_rng(5)
    H, I, E, K, T, S = 128, 64, 10, 3, 5, 14  # noqa: E741
    opts, banks = make_banks(name, H, I, E, rng, biases=name == "bf16")
    x, x64 = bf16_x(T, H, rng)
    ids, wts = routing(T, K, E, rng)
    view0 = ce.identity_view(LayerFormat.of(name, opts), banks)
    slots = rng.permutation(S)[:E]
    pool = {}
    for k, t in view0.banks.items():
        p = torch.from_numpy(rng.integers(0, 256, (S,) + tuple(t.shape[1:]) + (t.element_size(),)).astype(np.uint8))
        p = p.view(t.dtype).reshape((S,) + tuple(t.shape[1:])).cuda()  # garbage in the spare slots
        p[torch.from_numpy(slots).cuda()] = t
        pool[k] = p
    table = np.full(E, -1, dtype=np.int32)
    routed = np.unique(ids)
    table[routed] = slots[routed]
    view = ce.LayerView(view0.format, pool, torch.from_numpy(table).cuda())
    out = run(name, opts, banks, x, ids, wts, ACTS["silu"], view=view)
    assert rel_err(out, Reference(name, opts, banks, H, I).forward(x64, ids, wts, ACTS["silu"])) < tol(name)


def test_mixed_model_bf16_nvfp4_fp8_mxfp4():
    """Four layers in four formats, merged into one union bank set (placeholders where a layer's
    format lacks a bank); hidden states flow layer to layer."""
    from ftw.loader import ExpertBanks, merge_expert_banks

    rng = np.random.default_rng(21)
    H, I, E, K, T = 256, 128, 8, 4, 3  # noqa: E741
    names = ["bf16", "nvfp4", "fp8_block", "mxfp4"]
    parts, made = [], {}
    for layer, name in enumerate(names):
        opts, banks = make_banks(name, H, I, E, rng, spread=2.0)
        made[layer] = (name, opts, banks)
        parts.append(ExpertBanks({k: {layer: v} for k, v in banks.items()}, {layer: LayerFormat.of(name, opts)}, E))
    merged = merge_expert_banks(parts)
    x, x64 = bf16_x(T, H, rng)
    for layer, (name, opts, banks) in made.items():
        fmt = merged.layer_formats[layer]
        layer_banks = {k: merged.banks[k][layer] for k in get_format(fmt.name).bank_names if k in merged.banks}
        ids, wts = routing(T, K, E, rng)
        act = ACTS["swiglu_oai"] if name == "mxfp4" else ACTS["silu"]
        out = ce.experts_forward(ce.identity_view(fmt, layer_banks), x, torch.from_numpy(ids).cuda(),
                                 torch.from_numpy(wts).cuda(), act)
        ref = Reference(name, opts, banks, H, I).forward(x64, ids, wts, act)
        assert rel_err(out, ref) < tol(name), f"layer {layer} ({name})"
        # next layer's input: the output, normalised, as bf16 on both sides
        nxt = (out / out.norm(dim=1, keepdim=True) * np.sqrt(H)).to(torch.bfloat16)
        x, x64 = nxt, nxt.float().double().cpu().numpy()


@pytest.mark.parametrize("name", GPU_FORMATS)
@pytest.mark.parametrize("T", [2, 150])
def test_agrees_with_the_cpu_executor(name, T):
    """The same banks through ftw.runtime.CpuMoeExecutor (float32 products; within 2e-7 of the
    float64 reference on these banks) and through the CUDA kernels: within REL_TOL."""
    from ftw.loader import ExpertBanks
    from ftw.runtime import CpuMoeExecutor

    rng = np.random.default_rng([17, T, GPU_FORMATS.index(name)])
    H, I, E, K = 256, 160, 16, 4  # noqa: E741
    opts, banks = make_banks(name, H, I, E, rng, biases=name in ("bf16", "mxfp4"))
    x, x64 = bf16_x(T, H, rng)
    ids, wts = routing(T, K, E, rng)
    act = ACTS["swiglu_oai"] if name == "mxfp4" else ACTS["silu_limit"]
    layer = ExpertBanks({k: {0: v} for k, v in banks.items()}, {0: LayerFormat.of(name, opts)}, E)
    cpu = CpuMoeExecutor(layer, threads=4, activation=act).forward(0, x64.astype(np.float32), ids, wts)
    out = run(name, opts, banks, x, ids, wts, act)
    assert rel_err(out, cpu.astype(np.float64)) < tol(name)


def test_decode_step_in_a_cuda_graph():
    rng = np.random.default_rng(3)
    H, I, E, K, T = 256, 128, 16, 8, 4  # noqa: E741
    opts, banks = make_banks("nvfp4", H, I, E, rng)
    view = ce.identity_view(LayerFormat.of("nvfp4", opts), banks)
    x = torch.zeros((T, H), dtype=torch.bfloat16, device="cuda")
    ids = torch.zeros((T, K), dtype=torch.int32, device="cuda")
    wts = torch.zeros((T, K), dtype=torch.float32, device="cuda")
    out = torch.empty((T, H), dtype=torch.float32, device="cuda")
    ws = torch.empty(ce._runtime.cuda_experts_workspace_bytes(T, K, I, E, H), dtype=torch.uint8, device="cuda")
    ids.copy_(torch.from_numpy(routing(T, K, E, rng)[0]))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside capture
        ce.experts_forward(view, x, ids, wts, "silu", out=out, ws=ws, check=False)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ce.experts_forward(view, x, ids, wts, "silu", out=out, ws=ws, check=False)
    ref_model = Reference("nvfp4", opts, banks, H, I)
    for step in range(3):  # new inputs each replay, same graph
        xs, x64 = bf16_x(T, H, rng)
        i_np, w_np = routing(T, K, E, rng)
        x.copy_(xs), ids.copy_(torch.from_numpy(i_np)), wts.copy_(torch.from_numpy(w_np))
        graph.replay()
        torch.cuda.synchronize()
        assert ce.read_error(ws) is None
        assert rel_err(out, ref_model.forward(x64, i_np, w_np, Activation("silu"))) < REL_TOL, f"replay {step}"


# ---- refusals, before any launch --------------------------------------------------------------


def _small(name="nvfp4"):
    rng = np.random.default_rng(1)
    H, I, E, K, T = 128, 64, 8, 2, 2  # noqa: E741
    opts, banks = make_banks(name, H, I, E, rng)
    x, _ = bf16_x(T, H, rng)
    ids, wts = routing(T, K, E, rng)
    return opts, banks, x, ids, wts


def test_non_resident_expert_refused_on_the_host():
    opts, banks, x, ids, wts = _small()
    view = ce.identity_view(LayerFormat.of("nvfp4", opts), banks)
    view.slot_of_expert[int(ids[1, 0])] = -1
    with pytest.raises(FormatError, match=r"expert \d+ \(topk_ids\[1, 0\]\) has slot -1"):
        run("nvfp4", opts, banks, x, ids, wts, "silu", view=view)
    view.slot_of_expert[int(ids[1, 0])] = 99  # past the pool's 8 slots
    with pytest.raises(FormatError, match="not resident in this pool of 8 slots"):
        run("nvfp4", opts, banks, x, ids, wts, "silu", view=view)
    bad = ids.copy()
    bad[0, 1] = 8
    with pytest.raises(FormatError, match=r"topk_ids\[0, 1\] = 8 is not an expert"):
        run("nvfp4", opts, banks, x, bad, wts, "silu")


def test_expert_listed_twice_by_a_token_refused():
    opts, banks, x, ids, wts = _small()
    ids[1, 1] = ids[1, 0]
    with pytest.raises(FormatError, match="token 1 lists an expert twice"):
        run("nvfp4", opts, banks, x, ids, wts, "silu")


def test_fp8_block_scale_block_must_hold_whole_chunks():
    rng = np.random.default_rng(4)
    opts, banks = make_banks("fp8_block", 256, 128, 4, rng, block=(128, 32))
    x, _ = bf16_x(1, 256, rng)
    ids, wts = routing(1, 2, 4, rng)
    with pytest.raises(UnsupportedError, match=r"block_size\[1\]=32 must be a multiple of 64"):
        run("fp8_block", opts, banks, x, ids, wts, "silu")


def test_non_resident_expert_flagged_on_the_device_without_host_check():
    opts, banks, x, ids, wts = _small()
    view = ce.identity_view(LayerFormat.of("nvfp4", opts), banks)
    gone = int(ids[1, 1])
    view.slot_of_expert[gone] = -1
    ws = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    out = run("nvfp4", opts, banks, x, ids, wts, "silu", view=view, check=False, ws=ws)
    torch.cuda.synchronize()
    assert ce.read_error(ws) == int(np.flatnonzero(ids.reshape(-1) == gone)[0])
    assert torch.isfinite(out).all()


def test_wrong_shapes_and_banks_refused():
    opts, banks, x, ids, wts = _small()
    fmt = LayerFormat.of("nvfp4", opts)
    with pytest.raises(FormatError, match=r"x must be \[T, 128\]"):
        run("nvfp4", opts, banks, x[:, :64].contiguous(), ids, wts, "silu")
    with pytest.raises(FormatError, match="topk_ids and topk_weights"):
        run("nvfp4", opts, banks, x, ids, wts[:, :1].copy(), "silu")
    short = dict(banks)
    short["down_scale"] = banks["down_scale"][:, :64]  # half the rows: too few bytes per slot
    view = ce.identity_view(fmt, short)
    with pytest.raises(FormatError, match=r"nvfp4 bank 3 \(down_scale\) has rows of"):
        run("nvfp4", opts, banks, x, ids, wts, "silu", view=view)
    missing = {k: v for k, v in banks.items() if k != "gate_up_global"}
    with pytest.raises(FormatError, match="gate_up_global"):
        run("nvfp4", opts, missing, x, ids, wts, "silu")


def test_unsupported_formats_and_sizes_refused_by_name():
    rng = np.random.default_rng(2)
    opts, banks = make_banks("nvfp4", 112, 64, 4, rng)  # H = 112: not a multiple of the 32-value unit
    x, _ = bf16_x(1, 112, rng)
    ids, wts = routing(1, 2, 4, rng)
    with pytest.raises(UnsupportedError, match="multiples of 32"):
        run("nvfp4", opts, banks, x, ids, wts, "silu")
    affine = ce.LayerView(LayerFormat.of("affine", {"bits": 4, "group_size": 64}), {"gate_up": x, "down": x},
                          torch.zeros(4, dtype=torch.int32, device="cuda"))
    with pytest.raises(UnsupportedError, match="no CUDA kernel for 'affine'"):
        ce.experts_forward(affine, x, torch.from_numpy(ids).cuda(), torch.from_numpy(wts).cuda())
