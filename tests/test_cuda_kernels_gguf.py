"""GGUF layers on the GPU (csrc/formats/gguf/decoders.cuh) against the float64 reference.

Every test needs a GPU (marked `gpu`, skipped elsewhere). Rows are fresh random ggml blocks (random
quant bytes, random positive scales in each type's f16/e8m0 scale fields); the reference is
gguf.quants' own dequantization of those bytes (ftw.formats.get_format("gguf").decode), in
float64, with x rounded to bf16 as the kernel rounds it.

Tolerance, as ||out - ref|| / ||ref|| over the whole [T, H] output: REL_TOL = 8e-3. The
table-driven decoder decodes each 32-value sub-block bit-exactly to ggml's float32 values, then
rounds them to bf16 (<= 2^-9 relative per weight: ggml scales carry 11 significant bits, bf16 8);
the typed decoders compute in bf16 (the sub-block's scale rounded to bf16, then the product
rounded: <= about 2^-8 per weight, the scale's share common to the sub-block; the types with mins
take the min's integer multiple of the scale off exactly (Q4_K, Q2_K) or carry scale and min to 16
bits (Q5_K), so no rounding of the min's size is common to a sub-block); the activation between
gate_up and down is stored as bf16 too; products accumulate in float32. Q8_0's decode steps
round gate_up's weights (FTW_GGUF_CUDA_Q8_F16=both: down's too) once to f16 instead (2^-11), x
(and act) exact in f16 rows scaled by a power of two each. Independent roundings of
gate, up, act and down give about 2.5e-3 expected (3.5-5e-3 measured with the typed decoders); a
wrong block layout gives errors of order 1. Run with -s to print the measured error of every case.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from gguf import quants  # noqa: E402
from gguf.constants import GGMLQuantizationType as Q  # noqa: E402

from ftw.errors import UnsupportedError  # noqa: E402
from ftw.formats import Activation, LayerFormat, get_format  # noqa: E402
from ftw.formats.ggml_types import ggml_type_named  # noqa: E402
from ftw.runtime import cuda_experts as ce  # noqa: E402

if "gguf" not in ce.cuda_formats():
    pytest.skip("ftw._runtime was built without the gguf CUDA kernels", allow_module_level=True)

REL_TOL = 8e-3
TYPES = ["Q8_0", "Q4_K", "Q6_K", "Q5_K", "Q4_0", "MXFP4", "IQ4_NL", "IQ4_XS", "Q5_0", "Q4_1", "Q5_1",
         "Q2_K", "Q3_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ3_S"]

# byte offsets of each type's f16 scale fields in a block: (d fields, offset fields (m / dmin))
SCALES = {"Q8_0": ([0], []), "Q4_0": ([0], []), "Q4_1": ([0], [2]), "Q5_0": ([0], []), "Q5_1": ([0], [2]),
          "IQ4_NL": ([0], []), "Q2_K": ([80], [82]), "Q3_K": ([108], []), "Q4_K": ([0], [2]),
          "Q5_K": ([0], [2]), "Q6_K": ([208], []), "IQ4_XS": ([0], []), "IQ2_XXS": ([0], []),
          "IQ2_XS": ([0], []), "IQ3_XXS": ([0], []), "IQ3_S": ([0], [])}
SILU = Activation("silu")


def test_every_ggml_type_has_a_cuda_decoder():
    assert ce.cuda_ggml_types() == TYPES


def _decode(blocks: np.ndarray, name: str, n: int) -> np.ndarray:
    return quants.dequantize(blocks.reshape(-1, blocks.shape[-1]), Q[name]).reshape(*blocks.shape[:-1], n)


def ggml_rows(name: str, rows: int, n: int, rng: np.random.Generator, spread: float = 3.0) -> np.ndarray:
    """[rows, row bytes] of random `name` blocks whose values have a standard deviation near
    spread / sqrt(n), so a dot with a unit-normal x of n values comes out near `spread`."""
    t = ggml_type_named(name)
    nb = n // t.block
    b = rng.integers(0, 256, (rows, nb, t.nbytes), dtype=np.uint8)
    if name == "MXFP4":
        b[..., 0] = 128  # 1.0: measure the spread, then pick exponents
        s1 = float(np.std(_decode(b.reshape(rows, -1), name, n)))
        e = 127 + int(np.round(np.log2(spread / np.sqrt(n) / s1))) + 1
        b[..., 0] = rng.integers(e - 1, e + 2, (rows, nb))
        return b.reshape(rows, -1)
    d_at, m_at = SCALES[name]
    one = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    for off in d_at + m_at:
        b[..., off:off + 2] = one
    s1 = float(np.std(_decode(b.reshape(rows, -1), name, n)))
    d = (spread / np.sqrt(n) / s1 * rng.uniform(0.5, 1.5, (rows, nb))).astype(np.float16)
    for off in d_at:
        b[..., off:off + 2] = d.view(np.uint8).reshape(rows, nb, 2)
    for off in m_at:  # Q4_1/Q5_1 m (added) and K-quant dmin (subtracted): of the order of d's effect
        m = (d.astype(np.float32) * rng.uniform(-8.0, 8.0, (rows, nb)) if name in ("Q4_1", "Q5_1")
             else d.astype(np.float32) * rng.uniform(0.5, 2.0, (rows, nb))).astype(np.float16)
        b[..., off:off + 2] = m.view(np.uint8).reshape(rows, nb, 2)
    return b.reshape(rows, -1)


def gguf_layer(types, H, I, E, rng, spread=3.0):  # noqa: E741
    """(options, banks) of one gguf layer: types = (gate, up, down)."""
    gate, up, down = types
    g = np.stack([ggml_rows(gate, I, H, rng, spread) for _ in range(E)])
    u = np.stack([ggml_rows(up, I, H, rng, spread) for _ in range(E)])
    d = np.stack([ggml_rows(down, H, I, rng, spread) for _ in range(E)])
    if gate == up:
        opts = {"gate_up_type": gate, "down_type": down}
        gu = np.concatenate([g, u], axis=1)  # [E, 2I, row bytes]
    else:
        opts = {"gate_type": gate, "up_type": up, "down_type": down}
        gu = np.concatenate([g.reshape(E, -1), u.reshape(E, -1)], axis=1)  # one flat byte row per expert
    return opts, {"gate_up": gu, "down": d}


def reference(opts, banks, H, I, x64, ids, wts, act=SILU):  # noqa: E741
    fmt = get_format("gguf")
    cache = {}
    out = np.zeros((x64.shape[0], H))
    for t in range(x64.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            if e not in cache:
                cache[e] = fmt.decode({n: v[e] for n, v in banks.items()}, H, I, opts)
            w = cache[e]
            out[t] += float(wts[t, k]) * (w["down"] @ act.apply(w["gate"] @ x64[t], w["up"] @ x64[t]))
    return out


def routing(T, K, E, rng):
    ids = np.stack([rng.choice(E, K, replace=False) for _ in range(T)]).astype(np.int32)
    return ids, rng.uniform(0.05, 1.0, (T, K)).astype(np.float32)


def bf16_x(T, H, rng):
    x = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32)).to(torch.bfloat16)
    return x.cuda(), x.float().double().numpy()


def rel_err(out, ref) -> float:
    o = out.double().cpu().numpy()
    assert np.isfinite(o).all(), "non-finite output"
    return float(np.linalg.norm(o - ref) / np.linalg.norm(ref))


def run(opts, banks, x, ids, wts, act=SILU):
    view = ce.identity_view(LayerFormat.of("gguf", opts), banks)
    return ce.experts_forward(view, x, torch.from_numpy(ids).cuda(), torch.from_numpy(wts).cuda(), act)


def check(types, T, seed, H=512, I=256, E=8, K=4):  # noqa: E741
    rng = np.random.default_rng(seed)
    opts, banks = gguf_layer(types, H, I, E, rng)
    x, x64 = bf16_x(T, H, rng)
    ids, wts = routing(T, K, E, rng)
    err = rel_err(run(opts, banks, x, ids, wts), reference(opts, banks, H, I, x64, ids, wts))
    print(f"gguf cuda accuracy {'/'.join(types)} T={T}: {err:.2e}")
    assert err < REL_TOL, f"{types} T={T}: {err:.3g}"


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("T", [1, 5, 40])  # decode (T <= 8) and the routed prefill path
def test_every_type_against_gguf_quants(name, T):
    check((name, name, name), T, [T, TYPES.index(name)])


# the types with a decoder of their own, and its three ways of having a unit's bytes at hand
# (FTW_GGUF_CUDA_DECODER; the default picks one per type, the others are run here)
FAST = [t for t in TYPES if t not in ("Q5_0", "Q4_1", "Q5_1")]
KINDS = ["staged", "loaded", "prefetched"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", FAST)
def test_every_way_of_loading(name, kind, monkeypatch):
    monkeypatch.setenv("FTW_GGUF_CUDA_DECODER", kind)
    check((name, name, name), 3, [3, TYPES.index(name), KINDS.index(kind)])


# the types whose default decode is register-fed (no kStaged): experts_decode's shaped loop
# (ShapedDecoder: x loaded at use, units refilled once decoded, unpredicated loads, phase 1 a
# programmatic dependent launch), or the legacy loop with FTW_CUDA_REGISTER_SHAPE=legacy
REGISTER_FED = ["Q8_0", "Q4_0", "IQ4_NL", "MXFP4", "IQ4_XS", "IQ3_XXS"]


@pytest.mark.parametrize("loop", ["shaped", "legacy"])
@pytest.mark.parametrize("name", REGISTER_FED)
def test_register_fed_decode_in_either_loop(name, loop, monkeypatch):
    """Both loops decode the same values. The 32-value types run rows of 352 and 160 values: a
    last chunk of 3 units of 4, whose missing unit the shaped loop reads from the row's last unit
    (unpredicated) and must meet zero x; the 256-value types as many rows as their blocks allow."""
    if loop == "legacy":
        monkeypatch.setenv("FTW_CUDA_REGISTER_SHAPE", "legacy")
    size = {"H": 352, "I": 160} if name not in ("IQ4_XS", "IQ3_XXS") else {"H": 768, "I": 256}
    check((name, name, name), 3, [7, TYPES.index(name), loop == "legacy"], **size)


# the types with mins and the two ways their decoders apply scale and min (FTW_GGUF_CUDA_MIN; the
# default picks one per type, both are run here): hilo (scale and min as bf16 hi + lo pairs),
# shift (the min's integer multiple of the scale taken off the quant exactly, the scale rounded once)
MIN_FORMS = ["hilo", "shift"]


@pytest.mark.parametrize("form", MIN_FORMS)
@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q2_K"])
@pytest.mark.parametrize("T", [3, 40])
def test_every_way_of_applying_the_min(name, form, T, monkeypatch):
    monkeypatch.setenv("FTW_GGUF_CUDA_MIN", form)
    check((name, name, name), T, [T, TYPES.index(name), 10 + MIN_FORMS.index(form)])


@pytest.mark.parametrize("loads", ["generic", "shared"])
@pytest.mark.parametrize("name", FAST)
def test_staged_kernel_reading_its_ring_either_way(name, loads, monkeypatch):
    """FTW_GGUF_CUDA_SHARED=generic | shared (the default picks one per type): the staged kernel's
    loads of the ring through generic addresses (8-byte spans) or ld.shared (4-byte words shifted
    into place) decode the same values."""
    monkeypatch.setenv("FTW_GGUF_CUDA_DECODER", "staged")
    monkeypatch.setenv("FTW_GGUF_CUDA_SHARED", loads)
    check((name, name, name), 4, [4, TYPES.index(name), 6])


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "IQ4_NL", "MXFP4"])
def test_staged_rows_ending_in_a_partial_chunk(name, monkeypatch):
    """H and I not multiples of 256: a row's last 256-value chunk holds fewer than 8 blocks; the
    staged kernel copies up to the row's end only and decodes the missing units as zeros (the bytes
    after a row's end in its last 16-byte piece belong to the next row)."""
    monkeypatch.setenv("FTW_GGUF_CUDA_DECODER", "staged")
    check((name, name, name), 2, [5, TYPES.index(name)], H=352, I=160)


