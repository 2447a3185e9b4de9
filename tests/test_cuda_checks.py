"""Checks the CUDA experts make before any launch (csrc/cuda/experts.cu).

They need a build with CUDA (nvcc found at build time), not a GPU: every case is refused on
the host, so the device addresses passed are never dereferenced. The one case that passes
every check runs only where there is no GPU, where its launch fails with a CUDA error.
"""

from __future__ import annotations

from math import prod

import pytest

from ftw import _runtime as rt
from ftw import spec
from ftw.errors import FormatError, FtwError, UnsupportedError
from ftw.formats import FORMATS, get_format

pytestmark = pytest.mark.skipif(not rt.cuda_experts_formats(), reason="ftw._runtime was built without CUDA")

BASE = 1 << 40  # a 4 KiB-aligned address; never read: every call here is refused first
CUDA_FORMATS = ["bf16", "ds_fp4", "fp8_block", "mxfp4", "mxfp8", "nvfp4"]


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
            act="silu", ws_bytes=None, block=(128, 128), scale="f32", bias="bf16"):
    if bases is None:
        bases, rows, _ = layer(fmt, H, I, options, biases=fmt == "mxfp4")
    ws = rt.cuda_experts_workspace_bytes(T, K, I, E) if ws_bytes is None else ws_bytes
    rt.cuda_experts_forward(fmt, bases, rows, BASE, E, S, H, I, T, K, BASE, BASE, BASE, BASE, BASE, ws,
                            act, 1.702, 7.0, block[0], block[1], scale, bias, 0)


def test_cuda_formats_are_the_registry_formats_less_affine_and_gguf():
    assert sorted(rt.cuda_experts_formats()) == CUDA_FORMATS
    assert set(FORMATS) - set(CUDA_FORMATS) == {"affine", "gguf"}


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
@pytest.mark.parametrize("fmt", CUDA_FORMATS)
def test_banks_sized_by_the_python_registry_pass_every_check(fmt):
    """The C++ bank sizes agree with ftw.formats' BankSpecs: a view built from them passes every
    check and fails only at the launch, for want of a GPU."""
    options = {"block_size": [128, 128]} if fmt == "fp8_block" else None
    bases, rows, _ = layer(fmt, 512, 256, options, biases=fmt in ("bf16", "mxfp4"))
    for T in (1, 40):  # the decode launch, and the prefill one (routing kernel first)
        with pytest.raises(FtwError, match="CUDA error") as e:
            forward(fmt, H=512, I=256, T=T, K=4, bases=bases, rows=rows, options=options)
        assert not isinstance(e.value, (FormatError, UnsupportedError))
