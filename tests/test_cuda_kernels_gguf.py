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
bits (Q5_K), so no rounding of the min's size is common to a sub-block; Q2_K's staged decode looks
up ggml's float32 values rounded once to bf16); the activation between
gate_up and down is stored as bf16 too; products accumulate in float32 (decode of Q4_K and Q5_K
rows rounds no weight: the staged kernel applies their sub-block scales and mins to float32
sums, Q2_K, Q3_K and Q6_K's likewise per 16-value sub-block, IQ2_XXS, IQ2_XS and IQ3_S's per
scale group, and Q8_0's per block in rows of whole 256-value chunks). Independent roundings of gate, up, act and down give about 2.5e-3 expected (3.5-5e-3
measured with the typed decoders); a wrong block layout gives errors of order 1. Run with -s to
print the measured error of every case.
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

from test_cuda_kernels import bf16_x, rel_err, routing, run_back_to_back  # noqa: E402

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


def back_to_back_errs(opts, banks, T, H, I, E, K, rng, graph):  # noqa: E741
    """Six steps of T tokens through the gguf layer launched back to back (run_back_to_back): each
    step's error against the float64 reference."""
    view = ce.identity_view(LayerFormat.of("gguf", opts), banks)
    inputs = []
    for _ in range(6):
        x, x64 = bf16_x(T, H, rng)
        ids, wts = routing(T, K, E, rng)
        inputs.append((x, x64, ids, wts))
    outs = run_back_to_back(view, inputs, SILU, graph, K, I, E)
    return [rel_err(out, reference(opts, banks, H, I, x64, ids, wts)) for (_, x64, ids, wts), out in zip(inputs, outs)]


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
# programmatic dependent launch), or the legacy loop with FTW_CUDA_REGISTER_SHAPE=legacy (Q8_0
# decodes staged by default since the staged kernel's 32-bit copies and full chunks)
REGISTER_FED = ["Q4_0", "IQ4_NL", "MXFP4", "IQ4_XS", "IQ3_XXS"]


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
    monkeypatch.setenv("FTW_GGUF_CUDA_SUBBLOCKS", "0")  # Q4_K / Q5_K decode: the bf16 forms, not float32 sums
    check((name, name, name), T, [T, TYPES.index(name), 10 + MIN_FORMS.index(form)])


@pytest.mark.parametrize("loads", ["generic", "shared"])
@pytest.mark.parametrize("name", FAST)
def test_staged_kernel_reading_its_ring_either_way(name, loads, monkeypatch):
    """FTW_GGUF_CUDA_SHARED=generic | shared (the default picks one per type): the staged kernel's
    loads of the ring through generic addresses (8-byte spans) or ld.shared (4-byte words shifted
    into place) decode the same values."""
    monkeypatch.setenv("FTW_GGUF_CUDA_DECODER", "staged")
    monkeypatch.setenv("FTW_GGUF_CUDA_SHARED", loads)
    monkeypatch.setenv("FTW_GGUF_CUDA_INTSUMS", "0")  # (the IQ types' default reads no spans)
    check((name, name, name), 4, [4, TYPES.index(name), 6])


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "IQ4_NL", "MXFP4"])
def test_staged_rows_ending_in_a_partial_chunk(name, monkeypatch):
    """H and I not multiples of 256: a row's last 256-value chunk holds fewer than 8 blocks; the
    staged kernel copies up to the row's end only and decodes the missing units as zeros (the bytes
    after a row's end in its last 16-byte piece belong to the next row)."""
    monkeypatch.setenv("FTW_GGUF_CUDA_DECODER", "staged")
    check((name, name, name), 2, [5, TYPES.index(name)], H=352, I=160)


# the staged kernel's byte-stream variants (FTW_CUDA_STAGED_BYTES): the default (copies as a
# 32-bit count of pieces, full chunks without per-unit checks) and "0", both as before
STAGED_BYTES = ["", "0"]
# and the ring's stages for the wide byte-stream chunks (Q6_K, Q8_0: FTW_CUDA_STAGED_STAGES;
# the default "" is 2)
STAGES = ["", "3", "4"]


@pytest.mark.parametrize("variant", STAGED_BYTES)
@pytest.mark.parametrize("types, size", [(("Q4_K", "Q4_K", "Q6_K"), {}),
                                         (("Q8_0", "Q8_0", "Q8_0"), {"H": 352, "I": 160}),
                                         (("Q2_K", "Q2_K", "IQ3_S"), {"H": 2048, "I": 512, "E": 16, "K": 8})])
def test_staged_kernel_byte_stream_variants(types, size, variant, monkeypatch):
    """Both variants decode the same values: rows of whole chunks, rows ending in a partial chunk
    (352 and 160 values: the last chunk's missing units zeros, its copies stopping at the row's
    end), and more items than the grid has blocks."""
    monkeypatch.setenv("FTW_GGUF_CUDA_DECODER", "staged")
    monkeypatch.setenv("FTW_CUDA_STAGED_BYTES", variant)
    check(types, 3 if "K" not in size else 8, [8, sum(map(ord, "".join(types))), STAGED_BYTES.index(variant)], **size)


@pytest.mark.parametrize("stages", STAGES)
@pytest.mark.parametrize("types, size", [(("Q6_K", "Q6_K", "Q8_0"), {"H": 2048, "I": 512, "E": 16, "K": 8}),
                                         (("Q8_0", "Q8_0", "Q8_0"), {"H": 352, "I": 160})])
def test_staged_ring_of_fewer_stages(types, size, stages, monkeypatch):
    """Rings of 2 (the default), 3 and 4 stages decode the same values, across items and in
    partial chunks."""
    monkeypatch.setenv("FTW_GGUF_CUDA_DECODER", "staged")
    monkeypatch.setenv("FTW_CUDA_STAGED_STAGES", stages)
    check(types, 3 if "K" not in size else 8, [9, sum(map(ord, "".join(types))), STAGES.index(stages)], **size)


# Q4_K / Q5_K in the staged kernel on float32 sub-block sums (FTW_GGUF_CUDA_SUBBLOCKS: the
# default "", "0" the bf16 decode), with rings of 2 (the default ""), 3 and 4 stages
# (FTW_CUDA_STAGED_STAGES)
SUB_BLOCKS = ["", "0"]


@pytest.mark.parametrize("sub, stages", [("", ""), ("", "3"), ("", "4"), ("0", "")])
@pytest.mark.parametrize("types, T, size", [(("Q4_K", "Q4_K", "Q4_K"), 1, {}),
                                            (("Q5_K", "Q5_K", "Q5_K"), 3, {}),
                                            (("Q4_K", "Q4_K", "Q5_K"), 8, {"H": 2048, "I": 512, "E": 16, "K": 8}),
                                            (("Q5_K", "Q5_K", "Q4_K"), 2, {"H": 768, "I": 256, "E": 8, "K": 8})])
def test_k_quants_on_float32_sub_block_sums(types, T, size, sub, stages, monkeypatch):
    """The quants as exact bf16 integers (128 + q), each 32-value sub-block's scale and min applied
    to the mma's float32 sums (the min through the sum of x over the sub-block), against
    gguf.quants' values: one item per block and more items than blocks, rows of 1, 2, 3 and 8
    chunks, T = 1..8 (pair columns 0..7 of the mma)."""
    monkeypatch.setenv("FTW_GGUF_CUDA_SUBBLOCKS", sub)
    monkeypatch.setenv("FTW_CUDA_STAGED_STAGES", stages)
    check(types, T, [11, sum(map(ord, "".join(types))), SUB_BLOCKS.index(sub), len(stages)], **size)


# Q8_0 in the staged kernel on float32 block sums (FTW_GGUF_CUDA_Q8_SUMS: the default "" for rows of
# whole 256-value chunks, "0" the bf16 decode as before), with rings of 2 (the default ""), 3 and 4
# stages (FTW_CUDA_STAGED_STAGES)
Q8_SUMS = ["", "0"]


@pytest.mark.parametrize("sums, stages", [("", ""), ("", "3"), ("", "4"), ("0", "")])
@pytest.mark.parametrize("T, size", [(1, {}), (3, {}), (8, {"H": 2048, "I": 512, "E": 16, "K": 8}),
                                     (2, {"H": 768, "I": 256, "E": 8, "K": 8}), (2, {"H": 512, "I": 160})])