@pytest.mark.parametrize("types", [("Q6_K", "Q6_K", "Q8_0"), ("IQ3_S", "IQ3_S", "MXFP4")])
def test_staged_ring_runs_across_items(types, monkeypatch):
    """More (expert, band) items than the persistent grid has blocks: each block serves several,
    its ring of stages running on from one item's rows into the next's."""
    monkeypatch.setenv("FTW_GGUF_CUDA_DECODER", "staged")
    check(types, 8, [6, sum(map(ord, "".join(types)))], H=2048, I=512, E=16, K=8)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K", "Q6_K", "MXFP4", "IQ2_XS", "Q3_K"])
def test_banks_off_16_byte_boundaries_take_the_table_driven_decoder(name):
    """The launch gives a type its own decoder only where the bank base and slot stride are 16-byte
    aligned; banks starting 2 bytes past a boundary run the table-driven decoder, within the same
    tolerance."""
    rng = np.random.default_rng([7, TYPES.index(name)])
    H, I, E, K, T = 512, 256, 8, 4, 3  # noqa: E741
    opts, banks = gguf_layer((name, name, name), H, I, E, rng)
    x, x64 = bf16_x(T, H, rng)
    ids, wts = routing(T, K, E, rng)
    view = ce.identity_view(LayerFormat.of("gguf", opts), banks)
    shifted = {}
    for k, t in view.banks.items():
        buf = torch.empty(t.numel() + 2, dtype=torch.uint8, device=t.device)
        shifted[k] = buf[2:].view(t.shape)
        shifted[k].copy_(t)
        assert shifted[k].data_ptr() % 16 == 2
    out = ce.experts_forward(ce.LayerView(view.format, shifted, view.slot_of_expert), x,
                             torch.from_numpy(ids).cuda(), torch.from_numpy(wts).cuda(), SILU)
    err = rel_err(out, reference(opts, banks, H, I, x64, ids, wts))
    print(f"gguf cuda accuracy {name} (banks off 16-byte boundaries) T={T}: {err:.2e}")
    assert err < REL_TOL


