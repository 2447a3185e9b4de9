"""The CPU executor (ftw.runtime.CpuMoeExecutor) against a float64 reference, every format.

Reference: each routed expert decoded by its format class's float64 decoder (ftw.formats),
then gate/up products, biases, the model's activation (Activation.apply), down product and
routing weights, all in float64, from the same hidden states. Data are fresh random (seeded
by FTW_SEED when set), magnitudes from tests/bank_factory.py: the gate and up products reach
|x| ~ 10-20, so the clamps (limit 7 or 10) are hit on a good share of rows, which a missing or
wrong clamp cannot survive.

Tolerances, relative error ||out - ref|| / ||ref||:
- float32 hidden states: 1e-5 (float32 products over H, I <= 512 terms and float32 scales;
  2e-7 to 5e-7 seen);
- bf16 hidden states: the reference takes the same bf16 inputs; the output is rounded to bf16,
  so 2^-8 (bf16's relative half-ulp is 2^-9 per element; 1.7e-3 seen);
- ds_fp4 with e4m3 activation quantization: the reference quantizes the same way (float32 scale
  and division, as the C++ does) and matches to 1e-5 on the gate/up inputs; the down input h is
  float32 in C++ and float64 here, so a value within ~1e-7 of an e4m3 rounding boundary may round
  the other way: 1 e4m3 step (2^-3 relative) on one of I inputs, ~2^-3 / sqrt(I) of the output
  at most: tolerance 1e-2, and the median of the runs must stay under 1e-5.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import ftw
from ftw.errors import FormatError, FtwError, UnsupportedError
from ftw.formats import FORMATS, Activation
from ftw.runtime import CpuMoeExecutor, cpu_formats

from bank_factory import bf16_bits, expert_banks, random_layer

RTOL_F32 = 1e-5
RTOL_BF16 = 2.0**-8

SILU_CLAMP = Activation("silu", limit=10.0)
SWIGLU = Activation("swiglu_oai", alpha=1.702, limit=7.0)


@pytest.fixture
def rng():
    seed = int(os.environ.get("FTW_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"random seed: FTW_SEED={seed}")
    return np.random.default_rng(seed)


def e4m3_fake_quant(x: np.ndarray, block: int, ue8m0: bool) -> np.ndarray:
    """DeepSeek-V4's activation quantization, in numpy (float32 scale and division)."""
    from ftw.formats.codes import E4M3

    finite = np.sort(np.unique(E4M3[np.isfinite(E4M3)]))
    out = np.empty_like(x, dtype=np.float64)
    for t in range(x.shape[0]):
        for b0 in range(0, x.shape[1], block):
            v = x[t, b0:b0 + block].astype(np.float32)
            amax = max(np.float32(np.abs(v).max()), np.float32(1e-4))
            s = np.float32(amax / np.float32(448.0))
            if ue8m0:
                s = np.float32(2.0 ** np.ceil(np.log2(np.float64(s))))
            y = (v / s).astype(np.float64)
            # nearest e4m3 value, ties to even code (even mantissa)
            i = np.clip(np.searchsorted(finite, y), 1, len(finite) - 1)
            lo, hi = finite[i - 1], finite[i]
            dlo, dhi = y - lo, hi - y
            even_lo = (np.frexp(np.abs(lo))[0] * 16 % 2 == 0)
            q = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(even_lo, lo, hi)))
            out[t, b0:b0 + block] = q * np.float64(s)
    return out


def reference(layer, act: Activation, x: np.ndarray, ids, w, act_quant=None) -> np.ndarray:
    """float64 routed-expert output of a RandomLayer (bank_factory) for hidden x [T, H]."""
    return reference_from(layer.weights, layer.H, act, x, ids, w, act_quant)


def reference_from(decode, H, act: Activation, x: np.ndarray, ids, w, act_quant=None) -> np.ndarray:
    """float64 routed-expert output, experts decoded by decode(e) -> float64 weights."""
    T = x.shape[0]
    out = np.zeros((T, H))
    cache = {}
    xq = e4m3_fake_quant(x, *act_quant) if act_quant else x
    for t in range(T):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            W = cache[e] if e in cache else cache.setdefault(e, decode(e))
            g = W["gate"] @ xq[t] + W.get("gate_bias", 0.0)
            u = W["up"] @ xq[t] + W.get("up_bias", 0.0)
            h = act.apply(g, u)
            if act_quant:
                h = e4m3_fake_quant(h[None], *act_quant)[0]
            out[t] += float(w[t, j]) * (W["down"] @ h + W.get("down_bias", 0.0))
    return out


