"""The staged decode kernel's own launch paths and the fp4 decoders' bit placement
(csrc/cuda/experts_kernels.cuh: experts_decode_staged, launch_staged; csrc/formats/nvfp4/cuda.cu,
csrc/cuda/e8m0_fp4_decoder.cuh), against the float64 reference with tests/test_cuda_kernels.py's
tolerance (||out - ref|| / ||ref|| < 4e-3; the same stated arithmetic: exact bf16 weights,
float32 sums, the activation rounded to bf16 once).

- down's items split between blocks (FTW_CUDA_STAGED_PARTS forces 2 or 4 parts; the launch
  rule splits only at shapes larger than a test's): each part adds its share into out, the
  first one the bias (mxfp4 has biases: a bias added twice is off by far more than the bound);
- every variant of the staged kernel (FTW_CUDA_STAGED_OPT: the decoders' previous decode, the
  kernel before the lean producer and act in pair order, each of the two, both at 128 registers),
  and 32-row stages (FTW_CUDA_STAGED_ROWS32, and the default rule's choice) in both phases or
  gate_up only, at T = 1, 3, 8, with 4 warps splitting a row and with down's items in parts;
- finer work for phases of few items per SM (FTW_CUDA_STAGED_FINE; the default for mxfp8 there)
  in either phase or both at T = 1, 3, 8, with down's parts of 2 chunks (FTW_CUDA_STAGED_PART_MIN);
- mxfp4 / ds_fp4's E8M0 scale pair by add-and-clamp and multiply (FTW_CUDA_STAGED_SCALE2=0: as
  before) at 32- and 16-row stages, and every E8M0 byte of the exact range through both;
- unit columns at T = 1 (kOptUnitCols, mxfp4 / ds_fp4's default there; FTW_CUDA_STAGED_UNITCOLS=1
  forces them for nvfp4 too, =0 the decode as before): every launch path it takes (32- and 16-row stages, 128 registers, 4 warps
  splitting a row, down in parts), every E8M0 byte of the exact range, every e4m3 byte, tokens of
  2^-24 .. 2^24, and e2m1 codes all 0.5 (a bf16 subnormal in the mma: a tensor core that flushed
  it would give zeros); the edge cases also in 32-row stages (nvfp4: its two groups in two mma
  columns, the e4m3 scale pair by one cvt);
- nvfp4 block scales over every finite e4m3 byte, signed and subnormal (the decoder places the
  scale's bits into a bf16 and multiplies by 2^184 in two exact steps), and an expert whose
  scales are all subnormal (0x01..0x07: a decoder that flushed them would give zeros).
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

STAGED = ["nvfp4", "mxfp4", "ds_fp4", "mxfp8"]  # the formats that decode with the staged kernel


def forward_and_ref(name, H, I, E, K, T, seed, banks=None, opts=None):  # noqa: E741
    rng = np.random.default_rng(seed)
    if banks is None:
        opts, banks = make_banks(name, H, I, E, rng)
    x, x64 = bf16_x(T, H, rng)
    ids, wts = routing(T, K, E, rng)
    act = ACTS["swiglu_oai"] if name == "mxfp4" else ACTS["silu"]
    out = run(name, opts, banks, x, ids, wts, act)
    return out, Reference(name, opts, banks, H, I).forward(x64, ids, wts, act)


def check_case(name, cases, case, seed, monkeypatch):
    """One (H, I, E, K, T, env) case of a table below: its switches set, the step against the float64
    reference within the format's tolerance."""
    H, I, E, K, T, env = cases[case]  # noqa: E741
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    out, ref = forward_and_ref(name, H, I, E, K, T, seed)
    assert rel_err(out, ref) < tol(name)


@pytest.mark.parametrize("name", STAGED)
@pytest.mark.parametrize("parts", [2, 4])
@pytest.mark.parametrize("T", [1, 3])
def test_down_items_split_between_blocks(name, parts, T, monkeypatch):
    monkeypatch.setenv("FTW_CUDA_STAGED_PARTS", str(parts))
    # I = 1024: 4 chunks of 256 values per down row for fp4, 8 for mxfp8 (parts of 1-4 chunks)
    out, ref = forward_and_ref(name, 256, 1024, 8, 4, T, [parts, T, STAGED.index(name)])
    assert rel_err(out, ref) < tol(name)