@pytest.mark.parametrize("types", [("Q4_K", "Q6_K", "Q8_0"), ("IQ2_XS", "IQ3_S", "Q2_K"),
                                   ("MXFP4", "Q5_1", "IQ4_XS"), ("Q3_K", "IQ2_XXS", "IQ3_XXS")])
@pytest.mark.parametrize("T", [2, 40])
def test_gate_and_up_of_different_types(types, T):
    check(types, T, [99, T, sum(map(ord, "".join(types)))])


def test_agrees_with_the_cpu_executor():
    from ftw.loader import ExpertBanks
    from ftw.runtime import CpuMoeExecutor

    rng = np.random.default_rng(17)
    H, I, E, K, T = 512, 256, 8, 4, 6  # noqa: E741
    for types in [("Q4_K", "Q4_K", "Q6_K"), ("IQ3_S", "Q5_0", "MXFP4")]:
        opts, banks = gguf_layer(types, H, I, E, rng)
        x, x64 = bf16_x(T, H, rng)
        ids, wts = routing(T, K, E, rng)
        layer = ExpertBanks({k: {0: v} for k, v in banks.items()}, {0: LayerFormat.of("gguf", opts)}, E)
        cpu = CpuMoeExecutor(layer, threads=4, activation=SILU).forward(0, x64.astype(np.float32), ids, wts)
        err = rel_err(run(opts, banks, x, ids, wts), np.asarray(cpu, dtype=np.float64))
        print(f"gguf cuda vs cpu executor {'/'.join(types)}: {err:.2e}")
        assert err < REL_TOL