def routing(rng, T: int, E: int, k: int):
    ids = np.stack([rng.choice(E, size=k, replace=False) for _ in range(T)]).astype(np.int64)
    w = rng.uniform(0.1, 1.0, (T, k)).astype(np.float32)
    return ids, w


def rel_err(out, ref) -> float:
    return float(np.linalg.norm(np.asarray(out, dtype=np.float64) - ref) / np.linalg.norm(ref))


# (format, options, activation, biases): every format, both clamped activations
CASES = [
    ("bf16", {}, SILU_CLAMP, False),
    ("bf16", {}, SWIGLU, True),
    ("fp8_block", {}, SILU_CLAMP, False),
    ("fp8_block", {"block_size": [32, 64], "scale_dtype": "bf16"}, SILU_CLAMP, False),
    ("fp8_block", {"block_size": [48, 40]}, SILU_CLAMP, False),  # blocks the vector path cannot step
    ("nvfp4", {}, SILU_CLAMP, False),
    ("mxfp4", {}, SWIGLU, True),
    ("ds_fp4", {"act_block": 128, "scale_fmt": "ue8m0"}, SILU_CLAMP, False),
    ("mxfp8", {}, SILU_CLAMP, False),
    ("affine", {"bits": 4, "group_size": 64}, SILU_CLAMP, False),
    ("affine", {"bits": 3, "group_size": 32, "scale_dtype": "f16"}, SILU_CLAMP, False),
    ("affine", {"bits": 8, "group_size": 128, "scale_dtype": "f32"}, SILU_CLAMP, False),
    ("gguf", {"gate_up_type": "Q4_K", "down_type": "Q6_K"}, SILU_CLAMP, False),
    ("gguf", {"gate_up_type": "MXFP4", "down_type": "MXFP4"}, SWIGLU, True),
]

# gate / up / down ggml types: every type issue 11 names, gate and up of different types too
GGUF_TYPES = [
    ("Q8_0", "Q8_0", "Q4_0"), ("Q4_1", "Q5_0", "Q5_1"), ("Q2_K", "Q3_K", "Q4_K"),
    ("Q5_K", "Q6_K", "IQ4_NL"), ("IQ4_XS", "IQ2_XXS", "IQ2_XS"), ("IQ3_XXS", "IQ3_S", "Q8_0"),
]


def _check_format(rng, name, options, act, biases, H=512, I=256, E=8, T=5, k=3, dtype="f32"):  # noqa: E741
    layer = random_layer(name, H, I, E, rng, options, biases=biases)
    ex = CpuMoeExecutor(expert_banks({3: layer}, act, top_k=k), threads=2)
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids, w = routing(rng, T, E, k)
    if dtype == "bf16":
        xb = bf16_bits(x)
        out = ex.forward(3, xb, ids, w)
        assert out.dtype == np.uint16 and out.shape == (T, H)
        ref = reference(layer, act, (xb.astype(np.uint32) << 16).view(np.float32).astype(np.float64), ids, w)
        got = (out.astype(np.uint32) << 16).view(np.float32)
        return rel_err(got, ref), layer, ref
    out = ex.forward(3, x, ids, w)
    assert out.dtype == np.float32 and out.shape == (T, H)
    ref = reference(layer, act, x.astype(np.float64), ids, w)
    return rel_err(out, ref), layer, ref