def test_q8_0_on_float32_block_sums(T, size, sums, stages, monkeypatch):
    """Each int8 quant as two exact bf16 integers (128 + low nibble, 2048 + 16 high nibble of
    q + 128) summed by the mma, each 32-value block's d and the constant offset (2304) applied to
    the float32 sums (the offset through the sum of x over the block), against gguf.quants' values:
    rows of 1, 2, 3 and 8 chunks, one item per block and more items than blocks, T = 1..8 (pair
    columns 0..7); down rows of 160 values (not whole chunks) keep the bf16 decode while gate_up's
    take the sums, in one step."""
    monkeypatch.setenv("FTW_GGUF_CUDA_Q8_SUMS", sums)
    monkeypatch.setenv("FTW_CUDA_STAGED_STAGES", stages)
    check(("Q8_0", "Q8_0", "Q8_0"), T, [15, T, Q8_SUMS.index(sums), len(stages), size.get("H", 0)], **size)


# The kernel with a chunk body of one pair column (kOptOneColumn: an item of one pair updates only
# pair column 0's sums) for the decoders on 32-value sub-block sums with mins (Q4_K, Q5_K, Q8_0):
# FTW_CUDA_STAGED_ONE=1 forces it (by default only phases of many items per SM take it), "0" the
# kernel of the full body alone
ONE_COLUMN = ["1", "0"]


@pytest.mark.parametrize("one", ONE_COLUMN)
@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q8_0"])
@pytest.mark.parametrize("T", [1, 8])
def test_one_pair_column_body(name, T, one, monkeypatch):
    """T = 1 (every item one pair: the one-column body) and T = 8 with independent routings of 2
    of 16 experts (items of one pair and of several in one step: both bodies in one launch) decode
    the same values."""
    monkeypatch.setenv("FTW_CUDA_STAGED_ONE", one)
    monkeypatch.setenv("FTW_GGUF_CUDA_INT8", "0")  # (Q5_K's phase 0 at T = 1 would take its int8 body)
    check((name, name, name), T, [16, T, TYPES.index(name), ONE_COLUMN.index(one)], H=768, I=512, E=16, K=2)


# Items of one pair with each lane of a quad on sub-blocks of its own (kOptLaneBlocks, in the
# one-column kernel: FTW_CUDA_STAGED_LANES=1 at any T, for Q8_0 too, a lane's sub-blocks in one
# column; "2" in two columns, kOptLaneCols, the default's form at T = 1; "0" the one-column body)
LANES = ["1", "2", "0"]


@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("types, T, size", [(("Q4_K", "Q4_K", "Q4_K"), 1, {}), (("Q4_K", "Q4_K", "Q4_K"), 8, {}),
                                            (("Q5_K", "Q5_K", "Q5_K"), 1, {}), (("Q5_K", "Q5_K", "Q5_K"), 8, {}),
                                            (("Q8_0", "Q8_0", "Q8_0"), 1, {}), (("Q8_0", "Q8_0", "Q8_0"), 8, {}),
                                            (("Q4_K", "Q4_K", "Q5_K"), 1, {"H": 2048, "I": 512, "K": 8}),
                                            (("Q8_0", "Q8_0", "Q4_K"), 1, {"H": 2048, "I": 768, "E": 8, "K": 8}),
                                            (("Q5_K", "Q5_K", "Q8_0"), 1, {"H": 1024, "I": 1024, "K": 6})])
def test_lane_blocks_body(types, T, size, lanes, monkeypatch):
    """The one-column kernel forced: at T = 1 every item is one pair (the lane-blocks body, or the
    one-column body with "0"); T = 8 with independent routings of 2 of 16 experts puts items of one
    pair beside items of several (the full body) in one launch; rows of 2, 3, 4 and 8 chunks, several
    warps splitting a row (H = 2048: the per-item quad sums before the warps' reduction)."""
    monkeypatch.setenv("FTW_CUDA_STAGED_ONE", "1")
    monkeypatch.setenv("FTW_CUDA_STAGED_LANES", lanes)
    monkeypatch.setenv("FTW_GGUF_CUDA_INT8", "0")  # (Q5_K's phase 0 at T = 1 would take its int8 body)
    size = {"H": 768, "I": 512, "E": 16, "K": 2} | size
    check(types, T, [23, T, sum(map(ord, "".join(types)))], **size)  # the same data for every body


# Items of one pair with each lane of a quad on 4 sub-blocks of 16 values of its own (kOptLanes16,
# Q6_K and Q2_K: FTW_CUDA_STAGED_LANES6=1 at any T; "" the default, at T = 1 only; "0" never: the
# full body)
LANES16 = ["1", "", "0"]


@pytest.mark.parametrize("lanes", LANES16)
@pytest.mark.parametrize("types, T, size", [(("Q6_K", "Q6_K", "Q6_K"), 1, {}), (("Q6_K", "Q6_K", "Q6_K"), 8, {}),
                                            (("Q6_K", "Q6_K", "Q6_K"), 3, {"H": 512, "I": 256, "E": 8, "K": 4}),
                                            (("Q6_K", "Q6_K", "Q6_K"), 1, {"H": 2048, "I": 768, "K": 8}),
                                            (("Q6_K", "Q6_K", "Q4_K"), 1, {"H": 1024, "I": 1024, "K": 6}),
                                            (("Q4_K", "Q4_K", "Q6_K"), 8, {"H": 2048, "I": 512, "E": 8, "K": 8}),
                                            (("Q2_K", "Q2_K", "Q2_K"), 1, {}), (("Q2_K", "Q2_K", "Q2_K"), 8, {}),
                                            (("Q2_K", "Q2_K", "Q6_K"), 1, {"H": 2048, "I": 768, "K": 8}),
                                            (("Q6_K", "Q6_K", "Q2_K"), 3, {"H": 512, "I": 256, "E": 8, "K": 4})])
def test_lane_blocks16_body(types, T, size, lanes, monkeypatch):
    """At T = 1 every item is one pair (the lanes body, or the full body with "0"); T = 3 and 8 with
    independent routings put items of one pair beside items of several (with "1" the lanes body and
    the full body in one launch); rows of 1, 2, 3, 4 and 8 blocks, several warps splitting a row
    (H = 2048: the per-item quad sums before the warps' reduction), gate_up and down of different
    types."""
    monkeypatch.setenv("FTW_CUDA_STAGED_LANES6", lanes)
    monkeypatch.setenv("FTW_GGUF_CUDA_INT8", "0")  # (Q2_K at T = 1 may take its int8 body: test_gguf_int8_sums16)
    size = {"H": 768, "I": 512, "E": 16, "K": 2} | size
    check(types, T, [29, T, sum(map(ord, "".join(types))), size["H"]], **size)  # the same data for every body


# Down's items split between blocks for Q4_K, Q5_K and Q8_0 on sums (FTW_CUDA_STAGED_PARTS: the
# default "" splits a phase of few items per SM in 2, as every case here; "1" one part)
PARTS = ["", "1"]


@pytest.mark.parametrize("parts", PARTS)
@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q8_0"])
@pytest.mark.parametrize("T", [1, 8])
def test_down_in_parts_on_sums(name, T, parts, monkeypatch):
    """Down rows of 3 chunks (I = 768) in 2 parts of 2 and 1 chunks, each part adding its share
    into out, the first also the bias's place: the same values as one part, T = 1 (the one-column
    body forced) and T = 8 with every token on the same experts."""
    monkeypatch.setenv("FTW_CUDA_STAGED_PARTS", parts)
    monkeypatch.setenv("FTW_CUDA_STAGED_ONE", "1" if T == 1 else "")
    rng = np.random.default_rng([17, T, TYPES.index(name), PARTS.index(parts)])
    H, I, E, K = 512, 768, 8, 4  # noqa: E741
    opts, banks = gguf_layer((name, name, name), H, I, E, rng)
    x, x64 = bf16_x(T, H, rng)
    ids, wts = routing(1, K, E, rng)
    ids, wts = np.repeat(ids, T, axis=0), np.repeat(wts, T, axis=0)  # every token the same experts
    err = rel_err(run(opts, banks, x, ids, wts), reference(opts, banks, H, I, x64, ids, wts))
    print(f"gguf cuda accuracy {name} down in parts {parts or 'default'} T={T}: {err:.2e}")
    assert err < REL_TOL