def test_model_mixing_four_type_pairs_through_one_bank_set():
    """Four gguf layers of four type pairs merged into one union bank set (merge_expert_banks);
    hidden states flow layer to layer."""
    from ftw.loader import ExpertBanks, merge_expert_banks

    rng = np.random.default_rng(21)
    H, I, E, K, T = 512, 256, 8, 4, 3  # noqa: E741
    pairs = [("Q4_K", "Q4_K", "Q6_K"), ("Q8_0", "Q8_0", "Q8_0"), ("IQ2_XS", "IQ2_XS", "IQ4_NL"),
             ("Q3_K", "Q4_K", "Q5_K")]
    parts, made = [], {}
    for layer, types in enumerate(pairs):
        opts, banks = gguf_layer(types, H, I, E, rng, spread=2.0)
        made[layer] = (opts, banks)
        parts.append(ExpertBanks({k: {layer: v} for k, v in banks.items()}, {layer: LayerFormat.of("gguf", opts)}, E))
    merged = merge_expert_banks(parts)
    x, x64 = bf16_x(T, H, rng)
    for layer, (opts, banks) in made.items():
        fmt = merged.layer_formats[layer]
        layer_banks = {k: merged.banks[k][layer] for k in get_format("gguf").bank_names if k in merged.banks}
        ids, wts = routing(T, K, E, rng)
        out = ce.experts_forward(ce.identity_view(fmt, layer_banks), x, torch.from_numpy(ids).cuda(),
                                 torch.from_numpy(wts).cuda(), SILU)
        err = rel_err(out, reference(opts, banks, H, I, x64, ids, wts))
        print(f"gguf cuda mixed model layer {layer} {'/'.join(pairs[layer])}: {err:.2e}")
        assert err < REL_TOL, f"layer {layer} {pairs[layer]}"
        nxt = (out / out.norm(dim=1, keepdim=True) * np.sqrt(H)).to(torch.bfloat16)
        x, x64 = nxt, nxt.float().double().cpu().numpy()