@pytest.mark.parametrize("name", STAGED)
@pytest.mark.parametrize("opt", ["0", "1", "lean", "perm", "wide", "default"])
@pytest.mark.parametrize("T", [1, 3])
def test_staged_variants(name, opt, T, monkeypatch):
    # every variant of the staged kernel (FTW_CUDA_STAGED_OPT; default: the lean producer and act
    # stored in the decoders' pair order); I = 160: down rows of 5 units (a partial chunk: units
    # past the row zero-filled, their sides at the row's last unit), H = 256 rows of 8 units
    if opt != "default":
        monkeypatch.setenv("FTW_CUDA_STAGED_OPT", opt)
    monkeypatch.setenv("FTW_CUDA_DECODE", "staged")
    out, ref = forward_and_ref(name, 256, 160, 16, 4, T, [T, STAGED.index(name), len(opt)])
    assert rel_err(out, ref) < tol(name)


# 32-row stages (kOptRows32; FTW_CUDA_STAGED_ROWS32=n: rows of at least n chunks; by default where
# a phase has 6 items of 32 rows per SM, fp4 only): (H, I, E, K, T, env) per case. small: H = 256
# (gate_up rows of one chunk), I = 160 (down rows of 5 units: a partial chunk); t8: 32 pairs;
# ksplit4: 4 warps splitting gate_up's 8 chunks (fp4; the partials of both tiles reduced through
# shared memory); parts2: down's items in 2 parts at T = 1; long: only gate_up's rows (24 chunks for
# fp4, 48 for mxfp8) take it, down keeps 16-row stages; default: the rule's own choice, down's 100
# bands of 32 rows x 8 experts (6 per SM on a GPU of up to 133 SMs) for fp4, gate_up's 4 x 8 not
ROWS32_CASES = {
    "small_t1": (256, 160, 16, 4, 1, {"FTW_CUDA_STAGED_ROWS32": "1"}),
    "small_t3": (256, 160, 16, 4, 3, {"FTW_CUDA_STAGED_ROWS32": "1"}),
    "t8": (256, 160, 16, 4, 8, {"FTW_CUDA_STAGED_ROWS32": "1"}),
    "ksplit4": (2048, 160, 8, 4, 2, {"FTW_CUDA_STAGED_ROWS32": "1", "FTW_CUDA_STAGED_KSPLIT": "4"}),
    "parts2": (256, 1024, 8, 4, 1, {"FTW_CUDA_STAGED_ROWS32": "1", "FTW_CUDA_STAGED_PARTS": "2"}),
    "long": (6144, 256, 8, 4, 1, {"FTW_CUDA_STAGED_ROWS32": "24"}),
    "default": (3200, 64, 8, 8, 1, {}),
}


@pytest.mark.parametrize("name", STAGED)
@pytest.mark.parametrize("case", list(ROWS32_CASES))
def test_staged_rows32(name, case, monkeypatch):
    check_case(name, ROWS32_CASES, case, [7, STAGED.index(name), list(ROWS32_CASES).index(case)], monkeypatch)


# mxfp4 / ds_fp4's E8M0 scale pair by one add-and-clamp and one multiply (kOptScale2, the
# default) and by e8m0_bf16 as before (FTW_CUDA_STAGED_SCALE2=0; nvfp4 runs the same kernel either
# way, a control): (H, I, E, K, T, env). rows32_t1 / rows32_t3: 32-row stages (gate_up rows of 8 and
# 12 chunks, down rows of a partial chunk); rows16: 16-row stages; ksplit4: 4 warps splitting
# gate_up's rows of 32 chunks.
SCALE2_CASES = {
    "rows32_t1": (2048, 160, 8, 4, 1, {"FTW_CUDA_STAGED_ROWS32": "1"}),
    "rows32_t3": (3072, 64, 8, 4, 3, {"FTW_CUDA_STAGED_ROWS32": "1"}),
    "rows16": (2048, 96, 8, 4, 2, {"FTW_CUDA_STAGED_ROWS32": "0"}),
    "ksplit4": (8192, 64, 8, 4, 1, {"FTW_CUDA_STAGED_ROWS32": "1", "FTW_CUDA_STAGED_KSPLIT": "4"}),
}


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "ds_fp4"])
@pytest.mark.parametrize("scale2", ["0", "default"])
@pytest.mark.parametrize("case", list(SCALE2_CASES))
def test_staged_scale2(name, scale2, case, monkeypatch):
    if scale2 != "default":
        monkeypatch.setenv("FTW_CUDA_STAGED_SCALE2", scale2)
    check_case(name, SCALE2_CASES, case, [11, len(scale2), list(SCALE2_CASES).index(case), len(name)], monkeypatch)