@pytest.mark.parametrize("name, options, act, biases", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_format_matches_float64_reference(rng, name, options, act, biases):
    err, layer, ref = _check_format(rng, name, options, act, biases)
    assert err < RTOL_F32, f"{name} {options}: relative error {err:.3g}"


@pytest.mark.parametrize("gate, up, down", GGUF_TYPES, ids=["-".join(t) for t in GGUF_TYPES])
def test_gguf_types_match_float64_reference(rng, gate, up, down):
    opts = {"gate_up_type": gate, "down_type": down} if gate == up else {"gate_type": gate, "up_type": up, "down_type": down}
    err, _, _ = _check_format(rng, "gguf", opts, SILU_CLAMP, False, H=512, I=256, E=6, T=4, k=2)
    assert err < RTOL_F32, f"{gate}/{up}/{down}: relative error {err:.3g}"


def test_clamps_are_reached(rng):
    # the data this file uses pushes gate and up past the limits (else a missing clamp passes)
    layer = random_layer("nvfp4", 512, 256, 4, rng)
    W = layer.weights(0)
    x = rng.standard_normal(512)
    g, u = W["gate"] @ x, W["up"] @ x
    assert (g > 10).mean() > 0.1 and (np.abs(u) > 10).mean() > 0.1


def test_missing_clamp_would_fail(rng):
    # the same layer against a reference without the limit is far off: the tests can fail
    layer = random_layer("bf16", 512, 256, 4, rng)
    ex = CpuMoeExecutor(expert_banks({0: layer}, SILU_CLAMP), threads=2)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    ids, w = routing(rng, 3, 4, 2)
    out = ex.forward(0, x, ids, w)
    assert rel_err(out, reference(layer, Activation("silu"), x.astype(np.float64), ids, w)) > 0.05


@pytest.mark.parametrize("name, options", [("bf16", {}), ("nvfp4", {}), ("gguf", {"gate_up_type": "Q4_K", "down_type": "Q6_K"})])
def test_bf16_hidden_states(rng, name, options):
    err, _, _ = _check_format(rng, name, options, SILU_CLAMP, False, dtype="bf16")
    assert err < RTOL_BF16, f"{name}: relative error {err:.3g} with bf16 hidden states"


def test_torch_bf16_and_float32_tensors(rng):
    torch = pytest.importorskip("torch")
    layer = random_layer("mxfp4", 256, 128, 4, rng, biases=True)
    ex = CpuMoeExecutor(expert_banks({0: layer}, SWIGLU), threads=2)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    ids, w = routing(rng, 4, 4, 2)
    ref = reference(layer, SWIGLU, x.astype(np.float64), ids, w)
    out = ex.forward(0, torch.from_numpy(x), torch.from_numpy(ids), torch.from_numpy(w))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert rel_err(out.numpy(), ref) < RTOL_F32
    xb = torch.from_numpy(x).to(torch.bfloat16)
    out = ex.forward(0, xb, torch.from_numpy(ids).to(torch.int32), torch.from_numpy(w))
    assert out.dtype == torch.bfloat16
    refb = reference(layer, SWIGLU, xb.float().numpy().astype(np.float64), ids, w)
    assert rel_err(out.float().numpy(), refb) < RTOL_BF16


def test_torch_banks_zero_copy(rng):
    torch = pytest.importorskip("torch")
    layer = random_layer("bf16", 256, 128, 4, rng)
    banks = expert_banks({0: layer}, SILU_CLAMP)
    # the pinned loader's view: torch tensors (bf16 as torch.bfloat16)
    banks.banks = {n: {l: torch.from_numpy(a).view(torch.bfloat16) if a.dtype == np.uint16 else torch.from_numpy(a)
                       for l, a in per.items()} for n, per in banks.banks.items()}
    ex = CpuMoeExecutor(banks, threads=2)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    ids, w = routing(rng, 2, 4, 2)
    before = ex.forward(0, x, ids, w)
    assert rel_err(before, reference(layer, SILU_CLAMP, x.astype(np.float64), ids, w)) < RTOL_F32
    # the executor reads the tensor's memory, not a copy: changing the bank changes the output
    banks.banks["down"][0].mul_(2)
    after = ex.forward(0, x, ids, w)
    np.testing.assert_allclose(after, 2 * before, rtol=1e-5, atol=1e-3)


def test_prefill_and_decode_sizes(rng):
    # T = 1 (decode) and T = 130 tokens with k = 4 of 8 experts: > kMaxTokens (64) tokens per expert
    layer = random_layer("fp8_block", 256, 128, 8, rng)
    ex = CpuMoeExecutor(expert_banks({0: layer}, SILU_CLAMP), threads=2)
    for T in (1, 130):
        x = rng.standard_normal((T, 256)).astype(np.float32)
        ids, w = routing(rng, T, 8, 4)
        out = ex.forward(0, x, ids, w)
        assert rel_err(out, reference(layer, SILU_CLAMP, x.astype(np.float64), ids, w)) < RTOL_F32


def test_repeated_expert_in_a_token(rng):
    # the same expert twice in one token's routing counts twice
    layer = random_layer("bf16", 256, 128, 4, rng)
    ex = CpuMoeExecutor(expert_banks({0: layer}, SILU_CLAMP), threads=1)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    ids, w = np.array([[2, 2]]), np.array([[0.25, 0.5]], dtype=np.float32)
    out = ex.forward(0, x, ids, w)
    assert rel_err(out, reference(layer, SILU_CLAMP, x.astype(np.float64), ids, w)) < RTOL_F32


@pytest.mark.parametrize("scale_fmt", ["ue8m0", "float"])
def test_ds_fp4_e4m3_activations(rng, scale_fmt):
    errs = []
    for _ in range(3):
        layer = random_layer("ds_fp4", 512, 256, 6, rng, {"act_block": 128, "scale_fmt": scale_fmt})
        ex = CpuMoeExecutor(expert_banks({0: layer}, SILU_CLAMP), threads=2, act_quant=True)
        x = rng.standard_normal((4, 512)).astype(np.float32)
        ids, w = routing(rng, 4, 6, 2)
        out = ex.forward(0, x, ids, w)
        ref = reference(layer, SILU_CLAMP, x.astype(np.float64), ids, w, act_quant=(128, scale_fmt == "ue8m0"))
        errs.append(rel_err(out, ref))
        # and the mode matters: without it the output differs by far more than the tolerance
        plain = reference(layer, SILU_CLAMP, x.astype(np.float64), ids, w)
        assert rel_err(out, plain) > 1e-3
    assert max(errs) < 1e-2 and float(np.median(errs)) < RTOL_F32, errs


def test_mixed_model_from_samples(tmp_path, rng):
    """bf16, NVFP4 and GGUF layers of several type pairs in one ExpertBanks (merge_expert_banks
    of converted samples), each layer computed in its own format; reference from the banks."""
    from ftw.formats import get_format
    from ftw.writers.convert import convert

    root = os.path.join(os.path.dirname(__file__), "..", "samples")
    parts = []
    # layer offsets keep the parts' layer numbers apart
    for i, src in enumerate(["st/mixed_ct_bf16_nvfp4", "gguf/qwen3moe-Q4_K_M.gguf", "gguf/deepseek2-mixed-gate-up.gguf"]):
        dst = tmp_path / f"part{i}.ftw"
        convert(os.path.join(root, src), dst)
        part = ftw.load_expert_banks(dst)
        off = 100 * i
        part.banks = {n: {l + off: a for l, a in per.items()} for n, per in part.banks.items()}
        part.layer_formats = {l + off: f for l, f in part.layer_formats.items()}
        part.model = None  # the samples differ in H: each layer's H and I come from its banks
        parts.append(part)
    merged = ftw.merge_expert_banks(parts)
    formats = {l: f for l, f in merged.layer_formats.items()}
    assert {f.name for f in formats.values()} == {"bf16", "nvfp4", "gguf"}
    pairs = {tuple(sorted(f.options.items())) for f in formats.values() if f.name == "gguf"}
    assert len(pairs) >= 3, pairs  # Q4_K/Q6_K, Q4_K/Q4_K, Q3_K+Q4_K/Q5_K, ...
    act = Activation("silu")
    ex = CpuMoeExecutor(merged, threads=2, activation=act)
    assert ex.num_formats == 2 + len(pairs)  # one kernel object per distinct (format, options)
    for layer, lf in formats.items():
        H, I = ex.dims[layer]  # noqa: E741
        cls = get_format(lf.name)
        present = {n: per[layer] for n, per in merged.banks.items() if per[layer].size}

        def weights(e):
            return cls.decode({n: a[e] for n, a in present.items()}, H, I, dict(lf.options))

        x = rng.standard_normal((3, H)).astype(np.float32)
        ids, w = routing(rng, 3, merged.num_experts, 2)
        out = ex.forward(layer, x, ids, w)
        ref = reference_from(weights, H, act, x.astype(np.float64), ids, w)
        assert rel_err(out, ref) < RTOL_F32, (layer, lf, rel_err(out, ref))


# -- refusals --------------------------------------------------------------------------------


@pytest.fixture
def small(rng):
    layer = random_layer("nvfp4", 64, 32, 4, rng)
    return layer, CpuMoeExecutor(expert_banks({5: layer}, SILU_CLAMP), threads=2)


def test_refuses_wrong_hidden_shape_and_dtype(small, rng):
    _, ex = small
    ids, w = routing(rng, 2, 4, 2)
    with pytest.raises(FormatError, match=r"hidden must be \[T, H=64\] float32 or bf16"):
        ex.forward(5, np.zeros((2, 63), np.float32), ids, w)
    with pytest.raises(FormatError, match=r"got float64 \[2, 64\]"):
        ex.forward(5, np.zeros((2, 64)), ids, w)
    with pytest.raises(FormatError, match="hidden must be"):
        ex.forward(5, np.zeros((64,), np.float32), ids, w)
    with pytest.raises(FormatError, match="C-contiguous"):
        ex.forward(5, np.zeros((2, 128), np.float32)[:, ::2], ids, w)
    with pytest.raises(FormatError, match="numpy array or a torch"):
        ex.forward(5, [[0.0] * 64] * 2, ids, w)


def test_refuses_wrong_routing(small, rng):
    _, ex = small
    x = rng.standard_normal((2, 64)).astype(np.float32)
    ids, w = routing(rng, 2, 4, 2)
    with pytest.raises(FormatError, match=r"topk_ids must be \[T=2, k\] int32 or int64"):
        ex.forward(5, x, ids[:1], w)
    with pytest.raises(FormatError, match="topk_ids must be"):
        ex.forward(5, x, ids.astype(np.float32), w)
    with pytest.raises(FormatError, match=r"topk_weights must be \[T=2, k=2\] float32"):
        ex.forward(5, x, ids, w.astype(np.float64))
    with pytest.raises(FormatError, match=r"topk_ids\[1, 0\] = 4 is not an expert id in \[0, 4\)"):
        ex.forward(5, x, np.array([[0, 1], [4, 2]]), w)
    with pytest.raises(FormatError, match=r"= -1 is not an expert id"):
        ex.forward(5, x, np.array([[0, -1], [3, 2]], dtype=np.int32), w)
    with pytest.raises(FormatError, match="no MoE layer 6"):
        ex.forward(6, x, ids, w)


def test_refuses_unsupported_format_and_type_at_construction(rng):
    layer = random_layer("bf16", 64, 32, 4, rng)
    banks = expert_banks({2: layer, 7: random_layer("nvfp4", 64, 32, 4, rng)}, SILU_CLAMP)
    banks.layer_formats[7] = ftw.LayerFormat.from_json({"name": "nvfp8_future"}, "test")  # a newer writer's format
    with pytest.raises(UnsupportedError, match="layer 7: format 'nvfp8_future' has no CPU kernel"):
        CpuMoeExecutor(banks)
    # a ggml type the runtime has no kernel for (TQ1_0 is a real gguf type)
    g = random_layer("gguf", 256, 256, 2, rng, {"gate_up_type": "Q8_0", "down_type": "Q8_0"})
    banks = expert_banks({4: g}, SILU_CLAMP)
    banks.layer_formats[4] = ftw.LayerFormat.from_json(
        {"name": "gguf", "options": {"gate_up_type": "Q8_0", "down_type": "TQ1_0"}}, "test")
    with pytest.raises(FtwError, match=r"layer 4 .*TQ1_0"):
        CpuMoeExecutor(banks)


def test_refuses_banks_that_do_not_match_the_format(rng):
    layer = random_layer("mxfp8", 64, 32, 4, rng)
    banks = expert_banks({1: layer}, SILU_CLAMP)
    banks.banks["down_scale"][1] = banks.banks["down_scale"][1][:, :32].copy()  # [E, H/2, I/32]
    with pytest.raises(FormatError, match="layer 1 .*down_scale"):
        CpuMoeExecutor(banks)
    banks = expert_banks({1: random_layer("mxfp8", 64, 32, 4, rng)}, SILU_CLAMP)
    banks.banks["gate_up"][1] = banks.banks["gate_up"][1].astype(np.float32)
    with pytest.raises(FormatError, match="layer 1 .*gate_up"):
        CpuMoeExecutor(banks)


def test_cpp_registry_lists_the_python_registry():
    assert sorted(cpu_formats()) == sorted(FORMATS)
    assert ftw.runtime.build_info()["cpu_formats"] == cpu_formats()


def test_cpp_bank_needs_agree_with_the_format_classes(rng):
    # every format's C++ kernel accepts exactly the banks its Python class declares: random
    # banks built from the class (bank_factory) are accepted, for each case above
    for name, options, act, biases in CASES:
        layer = random_layer(name, 256, 256, 2, rng, options, biases=biases)
        CpuMoeExecutor(expert_banks({0: layer}, act), threads=1)


# -- the check's roundtrip helper ----------------------------------------------------------


def test_roundtrip_cpu_agrees_and_catches_a_wrong_expert(rng):
    from ftw.runtime.roundtrip import roundtrip_cpu

    layer = random_layer("nvfp4", 256, 128, 6, rng)
    ex = CpuMoeExecutor(expert_banks({2: layer}, SILU_CLAMP), threads=2)
    weights = {e: layer.weights(e) for e in (0, 2, 3, 5)}  # a sample of the experts, as check takes
    got = roundtrip_cpu(ex, 2, weights, SILU_CLAMP, rng, steps=3)
    assert got["max_rel_err"] < RTOL_F32 and got["tokens"] >= 3 and got["steps"] == 3
    # a source expert that differs from the file's (one weight row changed) is caught
    weights[3] = dict(weights[3], down=weights[3]["down"].copy())
    weights[3]["down"][7] *= 1.5
    bad = roundtrip_cpu(ex, 2, weights, SILU_CLAMP, rng, steps=6)
    assert bad["max_rel_err"] > 1e-3