# ---- Q8_0 on the f16 mma (decoders.cuh: Fast<Q8_0>::decode_f16, experts_kernels.cuh "f16 rows") ----
# A decode step's Q8_0 gate_up (FTW_GGUF_CUDA_Q8_F16=both: and down) decodes to f16 (q * d rounded
# once to 11 bits) for mma in f16, x (and act) entering as f16 rows scaled by a power of two each,
# where the workspace has room (asked with H; experts_forward's own does); FTW_GGUF_CUDA_Q8_F16=0
# keeps the bf16 decode for both. Each test runs both f16 modes.
F16_MODES = ["gate_up", "both"]


def f16_mode(monkeypatch, mode):
    if mode == "both":
        monkeypatch.setenv("FTW_GGUF_CUDA_Q8_F16", "both")
    else:
        monkeypatch.delenv("FTW_GGUF_CUDA_Q8_F16", raising=False)


def q8_step(T, seed, x_scale=None, types=("Q8_0", "Q8_0", "Q8_0"), H=512, I=256, E=8, K=4, d_scale=None):  # noqa: E741
    """(opts, banks, x, x64, ids, wts) of one step; x_scale: a power of two per token; d_scale:
    a factor on the f16 d of every other block of every Q8_0 row (blocks far apart in size)."""
    rng = np.random.default_rng(seed)
    opts, banks = gguf_layer(types, H, I, E, rng)
    if d_scale is not None:
        for name, n in (("gate_up", H), ("down", I)):
            if types[2 if name == "down" else 0] != "Q8_0":
                continue
            b = banks[name].reshape(*banks[name].shape[:-1], n // 32, 34)
            d = b[..., ::2, 0:2].copy().view(np.float16).astype(np.float32) * d_scale
            b[..., ::2, 0:2] = d.astype(np.float16).view(np.uint8)
    x, x64 = bf16_x(T, H, rng)
    if x_scale is not None:
        s = np.asarray(x_scale, dtype=np.float64)[:, None]
        x = (x.float() * torch.from_numpy(s).float().cuda()).to(torch.bfloat16)  # powers of two: exact
        x64 = x64 * s
    ids, wts = routing(T, K, E, rng)
    return opts, banks, x, x64, ids, wts


def rel_err_rows(out, ref) -> float:
    """The largest of the tokens' relative errors (tokens far apart in size each count)."""
    o = out.double().cpu().numpy()
    assert np.isfinite(o).all(), "non-finite output"
    return float(max(np.linalg.norm(o[t] - ref[t]) / np.linalg.norm(ref[t]) for t in range(len(ref))))


@pytest.mark.parametrize("mode", F16_MODES)
@pytest.mark.parametrize("T", [1, 3, 8])
def test_q8_0_on_the_f16_mma(T, mode, monkeypatch):
    """Within the tolerance, and more accurate than the bf16 decode of the same step (its weights
    rounded to 8 bits rather than 11): the f16 path ran (both: 1.4-1.8e-3 against 4.6-4.9e-3
    measured; gate_up alone keeps down's and act's bf16 roundings)."""
    f16_mode(monkeypatch, mode)
    opts, banks, x, x64, ids, wts = q8_step(T, [31, T])
    ref = reference(opts, banks, 512, 256, x64, ids, wts)
    err = rel_err(run(opts, banks, x, ids, wts), ref)
    monkeypatch.setenv("FTW_GGUF_CUDA_Q8_F16", "0")
    err_bf16 = rel_err(run(opts, banks, x, ids, wts), ref)
    print(f"gguf cuda accuracy Q8_0 T={T} ({mode}): f16 {err:.2e}, bf16 {err_bf16:.2e}")
    assert err < REL_TOL
    assert err < (0.8 if mode == "both" else 1.0) * err_bf16


@pytest.mark.parametrize("mode", F16_MODES)
def test_q8_0_f16_rows_of_tokens_far_apart(mode, monkeypatch):
    """Tokens 2^24, 2^-24, 1 and 2^12 in one step: each row of x and act takes its own power of
    two into f16, so each token is as accurate as alone; blocks whose d is 2^-12 of their row's
    others (products near f16's subnormals) and T = 8 too."""
    f16_mode(monkeypatch, mode)
    opts, banks, x, x64, ids, wts = q8_step(4, [32, 4], x_scale=[2.0**24, 2.0**-24, 1.0, 2.0**12])
    err = rel_err_rows(run(opts, banks, x, ids, wts), reference(opts, banks, 512, 256, x64, ids, wts))
    print(f"gguf cuda accuracy Q8_0 ({mode}) tokens 2^24, 2^-24, 1, 2^12: {err:.2e} (worst token)")
    assert err < REL_TOL
    scales = [2.0**24, 2.0**-24, 1.0, 2.0**12, 2.0**-40, 2.0**40, 0.5, 4.0]  # act ~ x^2 stays a normal bf16
    opts, banks, x, x64, ids, wts = q8_step(8, [33, 8], x_scale=scales, d_scale=2.0**-12)
    err = rel_err_rows(run(opts, banks, x, ids, wts), reference(opts, banks, 512, 256, x64, ids, wts))
    print(f"gguf cuda accuracy Q8_0 ({mode}) T=8 tokens 2^-40 .. 2^40, small blocks: {err:.2e} (worst token)")
    assert err < REL_TOL


@pytest.mark.parametrize("mode", F16_MODES)
@pytest.mark.parametrize("types", [("Q8_0", "Q8_0", "Q4_K"), ("Q6_K", "Q6_K", "Q8_0"), ("Q8_0", "Q4_K", "Q8_0")])
def test_q8_0_f16_phase_next_to_other_decoders(types, mode, monkeypatch):
    """One phase on the f16 mma, the other on another kernel (staged, register-fed bf16, or gate !=
    up's table-driven decoder): the f16 rows of act wait for whichever phase 0 ran."""
    f16_mode(monkeypatch, mode)
    opts, banks, x, x64, ids, wts = q8_step(3, [34, sum(map(ord, "".join(types)))], types=types)
    err = rel_err(run(opts, banks, x, ids, wts), reference(opts, banks, 512, 256, x64, ids, wts))
    print(f"gguf cuda accuracy {'/'.join(types)} T=3: {err:.2e}")
    assert err < REL_TOL


@pytest.mark.parametrize("mode", F16_MODES)
def test_q8_0_without_room_for_f16_rows_decodes_to_bf16(mode, monkeypatch):
    """A workspace asked without H has no room for the f16 rows: the bf16 decode, the values of
    FTW_GGUF_CUDA_Q8_F16=0 (up to the order of down's atomic adds), not the f16 decode's (which
    differ by ~4e-3)."""
    f16_mode(monkeypatch, mode)
    opts, banks, x, x64, ids, wts = q8_step(2, [35])
    view = ce.identity_view(LayerFormat.of("gguf", opts), banks)
    ws = torch.empty(ce._runtime.cuda_experts_workspace_bytes(2, 4, 256, 8), dtype=torch.uint8, device="cuda")
    assert ws.numel() < ce._runtime.cuda_experts_workspace_bytes(2, 4, 256, 8, 512)
    out = ce.experts_forward(view, x, torch.from_numpy(ids).cuda(), torch.from_numpy(wts).cuda(), SILU, ws=ws)
    f16 = run(opts, banks, x, ids, wts)
    monkeypatch.setenv("FTW_GGUF_CUDA_Q8_F16", "0")
    bf16 = run(opts, banks, x, ids, wts).double().cpu().numpy()
    assert rel_err(out, bf16) < 1e-6 < rel_err(f16, bf16)
    assert rel_err(out, reference(opts, banks, 512, 256, x64, ids, wts)) < REL_TOL


@pytest.mark.parametrize("mode", F16_MODES)
def test_q8_0_f16_decode_step_in_a_cuda_graph(mode, monkeypatch):
    """Both phases with their f16 rows captured once, replayed with new x (tokens far apart) and
    routing."""
    f16_mode(monkeypatch, mode)
    rng = np.random.default_rng(36)
    H, I, E, K, T = 512, 256, 16, 8, 4  # noqa: E741
    opts, banks = gguf_layer(("Q8_0", "Q8_0", "Q8_0"), H, I, E, rng)
    view = ce.identity_view(LayerFormat.of("gguf", opts), banks)
    x = torch.zeros((T, H), dtype=torch.bfloat16, device="cuda")
    ids = torch.from_numpy(routing(T, K, E, rng)[0]).cuda()
    wts = torch.zeros((T, K), dtype=torch.float32, device="cuda")
    out = torch.empty((T, H), dtype=torch.float32, device="cuda")
    ws = torch.empty(ce._runtime.cuda_experts_workspace_bytes(T, K, I, E, H), dtype=torch.uint8, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside capture
        ce.experts_forward(view, x, ids, wts, "silu", out=out, ws=ws, check=False)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ce.experts_forward(view, x, ids, wts, "silu", out=out, ws=ws, check=False)
    for step in range(3):
        scale = np.asarray([2.0**12, 1.0, 2.0**-24, 2.0**(6 * step)])[:, None]
        xs, x64 = bf16_x(T, H, rng)
        xs = (xs.float() * torch.from_numpy(scale).float().cuda()).to(torch.bfloat16)
        i_np, w_np = routing(T, K, E, rng)
        x.copy_(xs), ids.copy_(torch.from_numpy(i_np)), wts.copy_(torch.from_numpy(w_np))
        graph.replay()
        torch.cuda.synchronize()
        assert ce.read_error(ws) is None
        err = rel_err_rows(out, reference(opts, banks, H, I, x64 * scale, i_np, w_np))
        assert err < REL_TOL, f"replay {step}: {err:.3g}"


def test_type_without_cuda_decoder_refused_by_name():
    rng = np.random.default_rng(4)
    H, I, E = 256, 256, 2  # noqa: E741
    opts, banks = gguf_layer(("Q8_0", "Q8_0", "Q8_0"), H, I, E, rng)
    opts["down_type"] = "F16"
    banks["down"] = rng.standard_normal((E, H, I)).astype(np.float16).view(np.uint8)
    x, _ = bf16_x(1, H, rng)
    ids, wts = routing(1, 2, E, rng)
    with pytest.raises(UnsupportedError, match="no CUDA decoder for ggml type down F16"):
        run(opts, banks, x, ids, wts)
