"""Checks the CUDA experts make before any launch (csrc/cuda/experts.cu).

They need a build with CUDA (nvcc found at build time), not a GPU: every case is refused on
the host, so the device addresses passed are never dereferenced. The one case that passes
every check runs only where there is no GPU, where its launch fails with a CUDA error.
"""

from __future__ import annotations

from math import prod

import numpy as np
import pytest

from ftw import _runtime as rt
from ftw import spec
from ftw.errors import FormatError, FtwError, UnsupportedError
from ftw.formats import FORMATS, get_format

pytestmark = pytest.mark.skipif(not rt.cuda_experts_formats(), reason="ftw._runtime was built without CUDA")

BASE = 1 << 40  # a 4 KiB-aligned address; never read: every call here is refused first
CUDA_FORMATS = ["bf16", "ds_fp4", "fp8_block", "gguf", "mxfp4", "mxfp8", "nvfp4"]
# the ggml types csrc/formats/gguf/ (decoders.cuh) decodes (issue 14: every type the CPU executor has,
# less the float ones)
GGML_CUDA_TYPES = ["Q8_0", "Q4_K", "Q6_K", "Q5_K", "Q4_0", "MXFP4", "IQ4_NL", "IQ4_XS", "Q5_0", "Q4_1", "Q5_1",
                   "Q2_K", "Q3_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ3_S"]