# The IQ types in the staged kernel on float32 sub-block sums (FTW_GGUF_CUDA_INTSUMS=1: for every IQ
# type, IQ3_XXS's too, whose default stays register-fed; "0" the decode they had before), with rings
# of 2 (the default ""), 3 and 4 stages
INT_SUMS = ["1", "0"]


@pytest.mark.parametrize("sums, stages", [("1", ""), ("1", "3"), ("1", "4"), ("0", "")])
@pytest.mark.parametrize("types, T, size", [(("IQ2_XXS", "IQ2_XXS", "IQ2_XXS"), 1, {}),
                                            (("IQ2_XS", "IQ2_XS", "IQ2_XS"), 3, {}),
                                            (("IQ3_XXS", "IQ3_XXS", "IQ3_XXS"), 1, {}),
                                            (("IQ3_S", "IQ3_S", "IQ3_S"), 2, {}),
                                            (("IQ2_XS", "IQ2_XS", "IQ3_S"), 8, {"H": 2048, "I": 512, "E": 16, "K": 8}),
                                            (("IQ3_XXS", "IQ3_XXS", "IQ2_XXS"), 8, {"H": 768, "I": 256, "E": 8, "K": 8})])
def test_iq_types_on_float32_sub_block_sums(types, T, size, sums, stages, monkeypatch):
    """The grid values as exact signed bf16 integers, each scale group's (32 values, IQ2_XS's 16)
    float32 scale applied to the mma's sums, against gguf.quants' values: one item per block and
    more items than blocks, rows of 1, 2, 3 and 8 super-blocks, T = 1..8 (pair columns 0..7)."""
    monkeypatch.setenv("FTW_GGUF_CUDA_INT8", "0")  # (IQ3_S's down and IQ3_XXS's many-item phases at T = 1 take int8 units)
    monkeypatch.setenv("FTW_GGUF_CUDA_INTSUMS", sums)
    monkeypatch.setenv("FTW_CUDA_STAGED_STAGES", stages)
    check(types, T, [13, sum(map(ord, "".join(types))), INT_SUMS.index(sums), len(stages)], **size)


# The IQ types on sums with their grid in 8 copies (4 for IQ2_XS), one per lane of a shared-memory
# phase (IqCopies), the signs without ksigns' table: forced at every size (FTW_GGUF_CUDA_GRID_COPIES=1:
# also rows of 1-3 chunks, blocks of 4 warps that split them), and by default where a phase's rows
# have 8 chunks (H = 2048: gate_up); "0" never (the single grid, as before)
GRID_COPIES = ["1", "", "0"]


@pytest.mark.parametrize("copies, stages", [("1", ""), ("1", "4"), ("", ""), ("0", "")])
@pytest.mark.parametrize("types, T, size", [(("IQ2_XXS", "IQ2_XXS", "IQ2_XXS"), 1, {}),
                                            (("IQ2_XS", "IQ2_XS", "IQ2_XS"), 3, {}),
                                            (("IQ3_XXS", "IQ3_XXS", "IQ3_XXS"), 5, {}),
                                            (("IQ3_S", "IQ3_S", "IQ3_S"), 2, {}),
                                            (("IQ2_XXS", "IQ2_XXS", "IQ3_S"), 8, {"H": 2048, "I": 512, "E": 16, "K": 8}),
                                            (("IQ3_S", "IQ3_S", "IQ2_XS"), 1, {"H": 2048, "I": 2048, "E": 8, "K": 8}),
                                            (("IQ3_XXS", "IQ3_XXS", "IQ2_XXS"), 8, {"H": 768, "I": 256, "E": 8, "K": 8})])
def test_iq_grids_in_copies(types, T, size, copies, stages, monkeypatch):
    """Every lane reading its own copy of the grid gives the values of gguf.quants: one item per
    block and more items than blocks, rows of 1 to 8 super-blocks, T = 1..8, both phases in copies
    (H = I = 2048) and one of them."""
    monkeypatch.setenv("FTW_GGUF_CUDA_INT8", "0")  # (IQ3_S's down and IQ3_XXS's many-item phases at T = 1 take int8 units)
    monkeypatch.setenv("FTW_GGUF_CUDA_INTSUMS", "1")
    monkeypatch.setenv("FTW_GGUF_CUDA_GRID_COPIES", copies)
    monkeypatch.setenv("FTW_CUDA_STAGED_STAGES", stages)
    check(types, T, [17, sum(map(ord, "".join(types))), GRID_COPIES.index(copies), len(stages)], **size)


@pytest.mark.parametrize("copies", ["", "0"])
@pytest.mark.parametrize("T", [1, 8])
def test_iq3_xxs_on_sums_where_both_phases_take_copies(T, copies, monkeypatch):
    """IQ3_XXS's default: on sums with its grid in copies where both phases' rows have 8 chunks or
    more (H = I = 2048), register-fed with FTW_GGUF_CUDA_GRID_COPIES=0 (as at smaller sizes)."""
    monkeypatch.setenv("FTW_GGUF_CUDA_INT8", "0")  # (IQ3_S's down and IQ3_XXS's many-item phases at T = 1 take int8 units)
    monkeypatch.setenv("FTW_GGUF_CUDA_GRID_COPIES", copies)
    check(("IQ3_XXS", "IQ3_XXS", "IQ3_XXS"), T, [19, T, GRID_COPIES.index(copies)], H=2048, I=2048, E=8, K=8)


# the 4-bit types of 32-value blocks and IQ4_XS staged (FTW_GGUF_CUDA_DECODER=staged) on rings of 2
# stages (the default "", kShortRing) and 4 (FTW_CUDA_STAGED_STAGES); and Q4_0 / MXFP4 by default,
# which decode staged where a phase has many items (FTW_GGUF_CUDA_STAGED_ITEMS=0: at every size; the
# int8 units of several tokens, which such phases of Q4_0 take at T = 8 by default, pinned off: T8's own tests)
SHORT_RING_WAYS = [(name, decoder, stages) for name in ("Q4_0", "IQ4_NL", "IQ4_XS", "MXFP4")
                   for decoder, stages in (("staged", ""), ("staged", "4"))] + \
                  [("Q4_0", "", ""), ("MXFP4", "", "")]


@pytest.mark.parametrize("name, decoder, stages", SHORT_RING_WAYS)
def test_4_bit_types_staged_on_short_rings(name, decoder, stages, monkeypatch):
    """Every way decodes the same values within the tolerance: T = 1; T = 3 in rows ending in a
    partial chunk (352 and 160 values: a last chunk of 3 blocks; IQ4_XS, whose blocks are 256
    values, rows of 3 and 1 chunks); T = 8 over more (expert, band) items than the grid has
    blocks."""
    if decoder:
        monkeypatch.setenv("FTW_GGUF_CUDA_DECODER", decoder)
    else:
        monkeypatch.setenv("FTW_GGUF_CUDA_STAGED_ITEMS", "0")
        monkeypatch.setenv("FTW_GGUF_CUDA_INT8_T8", "0")
    monkeypatch.setenv("FTW_CUDA_STAGED_STAGES", stages)
    seed = [13, TYPES.index(name), SHORT_RING_WAYS.index((name, decoder, stages))]
    check((name, name, name), 1, seed + [1])
    partial = {"H": 352, "I": 160} if name != "IQ4_XS" else {"H": 768, "I": 256}
    check((name, name, name), 3, seed + [3], **partial)
    check((name, name, name), 8, seed + [8], H=2048, I=512, E=16, K=8)