@pytest.mark.parametrize("scale2", ["0", "default"])
def test_e8m0_scales_every_byte(scale2, monkeypatch):
    # every E8M0 byte of the exact range (63..190: e2m1 * 2^(s - 127) exact in bf16) through both
    # scale decodes of the staged kernel: gate row j of an expert scaled by 2^(s - 127) in all its
    # units, up row j by 2^(126 - s), so every act is of the default's size and a wrong byte shows
    H, I, E, K, T = 512, 256, 8, 4, 2  # noqa: E741
    rng = np.random.default_rng([12, len(scale2)])
    opts, banks = make_banks("ds_fp4", H, I, E, rng)
    s = np.tile(np.arange(63, 191, dtype=np.uint8), E * I // 128 + 1)[: E * I]
    s = rng.permutation(s).reshape(E, I, 1)
    gate = np.broadcast_to(s, (E, I, H // 32))
    banks["gate_up_scale"] = np.ascontiguousarray(np.concatenate([gate, 253 - gate], axis=1))
    if scale2 == "0":
        monkeypatch.setenv("FTW_CUDA_STAGED_SCALE2", "0")
    monkeypatch.setenv("FTW_CUDA_DECODE", "staged")
    out, ref = forward_and_ref("ds_fp4", H, I, E, K, T, [13], banks=banks, opts=opts)
    assert bool(torch.isfinite(out).all())
    assert rel_err(out, ref) < tol("ds_fp4")


E4M3_FINITE = np.array([b for b in range(256) if b & 0x7F != 0x7F], dtype=np.uint8)  # less the NaNs


@pytest.mark.parametrize("scales", ["every_byte", "subnormal"])
def test_nvfp4_block_scales(scales):
    H, I, E, K, T = 256, 256, 8, 4, 2  # noqa: E741
    rng = np.random.default_rng([5, len(scales)])
    opts, banks = make_banks("nvfp4", H, I, E, rng)
    for bank in ("gate_up", "down"):
        shape = banks[bank + "_scale"].shape
        if scales == "every_byte":
            s = rng.choice(E4M3_FINITE, shape)
            banks[bank + "_global"] = banks[bank + "_global"] / 64  # scales up to 448 where the default reach 4
        else:  # scales m * 2^-9 (m = 1..7): the global brings the products back to the default's size
            s = rng.integers(1, 8, shape).astype(np.uint8)
            banks[bank + "_global"] = banks[bank + "_global"] * 2.0**9 / 3
        banks[bank + "_scale"] = s.astype(np.uint8)
    out, ref = forward_and_ref("nvfp4", H, I, E, K, T, [6, len(scales)], banks=banks, opts=opts)
    assert rel_err(out, ref) < tol("nvfp4")


# Finer work where a phase has few items per SM (kOptFine, FTW_CUDA_STAGED_FINE=both|gate_up|down
# forced for every format, =off never, unset the default rule: mxfp8 here: rings of 2 stages,
# up to 4 warps per block, each at most 2 chunks of an item where that suffices, gate_up at 80
# registers, down's items in parts of 2 chunks at T = 1), and down's parts of fewer chunks than
# the ring's stages (FTW_CUDA_STAGED_PART_MIN=2, 4-stage rings): H = 2048 (gate_up rows of 8
# chunks for fp4: 4 warps of 2 chunks, their partials reduced through shared memory; 16 for
# mxfp8), I = 672 (down rows of 21 units for fp4, 42 for mxfp8: a partial last chunk, so a part
# ends inside the row), at T = 1 (down in parts), 3 and 8 (32 pairs). (H, I, E, K, T, env)
FINE_CASES = {
    f"{mode}_t{T}": (2048, 672, 16, 4, T, {"FTW_CUDA_STAGED_ROWS32": "0", "FTW_CUDA_STAGED_FINE": mode})
    for mode in ("both", "gate_up", "down") for T in (1, 3, 8)
}
FINE_CASES.update({f"partmin2_t{T}": (256, 672, 16, 4, T, {"FTW_CUDA_STAGED_ROWS32": "0",
                                                            "FTW_CUDA_STAGED_PART_MIN": "2"}) for T in (1, 3)})
FINE_CASES.update({f"{mode}_t1": (2048, 672, 16, 4, 1, {"FTW_CUDA_STAGED_ROWS32": "0"} | env)
                   for mode, env in (("default", {}), ("off", {"FTW_CUDA_STAGED_FINE": "off"}))})


@pytest.mark.parametrize("name", STAGED)
@pytest.mark.parametrize("case", list(FINE_CASES))
def test_staged_fine(name, case, monkeypatch):
    check_case(name, FINE_CASES, case, [17, STAGED.index(name), list(FINE_CASES).index(case)], monkeypatch)


# Unit columns at T = 1 (kOptUnitCols: each unit's sums in a column of the mma, the scales applied
# to them as floats; mxfp4 / ds_fp4's default at T = 1, forced for every fp4 decoder by
# FTW_CUDA_STAGED_UNITCOLS=1) and the decode as before (=0): (H, I, E, K, T = 1, env). rows32:
# 32-row stages (gate_up rows of 8 chunks, down rows of 5 units: a partial chunk); rows16: 16-row
# stages; wide16: 16-row stages at 128 registers; ksplit4: 4 warps splitting gate_up's rows of 32
# chunks (both tiles' sums reduced through shared memory after the quad's); parts2 /
# parts2_rows16: down's items in 2 parts; default: the rules' own choice (down in 32-row stages,
# gate_up in 16).
UNITCOLS_CASES = {
    "rows32": (2048, 160, 8, 4, 1, {"FTW_CUDA_STAGED_ROWS32": "1"}),
    "rows16": (2048, 160, 8, 4, 1, {"FTW_CUDA_STAGED_ROWS32": "0"}),
    "wide16": (2048, 160, 8, 4, 1, {"FTW_CUDA_STAGED_ROWS32": "0", "FTW_CUDA_STAGED_WIDE": "1"}),
    "ksplit4": (8192, 64, 8, 4, 1, {"FTW_CUDA_STAGED_ROWS32": "1", "FTW_CUDA_STAGED_KSPLIT": "4"}),
    "parts2": (256, 1024, 8, 4, 1, {"FTW_CUDA_STAGED_ROWS32": "1", "FTW_CUDA_STAGED_PARTS": "2"}),
    "parts2_rows16": (256, 1024, 8, 4, 1, {"FTW_CUDA_STAGED_ROWS32": "0", "FTW_CUDA_STAGED_PARTS": "2"}),
    "default": (3200, 64, 8, 8, 1, {}),
}
FP4 = ["nvfp4", "mxfp4", "ds_fp4"]


@pytest.mark.parametrize("name", FP4)
@pytest.mark.parametrize("unitcols", ["0", "1"])
@pytest.mark.parametrize("case", list(UNITCOLS_CASES))
def test_staged_unit_cols(name, unitcols, case, monkeypatch):
    monkeypatch.setenv("FTW_CUDA_STAGED_UNITCOLS", unitcols)
    seed = [19, FP4.index(name), len(unitcols), list(UNITCOLS_CASES).index(case)]
    check_case(name, UNITCOLS_CASES, case, seed, monkeypatch)


# the unit-columns kernels the edge tests below run in: the rules' choice (16-row stages at their
# sizes) and 32-row stages
STAGES = {"auto": {}, "rows32": {"FTW_CUDA_STAGED_ROWS32": "1"}}


def set_stage(stage, monkeypatch):
    for k, v in STAGES[stage].items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize("unitcols", ["0", "1"])
@pytest.mark.parametrize("stage", list(STAGES))
def test_unit_cols_e8m0_every_byte(unitcols, stage, monkeypatch):
    # test_e8m0_scales_every_byte at T = 1: every E8M0 byte 63..190 as a gate row's scale (its up
    # row at 253 - s), through the scale applied to the float32 sums
    H, I, E, K = 512, 256, 8, 4  # noqa: E741
    rng = np.random.default_rng([21, len(unitcols)])
    opts, banks = make_banks("ds_fp4", H, I, E, rng)
    s = np.tile(np.arange(63, 191, dtype=np.uint8), E * I // 128 + 1)[: E * I]
    s = rng.permutation(s).reshape(E, I, 1)
    gate = np.broadcast_to(s, (E, I, H // 32))
    banks["gate_up_scale"] = np.ascontiguousarray(np.concatenate([gate, 253 - gate], axis=1))
    monkeypatch.setenv("FTW_CUDA_STAGED_UNITCOLS", unitcols)
    set_stage(stage, monkeypatch)
    for T in (1, 2):  # T = 2: the decode, whatever unitcols says (a control in the same data)
        out, ref = forward_and_ref("ds_fp4", H, I, E, K, T, [22, T], banks=banks, opts=opts)
        assert bool(torch.isfinite(out).all())
        assert rel_err(out, ref) < tol("ds_fp4"), T


@pytest.mark.parametrize("unitcols", ["0", "1"])
@pytest.mark.parametrize("stage", list(STAGES))
def test_unit_cols_nvfp4_every_e4m3_byte(unitcols, stage, monkeypatch):
    # test_nvfp4_block_scales ("every_byte", signed) at T = 1, both group scales of a unit (unit
    # columns: the pair by cvt.rn.f16x2.e4m3x2, each group in a column of its own)
    H, I, E, K = 256, 256, 8, 4  # noqa: E741
    rng = np.random.default_rng([23, len(unitcols)])
    opts, banks = make_banks("nvfp4", H, I, E, rng)
    for bank in ("gate_up", "down"):
        banks[bank + "_scale"] = rng.choice(E4M3_FINITE, banks[bank + "_scale"].shape).astype(np.uint8)
        banks[bank + "_global"] = banks[bank + "_global"] / 64
    monkeypatch.setenv("FTW_CUDA_STAGED_UNITCOLS", unitcols)
    set_stage(stage, monkeypatch)
    out, ref = forward_and_ref("nvfp4", H, I, E, K, 1, [24], banks=banks, opts=opts)
    assert rel_err(out, ref) < tol("nvfp4")


@pytest.mark.parametrize("name", FP4)
@pytest.mark.parametrize("scale", [24, -24, 0])
@pytest.mark.parametrize("stage", list(STAGES))
def test_unit_cols_tokens_far_apart(name, scale, stage, monkeypatch):
    # x times 2^kUnitColsX (57) in bf16 and act stored so: a single token of 2^24 (act ~2^50) or
    # 2^-24 stays within tolerance of its own reference
    monkeypatch.setenv("FTW_CUDA_STAGED_UNITCOLS", "1")
    set_stage(stage, monkeypatch)
    H, I, E, K = 512, 160, 16, 8  # noqa: E741
    rng = np.random.default_rng([25, FP4.index(name), scale + 24])
    opts, banks = make_banks(name, H, I, E, rng)
    x32 = (rng.standard_normal((1, H)) * 2.0**scale).astype(np.float32)
    xt = torch.from_numpy(x32).to(torch.bfloat16)
    ids, wts = routing(1, K, E, rng)
    act = ACTS["swiglu_oai"] if name == "mxfp4" else ACTS["silu"]
    out = run(name, opts, banks, xt.cuda(), ids, wts, act)
    ref = Reference(name, opts, banks, H, I).forward(xt.float().double().numpy(), ids, wts, act)
    assert rel_err(out, ref) < tol(name)


@pytest.mark.parametrize("name", FP4)
@pytest.mark.parametrize("unitcols", ["0", "1"])
@pytest.mark.parametrize("stage", list(STAGES))
def test_unit_cols_half_codes(name, unitcols, stage, monkeypatch):
    # every weight's e2m1 code 0.5 or -0.5 (0x1, 0x9): unscaled, 0.5 * 2^-126 is a bf16 subnormal
    # in the mma's A fragment; a tensor core that flushed it would give zeros
    H, I, E, K = 512, 256, 8, 4  # noqa: E741
    rng = np.random.default_rng([26, FP4.index(name), len(unitcols)])
    opts, banks = make_banks(name, H, I, E, rng)
    for bank in ("gate_up", "down"):
        codes = rng.choice(np.array([0x1, 0x9], dtype=np.uint8), banks[bank].shape + (2,))
        banks[bank] = (codes[..., 0] | (codes[..., 1] << 4)).astype(np.uint8)
    monkeypatch.setenv("FTW_CUDA_STAGED_UNITCOLS", unitcols)
    set_stage(stage, monkeypatch)
    out, ref = forward_and_ref(name, H, I, E, K, 1, [27], banks=banks, opts=opts)
    assert float(np.abs(ref).max()) > 0
    assert rel_err(out, ref) < tol(name)