def layer(fmt: str, H: int, I: int, options: dict | None = None, biases: bool = False):  # noqa: E741
    """(bank bases, row bytes, dtypes) of a valid layer view, from the Python format registry."""
    specs = get_format(fmt).banks(H, I, options or {})
    bases, rows, dtypes = [], [], {}
    for i, name in enumerate(get_format(fmt).bank_names):
        s = specs.get(name)
        if s is None or (s.optional and not biases):
            bases.append(0)
            rows.append(0)
            continue
        nbytes = prod(s.row_shape) * spec.dtype(s.dtypes[0]).itemsize
        bases.append(BASE + (i << 32))
        rows.append(-(-nbytes // 16) * 16)  # the pools' slot stride: rounded up to 16 bytes
        dtypes[name] = s.dtypes[0]
    return bases, rows, dtypes


def forward(fmt="nvfp4", H=256, I=128, E=8, S=8, T=1, K=2, bases=None, rows=None, options=None,  # noqa: E741
            act="silu", ws_bytes=None, block=(128, 128), scale="f32", bias="bf16", ggml_types=()):
    if bases is None:
        bases, rows, _ = layer(fmt, H, I, options, biases=fmt == "mxfp4")
    ws = rt.cuda_experts_workspace_bytes(T, K, I, E, H) if ws_bytes is None else ws_bytes
    rt.cuda_experts_forward(fmt, bases, rows, BASE, E, S, H, I, T, K, BASE, BASE, BASE, BASE, BASE, ws,
                            act, 1.702, 7.0, block[0], block[1], scale, bias, 0, list(ggml_types))


def test_cuda_formats_are_the_registry_formats_less_affine():
    assert sorted(rt.cuda_experts_formats()) == CUDA_FORMATS
    assert set(FORMATS) - set(CUDA_FORMATS) == {"affine"}


def test_ggml_cuda_types_listed_in_table_order():
    assert rt.cuda_ggml_types() == GGML_CUDA_TYPES


def test_every_gguf_kernel_slice_registered_its_types():
    """The GGUF kernels compile in slices (csrc/formats/gguf/build.cmake) that register each type's
    launcher at load; a type whose slice went missing would fall back to the table-driven decoder
    silently (right values, a fraction of the speed)."""
    table_driven = {"Q5_0", "Q4_1", "Q5_1"}  # no decoder of their own (decoders.cuh, Fast<T>)
    assert rt.cuda_ggml_own_decoders() == [t for t in GGML_CUDA_TYPES if t not in table_driven]


def test_format_without_kernel_refused_by_name():
    with pytest.raises(UnsupportedError, match="no CUDA kernel for layer format 'affine'"):
        forward("affine", bases=[BASE] * 6, rows=[4096] * 6)


def test_short_missing_and_misaligned_banks_refused():
    bases, rows, _ = layer("nvfp4", 256, 128)
    short = list(rows)
    short[3] -= 16
    with pytest.raises(FormatError, match=r"nvfp4 bank 3 \(down_scale\) has rows of"):
        forward(bases=bases, rows=short)
    gone = list(bases)
    gone[4] = 0
    with pytest.raises(FormatError, match=r"nvfp4 bank 4 \(gate_up_global\) is missing"):
        forward(bases=gone, rows=rows)
    odd = list(bases)
    odd[0] += 8
    with pytest.raises(FormatError, match=r"bank 0 \(gate_up\) base or row stride is not 16-byte aligned"):
        forward(bases=odd, rows=rows)


def test_mxfp4_needs_both_biases():
    bases, rows, _ = layer("mxfp4", 256, 128, biases=True)
    bases[5], rows[5] = 0, 0
    with pytest.raises(FormatError, match=r"mxfp4 bank 5 \(down_bias\) is missing"):
        forward("mxfp4", bases=bases, rows=rows)


def test_shapes_and_options_refused():
    with pytest.raises(UnsupportedError, match="multiples of 32"):
        forward(H=240)
    with pytest.raises(FormatError, match="workspace of 1024 bytes"):
        forward(ws_bytes=1024)
    with pytest.raises(FormatError, match="the pool has no slots"):
        forward(S=0)
    with pytest.raises(FormatError, match="must be positive"):
        forward(T=0)
    with pytest.raises(FormatError, match="split the step"):  # > 65535 tiles of 64 pairs: one grid dimension
        forward(T=1 << 20, K=8, ws_bytes=1 << 62)
    with pytest.raises(UnsupportedError, match="activation 'gelu'"):
        forward(act="gelu")
    with pytest.raises(UnsupportedError, match=r"block_size\[1\]=32 must be a multiple of 64"):
        forward("fp8_block", options={"block_size": [128, 32]}, block=(128, 32))
    with pytest.raises(UnsupportedError, match="block scales must be f32 or bf16"):
        forward("fp8_block", scale="f16")


@pytest.mark.skipif(rt.cuda_device_count() > 0, reason="would launch on made-up addresses")
@pytest.mark.parametrize("fmt", [f for f in CUDA_FORMATS if f != "gguf"])  # gguf: below, per type
def test_banks_sized_by_the_python_registry_pass_every_check(fmt):
    """The C++ bank sizes agree with ftw.formats' BankSpecs: a view built from them passes every
    check and fails only at the launch, for want of a GPU."""
    options = {"block_size": [128, 128]} if fmt == "fp8_block" else None
    bases, rows, _ = layer(fmt, 512, 256, options, biases=fmt in ("bf16", "mxfp4"))
    for T in (1, 40):  # the decode launch, and the prefill one (routing kernel first)
        with pytest.raises(FtwError, match="CUDA error") as e:
            forward(fmt, H=512, I=256, T=T, K=4, bases=bases, rows=rows, options=options)
        assert not isinstance(e.value, (FormatError, UnsupportedError))


# ---- gguf: the layer's ggml types travel as ids; a type without a decoder is refused by name ----


def gguf_opts(gate: str, up: str, down: str) -> dict:
    return {"gate_up_type": gate, "down_type": down} if gate == up else {"gate_type": gate, "up_type": up,
                                                                          "down_type": down}


def gguf_ids(gate: str, up: str, down: str) -> list[int]:
    from ftw.formats.ggml_types import ggml_type_named

    return [ggml_type_named(t).id for t in (gate, up, down)]


def test_gguf_type_without_cuda_decoder_refused_by_name():
    opts = gguf_opts("F16", "F16", "Q8_0")
    bases, rows, _ = layer("gguf", 256, 256, opts)
    with pytest.raises(UnsupportedError, match=r"gguf gate rows: ggml type id 1 has no CUDA decoder \(CUDA types: Q8_0"):
        forward("gguf", H=256, I=256, bases=bases, rows=rows, ggml_types=gguf_ids("F16", "F16", "Q8_0"))
    with pytest.raises(UnsupportedError, match="gguf gate rows: ggml type id -1 has no CUDA decoder"):
        forward("gguf", H=256, I=256, bases=bases, rows=rows)  # no ggml_types passed


def test_gguf_shapes_and_banks_refused():
    with pytest.raises(FormatError, match=r"gguf down rows: Q4_K rows hold whole blocks of 256 values; 128 is not"):
        forward("gguf", H=256, I=128, ggml_types=gguf_ids("Q8_0", "Q8_0", "Q4_K"), bases=[BASE] * 4, rows=[1 << 20] * 4)
    bases, rows, _ = layer("gguf", 256, 256, gguf_opts("Q4_K", "Q6_K", "Q8_0"))
    short = list(rows)
    short[0] = 256 * (144 + 210) - 1  # one byte short of gate's then up's rows
    with pytest.raises(FormatError, match=r"gguf bank 0 \(gate_up\) has rows of"):
        forward("gguf", H=256, I=256, bases=bases, rows=short, ggml_types=gguf_ids("Q4_K", "Q6_K", "Q8_0"))
    with pytest.raises(FormatError, match="ggml_types must be the"):
        forward("gguf", H=256, I=256, bases=bases, rows=rows, ggml_types=[8, 8])


@pytest.mark.skipif(rt.cuda_device_count() > 0, reason="would launch on made-up addresses")
@pytest.mark.parametrize("types", [(t, t, t) for t in GGML_CUDA_TYPES] + [("Q4_K", "Q5_K", "Q6_K"), ("IQ2_XS", "IQ3_S", "Q8_0")])
def test_gguf_banks_sized_by_the_python_registry_pass_every_check(types):
    opts = gguf_opts(*types)
    bases, rows, _ = layer("gguf", 512, 256, opts)
    for T in (1, 40):
        with pytest.raises(FtwError, match="CUDA error") as e:
            forward("gguf", H=512, I=256, T=T, K=4, bases=bases, rows=rows, ggml_types=gguf_ids(*types))
        assert not isinstance(e.value, (FormatError, UnsupportedError))


def test_unsupported_reason_names_each_ggml_type_without_decoder():
    """What `ftw check --runtime cuda` reports per layer: per format, and per ggml type for gguf."""
    ce = pytest.importorskip("ftw.runtime.cuda_experts")
    from ftw.formats import LayerFormat

    assert ce.unsupported_reason(LayerFormat.of("gguf", {"gate_type": "Q4_K", "up_type": "IQ3_S", "down_type": "Q6_K"})) is None
    assert ce.ggml_type_ids(LayerFormat.of("gguf", {"gate_up_type": "Q4_K", "down_type": "Q6_K"})) == [12, 12, 14]
    why = ce.unsupported_reason(LayerFormat.of("gguf", {"gate_type": "F16", "up_type": "Q8_0", "down_type": "BF16"}))
    assert why.startswith("no CUDA decoder for ggml type gate F16, down BF16 (CUDA types: Q8_0, Q4_K")
    assert ce.unsupported_reason(LayerFormat.of("affine", {"bits": 4, "group_size": 64})).startswith("no CUDA kernel for")


# The register-fed decode kernel's warps per block splitting a row (csrc/cuda/experts_kernels.cuh,
# k_split), at the launch shapes measured on the H200 (132 SMs; docs/BENCHMARKS.md, "Launch
# shapes"): the best fixed split of each case there, phase 0 (gate_up, grid I / (8 NT) x 8) and
# phase 1 (down, grid H / (16 NT) x 8), NT = the tiles per warp of the decoder's RegisterShape
# (2 for bf16 and fp8_block since "Register-fed decode shapes", 1 for the others).
@pytest.mark.parametrize("in_, vec, blocks, ks", [
    (7168, 8, 128 * 8, 4),    # deepseek-v3 bf16 gate_up: 56 chunks per warp (8 warps: 0.77x, 4: 0.81x)
    (7168, 16, 128 * 8, 2),   # deepseek-v3 fp8_block gate_up, NT = 2 (both phases 2 warps: 0.77x, 4: 0.71x)
    (2048, 16, 224 * 8, 2),   # deepseek-v3 fp8_block down, NT = 2
    (2048, 16, 48 * 8, 4),    # qwen3 fp8_block gate_up, NT = 2 (the rule's 4 and 4: 0.55x, both 2: 0.46x)
    (768, 16, 64 * 8, 4),     # qwen3 fp8_block down, NT = 2
    (7168, 16, 256 * 8, 2),   # deepseek-v3 fp8_block gate_up, NT = 1 (8 warps: 0.46x, 2: 0.53x)
    (7168, 32, 256 * 8, 2),   # deepseek-v3 nvfp4 (register-fed): 1 and 2 warps alike, 8 worst
    (2048, 16, 448 * 8, 2),   # deepseek-v3 fp8_block down: the GPU is full with 1 warp, 2 are faster
    (2048, 8, 48 * 8, 4),     # qwen3 bf16 gate_up: 2 warps leave the GPU under-filled (0.43x), 4 best
    (2048, 16, 96 * 8, 2),    # qwen3 fp8_block gate_up: 2 best (0.42x), 4: 0.36x
    (768, 8, 64 * 8, 4),      # qwen3 bf16 down: fills the GPU with 4
    (2048, 8, 224 * 8, 2),    # deepseek-v3 bf16 down: 64 chunks, more than 56 for one warp
])
def test_decode_split_follows_the_measured_launch_shapes(in_, vec, blocks, ks, monkeypatch):
    monkeypatch.delenv("FTW_CUDA_KSPLIT", raising=False)
    assert rt.cuda_decode_ksplit(in_, vec, blocks, 132) == ks


def test_decode_split_is_a_power_of_two_within_the_block_and_forced_by_environment(monkeypatch):
    monkeypatch.delenv("FTW_CUDA_KSPLIT", raising=False)
    for in_ in (256, 768, 2048, 2880, 7168, 16384):
        for blocks in (8, 100, 1000, 10000):
            for sms in (1, 78, 132):
                ks = rt.cuda_decode_ksplit(in_, 16, blocks, sms)
                assert ks in (2, 4, 8), (in_, blocks, sms, ks)
                # the GPU is filled (8 warps per SM) unless the block holds 8 warps already
                assert blocks * ks >= 8 * sms or ks == 8, (in_, blocks, sms, ks)
    monkeypatch.setenv("FTW_CUDA_KSPLIT", "2")
    assert rt.cuda_decode_ksplit(7168, 16, 2048, 132) == 2
    monkeypatch.setenv("FTW_CUDA_KSPLIT", "3")  # not a power of two: the rule's choice
    assert rt.cuda_decode_ksplit(7168, 16, 2048, 132) == 2


# gguf's many-items rule (staged_for_items: at least 12 16-row items per SM) counts the items of the
# experts a decode step routes to, which the launch cannot see: K at T = 1..3 and in prefill, and at
# T = 4..8 what independent tokens route to on average (docs/BENCHMARKS.md "Routed experts in the
# item count": qwen3-30b-a3b T = 8 independent 1.32-1.54x for Q4_0, IQ4_NL, IQ4_XS, MXFP4).
def test_gguf_items_count_the_experts_independent_tokens_route_to(monkeypatch):
    monkeypatch.delenv("FTW_GGUF_CUDA_ROUTING", raising=False)
    rng = np.random.default_rng()
    for E, K in ((128, 8), (256, 8), (64, 4), (32, 6)):
        for T in (1, 2, 3, 9, 40, 2048):
            assert rt.cuda_routed_experts(T, K, E) == K, (E, K, T)
        for T in range(4, 9):
            # the expected count of distinct experts, drawn here: each token K of E without repeats
            drawn = np.mean([len(np.unique(np.argsort(rng.random((T, E)), axis=1)[:, :K])) for _ in range(4000)])
            got = rt.cuda_routed_experts(T, K, E)
            assert K < got < min(E, T * K), (E, K, T, got)
            assert abs(got - drawn) < 0.02 * drawn, (E, K, T, got, drawn)
    # qwen3-30b-a3b at T = 8: gate_up's 96 bands x the routed experts are over 12 per SM of 132 (the
    # staged kernel), where K's 8 experts gave 5.8 (register-fed)
    assert 96 * rt.cuda_routed_experts(8, 8, 128) / 132 > 12 > 96 * 8 / 132
    assert rt.cuda_routed_experts(8, 16, 8) == 8  # K over E: every expert
    monkeypatch.setenv("FTW_GGUF_CUDA_ROUTING", "same")
    for T in (4, 8):
        assert rt.cuda_routed_experts(T, 8, 128) == 8