# IQ4_NL, IQ4_XS and MXFP4 values made either way (FTW_GGUF_CUDA_VALUES): "1" (the default,
# kValueV1; IQ4: the levels plus 128 looked up as one byte plane, each under a zero byte, the bf16
# pattern of (level + 128) * 2^-133, and one bf16 fma per pair, weights times 2^-62 and the sums
# times 2^62; MXFP4: e2m1 pairs by one multiply each) and "0" (kValueV0, the decode before: IQ4's
# levels as two bf16 byte planes times the scale; MXFP4's e2m1 by shifts), in every kernel that
# decodes them: the default (register-fed, shaped loop; MXFP4 staged at T = 8), staged on rings of
# 2 and 4 stages, loaded, prefetched; prefill at T = 40
VALUE_WAYS = [("", ""), ("staged", ""), ("staged", "4"), ("loaded", ""), ("prefetched", "")]


@pytest.mark.parametrize("decoder, stages", VALUE_WAYS)
@pytest.mark.parametrize("name", ["IQ4_NL", "IQ4_XS", "MXFP4"])
def test_4_bit_values_either_way(name, decoder, stages, monkeypatch):
    """Both forms against gguf.quants' values within the tolerance, and against each other: each
    weight is the same bf16 value (IQ4: level * bf16(scale), rounded once; in form 1 times 2^-62,
    taken off the float32 sums by 2^62), so the outputs agree to 1e-6 relative; not to the bit,
    since the down phase adds the experts' shares into out by float atomics in no fixed order
    (2-7e-8 relative on the H200, as much for MXFP4, whose two forms make the same bits). T = 1;
    T = 3 in rows ending in a partial chunk (IQ4_XS: rows of 3 and 1 super-blocks); T = 8 over more
    items than blocks; T = 40."""
    monkeypatch.setenv("FTW_GGUF_CUDA_DECODER", decoder)
    monkeypatch.setenv("FTW_CUDA_STAGED_STAGES", stages)
    partial = {"H": 352, "I": 160} if name != "IQ4_XS" else {"H": 768, "I": 256}
    for T, size in ((1, {}), (3, partial), (8, {"H": 2048, "I": 512, "E": 16, "K": 8}), (40, {})):
        H, I, E, K = size.get("H", 512), size.get("I", 256), size.get("E", 8), size.get("K", 4)  # noqa: E741
        rng = np.random.default_rng([17, TYPES.index(name), VALUE_WAYS.index((decoder, stages)), T])
        opts, banks = gguf_layer((name, name, name), H, I, E, rng)
        x, x64 = bf16_x(T, H, rng)
        ids, wts = routing(T, K, E, rng)
        ref = reference(opts, banks, H, I, x64, ids, wts)
        outs = {}
        for form in ("0", "1"):
            monkeypatch.setenv("FTW_GGUF_CUDA_VALUES", form)
            outs[form] = run(opts, banks, x, ids, wts)
            err = rel_err(outs[form], ref)
            print(f"gguf cuda accuracy {name} values {form} {decoder or 'default'} {stages or '-'} T={T}: {err:.2e}")
            assert err < REL_TOL, f"{name} values {form} {decoder} {stages} T={T}: {err:.3g}"
        a, b = outs["0"].double(), outs["1"].double()
        diff = float((a - b).norm() / a.norm())
        print(f"  form 0 against 1: {diff:.2e} relative, {int((a != b).sum())} of {a.numel()} outputs differ")
        assert diff < 1e-6, f"{name} {decoder} {stages} T={T}: the two forms differ by {diff:.3g}"


# Q4_0 and MXFP4 with the staged kernel's byte columns at T = 1 (kOptByteCols; FTW_GGUF_CUDA_UNITCOLS):
# "1" on, staged at T = 1 also in the phases of few items (register-fed by default; these tests'
# sizes are such phases): each lane's units unscaled in an mma column of their own, the scales on
# the float32 sums; "0" off (the decode before); "" the default (on where the staged kernel runs)
UNIT_COLUMNS = ["1", "0", ""]


@pytest.mark.parametrize("cols", UNIT_COLUMNS)
@pytest.mark.parametrize("name", ["Q4_0", "MXFP4"])
def test_gguf_unit_columns(name, cols, monkeypatch):
    """Every way within the tolerance of gguf.quants' values: T = 1 in whole chunks, in rows ending
    in a partial chunk (352 and 160 values: a last chunk of 3 blocks, whose units past the row take
    scale 0), over more items than blocks and with down of the other type (its own kernel in phase
    1); T = 3 and T = 8, where the switch keeps the kernels without them."""
    monkeypatch.setenv("FTW_GGUF_CUDA_UNITCOLS", cols)
    partial = {"H": 352, "I": 160}
    seed = [19, TYPES.index(name), UNIT_COLUMNS.index(cols)]
    check((name, name, name), 1, seed + [1])
    check((name, name, name), 1, seed + [2], **partial)
    check((name, name, name), 1, seed + [3], H=2048, I=512, E=16, K=8)
    check((name, name, "MXFP4" if name == "Q4_0" else "Q4_0"), 1, seed + [4])
    check((name, name, name), 3, seed + [5], **partial)
    check((name, name, name), 8, seed + [6], H=2048, I=512, E=16, K=8)


def far_rows(name, rows, n, rng, small):
    """[rows, row bytes] of random `name` blocks (IQ4_XS, MXFP4, IQ3_XXS, IQ3_S) with block scales of 2^-20 where
    small(block index) holds, else 2^+20 (IQ4_XS: d = 2^-24, an f16 subnormal, or 2^15, times its
    6-bit sub-block scales' ls - 32, -32..31; the IQ3 types' d likewise, times their 4-bit scales;
    MXFP4: E8M0 127 -+ 20). IQ4_XS: the decode without byte
    columns at these scales (its byte columns were measured slower and dropped, commit 5a41aa6)."""
    t = ggml_type_named(name)
    nb = n // t.block
    b = ggml_rows(name, rows, n, rng).reshape(rows, nb, t.nbytes)
    s = np.broadcast_to(np.array([bool(small(i)) for i in range(nb)]), (rows, nb))
    if name == "MXFP4":
        b[..., 0] = np.where(s, 127 - 20, 127 + 20).astype(np.uint8)
    else:
        d = np.where(s, np.float16(2.0 ** -24), np.float16(2.0 ** 15)).astype(np.float16)
        b[..., 0:2] = d.view(np.uint8).reshape(rows, nb, 2)
    return b.reshape(rows, -1)


# block scales far apart: gate / up small and down large, the other way round, and alternating
# block by block within every row (in a chunk's lanes side by side)
FAR_SCALES = {"small-large": (lambda i: True, lambda i: False), "large-small": (lambda i: False, lambda i: True),
              "alternating": (lambda i: i % 2 == 0, lambda i: i % 2 == 1)}


def far_layer(name, scales):
    """A layer builder (H, I, E, rng) -> (opts, banks) of type name, its block scales FAR_SCALES[scales]."""
    gu_small, down_small = FAR_SCALES[scales]

    def rows(H, I, E, rng):  # noqa: E741
        g = np.stack([far_rows(name, I, H, rng, gu_small) for _ in range(E)])
        u = np.stack([far_rows(name, I, H, rng, gu_small) for _ in range(E)])
        d = np.stack([far_rows(name, H, I, rng, down_small) for _ in range(E)])
        return {"gate_up_type": name, "down_type": name}, {"gate_up": np.concatenate([g, u], axis=1), "down": d}

    return rows


@pytest.mark.parametrize("cols", ["1", "0"])
@pytest.mark.parametrize("scales", list(FAR_SCALES))
@pytest.mark.parametrize("name", ["IQ4_XS", "MXFP4"])
def test_gguf_unit_columns_scales_far_apart(name, scales, cols, monkeypatch):
    """Block scales of 2^-20 and 2^+20 (activations from about 2^-20 to 2^61) within the tolerance,
    T = 1, with the byte columns (MXFP4: each unit's scale on its float32 sum, x times 2^57 against
    the unscaled values) and without; the outputs finite."""
    monkeypatch.setenv("FTW_GGUF_CUDA_UNITCOLS", cols)
    H, I, E, K, T = 512, 256, 8, 4, 1  # noqa: E741
    rng = np.random.default_rng([23, TYPES.index(name), list(FAR_SCALES).index(scales), int(cols)])
    opts, banks = far_layer(name, scales)(H, I, E, rng)
    x, x64 = bf16_x(T, H, rng)
    ids, wts = routing(T, K, E, rng)
    err = rel_err(run(opts, banks, x, ids, wts), reference(opts, banks, H, I, x64, ids, wts))
    print(f"gguf cuda accuracy {name} scales {scales} unit columns {cols} T={T}: {err:.2e}")
    assert err < REL_TOL, f"{name} {scales} {cols}: {err:.3g}"


# T = 1 with int8 units (kOptInt8; FTW_GGUF_CUDA_INT8=1 both phases, =gate_up / =down one: staged also
# where the type's default is register-fed): x (act) quantized per 32-value group to int8 hi and lo
# (x = s (hi + lo / 254), within s / 508), the weights' exact integers on mma m16n8k32 u8 x s8, the
# scales on the int32 sums. Each case runs every way and without (=0) on the same data: all within
# the tolerance, the int8 ways no less accurate than the bf16 one (they round no weight, and x to
# about 1.5e-5 of its group's largest value instead of bf16's 2^-9 of each value), and the outputs
# not identical to it where a phase's type has int8 units (they ran).
INT8 = ["Q4_0", "MXFP4", "IQ4_NL", "IQ4_XS"]
# (H, I, E, K): one chunk per 256 values; Q4_0 / MXFP4 / IQ4_NL rows ending in a partial chunk (352 and
# 160 values: a last chunk of 3 blocks, units past the row's end); several chunks over more items
# than blocks; IQ4_XS's rows are whole 256-value blocks
INT8_SIZES = {"small": (512, 256, 8, 4), "partial": (352, 160, 8, 4), "chunks": (2048, 512, 16, 8),
              "xs": (768, 256, 8, 4)}


def int8_pair(types, size, seed, monkeypatch, rows=None, default=None):
    """default: {FTW_GGUF_CUDA_STAGED_ITEMS: the way (a value of FTW_GGUF_CUDA_INT8) the switch unset
    takes}. Two runs of one way agree to float32's rounding of the K pairs' sums, which add into out
    by atomics in any order, not bit for bit: the default's output is to be 10x nearer that way's than
    the bf16 and int8 ways are to each other."""
    H, I, E, K = INT8_SIZES[size]  # noqa: E741
    rng = np.random.default_rng(seed)
    opts, banks = gguf_layer(types, H, I, E, rng) if rows is None else rows(H, I, E, rng)
    rerun, _, outs, errs = int8_ways(opts, banks, H, I, E, K, rng, monkeypatch)
    print(f"gguf cuda accuracy {'/'.join(types)} {size} T=1: int8 {errs['1']:.2e}, gate_up only {errs['gate_up']:.2e}, "
          f"down only {errs['down']:.2e}, bf16 {errs['0']:.2e}")
    for v in ("1", "gate_up", "down"):
        assert errs[v] < REL_TOL, f"{types} {size} int8 {v}: {errs[v]:.3g}"
        assert errs[v] <= 1.2 * errs["0"] + 1e-5, f"{types} {size}: int8 {v} {errs[v]:.3g} against bf16 {errs['0']:.3g}"
        if v != "down" or types[2] in INT8 + INT8_SUMS16 + INT8_GRIDS:
            assert not torch.equal(outs["0"], outs[v]), f"{types} {size}: the int8 path ({v}) did not run"
    if default is not None:
        assert_default(monkeypatch, "FTW_GGUF_CUDA_INT8", default, outs, rerun, f"{'/'.join(types)} {size}")


def int8_ways(opts, banks, H, I, E, K, rng, monkeypatch):  # noqa: E741
    """One token's x and routing drawn from rng, the float64 reference, and the layer run every way of
    FTW_GGUF_CUDA_INT8 ("0", "1", "gate_up", "down"): (rerun: the layer on the same data under the
    environment as it then is, ref, outs, errs: each way's output and its error against ref)."""
    x, x64 = bf16_x(1, H, rng)
    ids, wts = routing(1, K, E, rng)
    ref = reference(opts, banks, H, I, x64, ids, wts)
    def rerun():
        return run(opts, banks, x, ids, wts)
    outs, errs = switch_ways(monkeypatch, "FTW_GGUF_CUDA_INT8", rerun, lambda out: rel_err(out, ref))
    return rerun, ref, outs, errs


def switch_ways(monkeypatch, switch, rerun, err):
    """rerun() with the int8 switch `switch` at each of "0", "1", "gate_up", "down", in that order:
    (outs, errs), each way's output and err(output)."""
    outs, errs = {}, {}
    for v in ("0", "1", "gate_up", "down"):
        monkeypatch.setenv(switch, v)
        outs[v] = rerun()
        errs[v] = err(outs[v])
    return outs, errs


def assert_default(monkeypatch, switch, default, outs, rerun, what):
    """With the switch unset, at each FTW_GGUF_CUDA_STAGED_ITEMS of default ({items: the way, a value
    of the switch, it is to take}), rerun()'s output is 10x nearer that way's in outs than the bf16
    ("0") and int8 ("1") ways are to each other."""
    monkeypatch.delenv(switch)
    gap = float((outs["0"] - outs["1"]).norm())
    for items, want in default.items():
        monkeypatch.setenv("FTW_GGUF_CUDA_STAGED_ITEMS", items)
        near = float((rerun() - outs[want]).norm())
        print(f"gguf cuda {switch} default {what} items={items}: {near:.2e} from {want}, gap {gap:.2e}")
        assert near < 0.1 * gap, f"{what} items={items}: the default is not {want} ({near:.3g}, {gap:.3g})"


@pytest.mark.parametrize("name, size", [(n, z) for n in INT8 for z in INT8_SIZES
                                         if (n == "IQ4_XS") == (z in ("xs", "chunks"))])  # (IQ4_XS: whole 256-value rows)
def test_gguf_int8_units(name, size, monkeypatch):
    seed = [29, INT8.index(name), list(INT8_SIZES).index(size)]
    int8_pair((name, name, name), size, seed, monkeypatch)


@pytest.mark.parametrize("name", INT8)
def test_gguf_int8_units_down_other_type(name, monkeypatch):
    """gate_up int8, down of another type (its own kernel in phase 1)."""
    int8_pair((name, name, "Q8_0"), "xs", [31, INT8.index(name)], monkeypatch)


# IQ3_XXS / IQ3_S as int8 units (kOptInt8 from shared-memory grids, Int8TableRows): each grid row's
# magnitudes plus a bias (64, 16) with the signs applied per byte, against x as for the int8 units
# (FTW_GGUF_CUDA_INT8=1 / gate_up / down, staged also where IQ3_XXS is register-fed). Rows of 3 and
# 8 super-blocks (xs, chunks: more items than blocks, down rows of 2 and 3), down of Q8_0 and of the
# other IQ3 type, and block scales 2^-20 / 2^20; the defaults (IQ3_XXS both phases where they have
# many items, IQ3_S down at any size) take the way the switch names.
INT8_GRIDS = ["IQ3_XXS", "IQ3_S"]


@pytest.mark.parametrize("size", ["xs", "chunks"])
@pytest.mark.parametrize("name", INT8_GRIDS)
def test_gguf_int8_grid_units(name, size, monkeypatch):
    int8_pair((name, name, name), size, [47, INT8_GRIDS.index(name), list(INT8_SIZES).index(size)], monkeypatch)


@pytest.mark.parametrize("items", ["many", "rule"])
@pytest.mark.parametrize("name", INT8_GRIDS)
def test_gguf_int8_grid_units_by_default(name, items, monkeypatch):
    """FTW_GGUF_CUDA_INT8 unset takes what the defaults say, at T = 1: IQ3_XXS int8 in both phases
    where they have many items (FTW_GGUF_CUDA_STAGED_ITEMS=0: every size), none at this size by
    the rule; IQ3_S int8 in down only, at either. The default's output is the named way's (to
    float32 rounding of the adds into out) and not the bf16 way's."""
    H, I, E, K = INT8_SIZES["xs"]  # noqa: E741
    rng = np.random.default_rng([61, INT8_GRIDS.index(name), items == "many"])
    opts, banks = gguf_layer((name, name, name), H, I, E, rng)
    x, x64 = bf16_x(1, H, rng)
    ids, wts = routing(1, K, E, rng)
    if items == "many":
        monkeypatch.setenv("FTW_GGUF_CUDA_STAGED_ITEMS", "0")
    outs = {}
    for v in ("", "0", "1", "down"):
        monkeypatch.setenv("FTW_GGUF_CUDA_INT8", v)
        outs[v] = run(opts, banks, x, ids, wts)
    way = {("IQ3_XXS", "many"): "1", ("IQ3_XXS", "rule"): "0"}.get((name, items), "down")
    ref = outs[way].double().cpu().numpy()
    err = rel_err(outs[""], ref)
    print(f"gguf cuda {name} int8 default ({items} items) against {way}: {err:.2e}")
    assert err < 1e-6, f"{name} {items}: the default is not the {way} way ({err:.3g})"
    if way != "0":
        assert not torch.equal(outs[""], outs["0"]), f"{name} {items}: the default took no int8 units"


@pytest.mark.parametrize("down", ["Q8_0", "other"])
@pytest.mark.parametrize("name", INT8_GRIDS)
def test_gguf_int8_grid_units_down_other_type(name, down, monkeypatch):
    """gate_up as int8 grid units, down of Q8_0 (its own kernel) or of the other IQ3 type (int8 too)."""
    d = down if down == "Q8_0" else INT8_GRIDS[1 - INT8_GRIDS.index(name)]
    int8_pair((name, name, d), "xs", [53, INT8_GRIDS.index(name), int(down == "Q8_0")], monkeypatch)


@pytest.mark.parametrize("scales", list(FAR_SCALES))
@pytest.mark.parametrize("name", INT8_GRIDS)
def test_gguf_int8_grid_units_scales_far_apart(name, scales, monkeypatch):
    """Block scales of 2^-20 and 2^+20 with the IQ3 int8 units."""
    int8_pair((name, name, name), "xs", [59, INT8_GRIDS.index(name), list(FAR_SCALES).index(scales)], monkeypatch,
              far_layer(name, scales))


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("pdl0", ["1", "0"])
@pytest.mark.parametrize("name", ["Q4_0", "IQ4_NL", "Q5_K", "Q2_K"])
def test_gguf_int8_units_back_to_back(name, pdl0, graph, monkeypatch):
    """Steps launched back to back on one stream sharing one workspace (its int8 x and act rewritten
    by every step's quantize_int8 launches while the step before may still run, FTW_CUDA_PDL0=1 as
    tests/test_cuda_pdl0.py), eagerly and in a CUDA graph; every output within the tolerance (Q5_K:
    phase 0 on int8 sub-block sums; Q2_K: both phases on int8 unit sums)."""
    monkeypatch.setenv("FTW_GGUF_CUDA_INT8", "1")
    monkeypatch.setenv("FTW_CUDA_PDL0", pdl0)
    H, I, E, K = INT8_SIZES["partial" if name in INT8 else "small"]  # noqa: E741  (K-quants: whole blocks)
    rng = np.random.default_rng([41, (INT8 + INT8_SUMS + INT8_SUMS16).index(name), int(pdl0), int(graph)])
    opts, banks = gguf_layer((name, name, name), H, I, E, rng)
    errs = back_to_back_errs(opts, banks, 1, H, I, E, K, rng, graph)
    print(f"gguf cuda accuracy {name} int8 back to back pdl0={pdl0} graph={graph}: {max(errs):.2e}")
    assert max(errs) < REL_TOL, errs


@pytest.mark.parametrize("scales", list(FAR_SCALES))
@pytest.mark.parametrize("name", ["IQ4_XS", "MXFP4"])
def test_gguf_int8_units_scales_far_apart(name, scales, monkeypatch):
    """Block scales of 2^-20 and 2^+20 (as test_gguf_unit_columns_scales_far_apart) with int8 units."""
    int8_pair((name, name, name), "small", [37, INT8.index(name), list(FAR_SCALES).index(scales)], monkeypatch,
              far_layer(name, scales))


# T = 2..8 with int8 units (kOptInt8Tokens; FTW_GGUF_CUDA_INT8_T8=1 both phases, =gate_up / =down
# one, off by default): a unit per quad, the IMMA's column n the item's pair n, each lane's rows of the
# chunk read as 16-byte LDS (IQ4_XS: its head by LDS.64, a word per unit), the weights as s8 (Q4_0:
# 16 (q - 8), IQ4_NL / IQ4_XS: the levels); x (act) quantized per token (pair) and chunk of 256 values
# into hi and lo planes. Only rows of whole 256-value chunks take it (Q4_0 / IQ4_NL: each row then on
# a 16-byte boundary: int8_tokens_rows); "partial" rows (352 / 160 values) keep main's kernels,
# whatever the switch says. IQ4_XS's rows are whole blocks of 136 bytes, so its chunks start 0 or 8
# bytes past a 16-byte boundary: "small" (down's rows one chunk: rows alternate), "chunks" (every
# other chunk), "xs" (gate / up's rows 3 chunks: rows and chunks alternate); it has no "partial".
# Each case runs every way and
# without (=0) on the same data: within the tolerance, no less accurate than the bf16 way (1.2x + 1e-5),
# and not identical to it where the rows are aligned (the path ran); unset, it is the int8 way in
# phases of many items (FTW_GGUF_CUDA_STAGED_ITEMS=0) and the bf16 way in phases of few (a billion).
INT8_T8 = ["Q4_0", "IQ4_NL", "IQ4_XS"]
INT8_T8_SIZES = ["small", "chunks", "partial", "xs"]


def int8_tokens_case(name, size, T, route, seed, monkeypatch, token_scales=None):
    H, I, E, K = INT8_SIZES[size]  # noqa: E741
    rng = np.random.default_rng(seed)
    opts, banks = gguf_layer((name, name, name), H, I, E, rng)
    if token_scales is None:
        x, x64 = bf16_x(T, H, rng)
    else:  # token t's x times token_scales[t] (the bf16 of the product; the reference takes the bf16 values)
        xs = rng.standard_normal((T, H)) * np.asarray(token_scales, dtype=np.float64)[:, None]
        xb = torch.from_numpy(xs.astype(np.float32)).to(torch.bfloat16)
        x, x64 = xb.cuda(), xb.float().double().numpy()
    ids, wts = routing(T, K, E, rng)
    if route == "same":  # items of T pairs
        ids[:] = ids[0]
    elif route == "mixed":  # the first half of the tokens the same K experts, the others their own
        ids[: (T + 1) // 2] = ids[0]
    ref = reference(opts, banks, H, I, x64, ids, wts)
    monkeypatch.setenv("FTW_GGUF_CUDA_INT8", "0")  # (T > 1: no effect; pinned so only the switch below varies)
    def rerun():
        return run(opts, banks, x, ids, wts)
    def err(out):  # with token scales, each token's error against its own norm (a small token keeps its precision)
        return max(rel_err(out[t], ref[t]) for t in range(T)) if token_scales is not None else rel_err(out, ref)
    outs, errs = switch_ways(monkeypatch, "FTW_GGUF_CUDA_INT8_T8", rerun, err)
    print(f"gguf cuda accuracy {name} {size} T={T} {route} int8 tokens: both {errs['1']:.2e}, gate_up only "
          f"{errs['gate_up']:.2e}, down only {errs['down']:.2e}, bf16 {errs['0']:.2e}")
    for v in ("1", "gate_up", "down"):
        assert errs[v] < REL_TOL, f"{name} {size} T={T} {route} int8 tokens {v}: {errs[v]:.3g}"
        assert errs[v] <= 1.2 * errs["0"] + 1e-5, f"{name} {size} T={T} {route}: {v} {errs[v]:.3g} against bf16 {errs['0']:.3g}"
        if size != "partial":
            assert not torch.equal(outs["0"], outs[v]), f"{name} {size} T={T} {route}: the int8 tokens path ({v}) did not run"
    if size != "partial":
        assert_default(monkeypatch, "FTW_GGUF_CUDA_INT8_T8", {"0": "1", "1000000000": "0"}, outs, rerun,
                       f"{name} {size} T={T} {route}")


@pytest.mark.parametrize("route", ["same", "random", "mixed"])
@pytest.mark.parametrize("T", [2, 3, 8])
@pytest.mark.parametrize("name, size", [(n, z) for n in INT8_T8 for z in INT8_T8_SIZES
                                         if z != ("partial" if n == "IQ4_XS" else "xs")])  # (IQ4_XS: whole 256-value rows)
def test_gguf_int8_tokens(name, size, T, route, monkeypatch):
    seed = [61, INT8_T8.index(name), INT8_T8_SIZES.index(size), T, ["same", "random", "mixed"].index(route)]
    int8_tokens_case(name, size, T, route, seed, monkeypatch)


@pytest.mark.parametrize("route", ["same", "random"])
@pytest.mark.parametrize("name", INT8_T8)
def test_gguf_int8_tokens_far_apart(name, route, monkeypatch):
    """T = 8, tokens of magnitudes 1e-3 .. 1e3 of each other (x and act quantized per token or pair and
    chunk: each token's own error within the tolerance and no worse than the bf16 way's); several
    chunks per row"""
    scales = [1e-3, 1.0, 1e3, 1.0, 1e-3, 1e3, 1.0, 1e-3]
    int8_tokens_case(name, "chunks", 8, route, [67, INT8_T8.index(name), route == "same"], monkeypatch, token_scales=scales)


@pytest.mark.parametrize("name", INT8_T8)
def test_gguf_int8_tokens_back_to_back(name, monkeypatch):
    """T = 8 steps launched back to back on one stream sharing one workspace (its int8 x and act
    rewritten by every step's quantize_int8_tokens launches), eagerly and in a CUDA graph, FTW_CUDA_PDL0=1"""
    monkeypatch.setenv("FTW_GGUF_CUDA_INT8_T8", "1")
    monkeypatch.setenv("FTW_CUDA_PDL0", "1")
    H, I, E, K = INT8_SIZES["small"]  # noqa: E741
    T = 8
    rng = np.random.default_rng([71, INT8_T8.index(name)])
    opts, banks = gguf_layer((name, name, name), H, I, E, rng)
    for graph in (False, True):
        errs = back_to_back_errs(opts, banks, T, H, I, E, K, rng, graph)
        print(f"gguf cuda accuracy {name} int8 tokens back to back graph={graph}: {max(errs):.2e}")
        assert max(errs) < REL_TOL, errs


# Q4_K / Q5_K phase 0 at T = 1 on int8 sub-block sums (kOptInt8Sums; FTW_GGUF_CUDA_INT8=1 or
# =gate_up, Q5_K's default; phase 1 keeps its bf16 decode): each lane's sub-blocks' exact q on mma
# m16n8k32 u8 x s8 against x quantized as for the int8 units, d sc and dmin m on the int32 sums. As
# int8_pair: within the tolerance, no less accurate than the bf16 decode, and not identical to it
# (=down leaves these types as they are). Rows of 2, 3 and 8 chunks (256-value blocks); down of the
# other K-quant and of Q8_0.
INT8_SUMS = ["Q4_K", "Q5_K"]


@pytest.mark.parametrize("size", ["small", "xs", "chunks"])
@pytest.mark.parametrize("name", INT8_SUMS)
def test_gguf_int8_sums(name, size, monkeypatch):
    int8_pair((name, name, name), size, [41, INT8_SUMS.index(name), list(INT8_SIZES).index(size)], monkeypatch)


@pytest.mark.parametrize("down", ["other", "Q8_0"])
@pytest.mark.parametrize("name", INT8_SUMS)
def test_gguf_int8_sums_down_other_type(name, down, monkeypatch):
    """gate_up on int8 sub-block sums, down of another type."""
    d = INT8_SUMS[1 - INT8_SUMS.index(name)] if down == "other" else down
    int8_pair((name, name, d), "chunks", [43, INT8_SUMS.index(name), int(down == "Q8_0")], monkeypatch)


# Q2_K at T = 1 on int8 sums of its 32-value units, both phases (kOptInt8Sums in kOptLanes16's kernel,
# Fast<Q2_K>::kInt8Mins16; FTW_GGUF_CUDA_INT8=1, =gate_up, =down): each lane's units 2 tig + e as u8
# sc * q (the 16-value sub-blocks' scales in the integers) on mma m16n8k32 u8 x s8 against x (act)
# quantized as for the int8 units, the mins by a second IMMA chain of the sub-blocks' m against the
# same x, d and dmin on the int32 sums. As int8_pair (within the tolerance, no less accurate than the
# lanes16 body, not identical to it in either phase), and the default (unset) is the way
# INT8_DEFAULT names. Rows of 2 and 3 blocks (gate_up rows of 252 bytes: rows on 4
# bytes, not 16), 8 blocks over more items than blocks; down of Q6_K and Q8_0 (their own kernels).
INT8_SUMS16 = ["Q2_K"]
# the default: int8 where a phase has many 16-row items per SM (FTW_GGUF_CUDA_STAGED_ITEMS, 12 unset:
# "0" every phase has, "1000000" none has)
INT8_DEFAULT = {"Q2_K": {"0": "1", "1000000": "0"}}


@pytest.mark.parametrize("size", ["small", "xs", "chunks"])
@pytest.mark.parametrize("name", INT8_SUMS16)
def test_gguf_int8_sums16(name, size, monkeypatch):
    int8_pair((name, name, name), size, [47, INT8_SUMS16.index(name), list(INT8_SIZES).index(size)], monkeypatch,
              default=INT8_DEFAULT[name])


@pytest.mark.parametrize("down", ["Q6_K", "Q8_0"])
@pytest.mark.parametrize("name", INT8_SUMS16)
def test_gguf_int8_sums16_down_other_type(name, down, monkeypatch):
    """gate_up on int8 unit sums, down of another type."""
    int8_pair((name, name, down), "chunks", [53, INT8_SUMS16.index(name), int(down == "Q8_0")], monkeypatch)


@pytest.mark.parametrize("name", INT8_SUMS16)
def test_gguf_int8_sums16_two_warps(name, monkeypatch):
    """Two warps splitting gate_up's rows of 8 blocks (FTW_CUDA_STAGED_KSPLIT=2; the launch's own
    choice is one warp): each warp's quad sums, then the block's reduction."""
    monkeypatch.setenv("FTW_CUDA_STAGED_KSPLIT", "2")
    int8_pair((name, name, name), "chunks", [59, INT8_SUMS16.index(name)], monkeypatch)


# IQ2 types at T = 1 with int8 units (kOptInt8 on IntSumRows with the grid in copies: a sub-block's
# grid bytes signed in registers, u8 128 + value on mma m16n8k32 u8 x s8, db on the int32 sums), where
# a phase reads its grid in copies (rows of 8 chunks or more, or FTW_GGUF_CUDA_GRID_COPIES=1). As
# int8_pair: every way within the tolerance, no less accurate than the bf16 sums, and not identical
# to them where a phase took the units. "copies" forces copies (so int8) in both phases; "default"
# leaves the rule: at "chunks" gate_up's rows have 8 chunks (int8), down's 2 (bf16 sums, one grid).
INT8_IQ = ["IQ2_XXS", "IQ2_XS"]


@pytest.mark.parametrize("copies", ["copies", "default"])
@pytest.mark.parametrize("size", ["small", "chunks"])
@pytest.mark.parametrize("name", INT8_IQ)
def test_gguf_int8_iq2(name, size, copies, monkeypatch):
    if copies == "copies":
        monkeypatch.setenv("FTW_GGUF_CUDA_GRID_COPIES", "1")
    H, I, E, K = INT8_SIZES[size]  # noqa: E741
    rng = np.random.default_rng([47, INT8_IQ.index(name), list(INT8_SIZES).index(size), int(copies == "copies")])
    opts, banks = gguf_layer((name, name, name), H, I, E, rng)
    rerun, ref, outs, errs = int8_ways(opts, banks, H, I, E, K, rng, monkeypatch)
    monkeypatch.delenv("FTW_GGUF_CUDA_INT8")
    outs[""] = rerun()  # the default (IqInt8<T>'s kInt8Default)
    errs[""] = rel_err(outs[""], ref)
    print(f"gguf cuda accuracy {name} {size} {copies} T=1: int8 {errs['1']:.2e}, gate_up only {errs['gate_up']:.2e}, "
          f"down only {errs['down']:.2e}, default {errs['']:.2e}, bf16 sums {errs['0']:.2e}")
    gu, dn = copies == "copies" or H // 256 >= 8, copies == "copies" or I // 256 >= 8  # phases with copies
    # the default: IQ2_XXS's wherever a phase has copies; IQ2_XS's only in phases of many items
    # (IqInt8<IQ2_XS>::kManyItems: at least 12 16-row items per SM, none of these sizes)
    taken = {"1": gu or dn, "gate_up": gu, "down": dn, "": (gu or dn) and name == "IQ2_XXS"}
    for v in ("1", "gate_up", "down", ""):
        assert errs[v] < REL_TOL, f"{name} {size} {copies} int8 {v}: {errs[v]:.3g}"
        assert errs[v] <= 1.2 * errs["0"] + 1e-5, f"{name} {size}: int8 {v} {errs[v]:.3g} against bf16 {errs['0']:.3g}"
    for v, t in taken.items():  # (not taken: no check; down's parts add into out in any order)
        if t:
            assert not torch.equal(outs["0"], outs[v]), f"{name} {size} {copies}: the int8 path ({v}) did not run"


# Q2_K, Q3_K and Q6_K in the staged kernel on float32 sums of their 16-value sub-blocks (the default
# ""; FTW_GGUF_CUDA_SUBBLOCKS=32 their decode before: Q2_K's values table, Q3_K and Q6_K in bf16),
# with rings of 2 (the default ""), 3 and 4 stages; Q3_K and Q6_K with d once per chunk (the
# default "": Q3_K's scale * quant in the mma, Q6_K's integer scales on the sums) and with d * sc
# per sub-block (FTW_GGUF_CUDA_CHUNK_D=0); Q2_K and Q3_K's scale * quant with wide lanes (the default
# "": a lane's 8 values of a unit in one sub-block, one 16-byte x load) and with a pair of scales per
# sub-block (FTW_GGUF_CUDA_WIDE=0)
@pytest.mark.parametrize("sub, stages, chunk_d, wide", [("", "", "", ""), ("", "3", "", ""), ("", "4", "", ""),
                                                        ("32", "", "", ""), ("", "", "0", ""), ("", "4", "0", ""),
                                                        ("", "", "", "0"), ("", "4", "", "0")])
@pytest.mark.parametrize("types, T, size", [(("Q6_K", "Q6_K", "Q6_K"), 1, {}),
                                            (("Q3_K", "Q3_K", "Q3_K"), 3, {"H": 768, "I": 256}),
                                            (("Q2_K", "Q2_K", "Q2_K"), 2, {}),
                                            (("Q2_K", "Q2_K", "Q6_K"), 8, {"H": 2048, "I": 512, "E": 16, "K": 8}),
                                            (("Q6_K", "Q6_K", "Q3_K"), 5, {"H": 768, "I": 512, "E": 16, "K": 8})])
def test_16_value_sub_blocks_on_float32_sums(types, T, size, sub, stages, chunk_d, wide, monkeypatch):
    """The quants as exact bf16 integers (Q2_K: 128 + q, its mins through the sum of x; Q3_K and
    Q6_K: the signed q - 4, q - 32; Q3_K with d once per chunk: (q - 4) * (sc - 32)), each 16-value
    sub-block one k16 step of the mma with its scale applied to the float32 sum, against
    gguf.quants' values: blocks on 2-byte boundaries (Q3_K, Q6_K: every other chunk and row), one
    item per block and more items than blocks, rows of 1, 2, 3 and 8 chunks, T = 1..8."""
    monkeypatch.setenv("FTW_GGUF_CUDA_SUBBLOCKS", sub)
    monkeypatch.setenv("FTW_CUDA_STAGED_STAGES", stages)
    monkeypatch.setenv("FTW_GGUF_CUDA_CHUNK_D", chunk_d)
    monkeypatch.setenv("FTW_GGUF_CUDA_WIDE", wide)
    check(types, T, [13, sum(map(ord, "".join(types))), len(sub), len(stages), len(chunk_d), 3 * len(wide)], **size)


# The staged decoders on float32 sums (K-quants, Q8_0, the IQ types) copying each row's chunk from
# the lane's piece address plus the chunk's offset (kOptWholeCopy: the default "" and "1";
# FTW_CUDA_STAGED_WHOLECOPY=0, kOptCopy32's counted copies), and Q3_K's aligned chunk body (the
# default; FTW_GGUF_CUDA_ALIGNED=0 never), at rings of 2, 3 and 4 stages
@pytest.mark.parametrize("whole, aligned, stages", [("1", "1", ""), ("1", "1", "3"), ("1", "1", "4"), ("1", "0", ""),
                                                    ("0", "1", ""), ("0", "0", ""), ("", "", "")])
@pytest.mark.parametrize("types, T, size", [(("Q3_K", "Q3_K", "Q3_K"), 1, {"H": 1024, "I": 512}),
                                            (("Q3_K", "Q3_K", "Q3_K"), 8, {"H": 2048, "I": 512, "E": 16, "K": 8}),
                                            (("Q3_K", "Q3_K", "Q3_K"), 3, {"H": 768, "I": 256}),
                                            (("Q2_K", "Q3_K", "Q6_K"), 5, {"H": 1024, "I": 768, "E": 16, "K": 8}),
                                            (("Q4_K", "Q4_K", "Q8_0"), 2, {"H": 1024, "I": 512}),
                                            (("IQ3_S", "IQ3_S", "Q5_K"), 4, {"H": 768, "I": 512})])
def test_whole_block_copies_and_the_aligned_q3_k_body(types, T, size, whole, aligned, stages, monkeypatch):
    """Against gguf.quants' values. Q3_K's 110-byte blocks: rows of 1024 and 2048 values (440, 880
    bytes) put every even chunk of every row on a 4-byte boundary and every odd one 2 bytes past
    (both bodies in one item, in both phases; down rows of 512 values: 2 chunks); rows of 768 and
    256 values (330, 110 bytes) alternate rows, so no warp's chunk takes the aligned body. The whole
    copies: blocks of 110, 84, 144, 176 and 110 bytes (IQ3_S) and Q8_0's 8 x 34 (a lane copying
    three pieces of a row), each span's last piece inside its chunk or not by the address."""
    monkeypatch.setenv("FTW_CUDA_STAGED_WHOLECOPY", whole)
    monkeypatch.setenv("FTW_GGUF_CUDA_ALIGNED", aligned)
    monkeypatch.setenv("FTW_CUDA_STAGED_STAGES", stages)
    check(types, T, [21, sum(map(ord, "".join(types))), T, ["", "0", "1"].index(whole), ["", "0", "1"].index(aligned), len(stages)], **size)


# the staged kernel's decode with tables (Fast<T>::decode_tables: the IQ grids and ksigns copied
# into shared memory per block, by loads and stores with FTW_GGUF_CUDA_TABLES=1, by cp.async with
# =async, the IQ types' default; Q2_K's four values per 16 in registers, which =1 and =async take
# over its float32 sub-block sums), without them (=0), and each type's default ("")
TABLE_WAYS = ["", "0", "1", "async"]


@pytest.mark.parametrize("way", TABLE_WAYS)
@pytest.mark.parametrize("name", ["Q2_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ3_S"])
def test_staged_decode_with_tables(name, way, monkeypatch):
    """Every way decodes the same values within the tolerance: T = 1, and T = 8 over more
    (expert, band) items than the grid has blocks (a block fills its tables once, then serves
    several items)."""
    monkeypatch.setenv("FTW_GGUF_CUDA_DECODER", "staged")
    monkeypatch.setenv("FTW_GGUF_CUDA_INTSUMS", "0")  # the IQ types' bf16 decode (test below: their default)
    if way:
        monkeypatch.setenv("FTW_GGUF_CUDA_TABLES", way)
    seed = [12, TYPES.index(name), TABLE_WAYS.index(way)]
    check((name, name, name), 1, seed + [1])
    check((name, name, name), 8, seed + [8], H=1024, I=512, E=16, K=8)


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
