"""The runtime's ggml type table (csrc/formats/gguf/ggml_types.*): decoders and dot products.

Rows are quantized by the real libraries (ggml's own quantizer from the xllamacpp wheel for every
quantized type, gguf.quants too where it can quantize), from fresh random data with a different
magnitude per row. References:
- to_float: gguf.quants.dequantize (bit-exact to ggml), compared bit for bit;
- dot: float64 sum of the dequantized row times x. Tolerance: |dot - ref| <= 1e-5 * sum|w_i x_i|
  (float32 accumulation over at most a few thousand products stays far below that).
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize as gguf_quantize

from ftw import _runtime, errors
from ftw.readers.gguf_file import known_types
from samples.ggml_quant import quantize as ggml_quantize

DOT_RTOL = 1e-5
# the types issue 11 asks the CPU executor for, plus the plain float types
REQUIRED = {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL",
            "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ3_S", "MXFP4", "F32", "F16", "BF16"}
TYPES = _runtime.ggml_types()
GGUF_QUANTIZES = {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4"}  # gguf.quants can write these


def _rng():
    seed = int.from_bytes(os.urandom(4), "little")
    return np.random.default_rng(seed), seed


def _n_values(name: str) -> int:
    """An odd number of blocks (exercises the kernels' unrolled loops and their tails)."""
    _, block, _ = _runtime.ggml_type_info(name)
    return {1: 1003, 32: 32 * 37, 256: 256 * 5}[block]


def _weights(rng, rows: int, n: int) -> np.ndarray:
    scale = 10.0 ** rng.uniform(-3, 2, (rows, 1))  # a different magnitude per row
    return (rng.standard_normal((rows, n)) * scale).astype(np.float32)


def _quantized(name: str, w: np.ndarray) -> list[np.ndarray]:
    """[rows, row_bytes] uint8 encodings of w in type `name`, one per library that writes it."""
    if name == "F32":
        return [w.view(np.uint8)]
    if name == "F16":
        return [w.astype(np.float16).view(np.uint8)]
    if name == "BF16":
        return [gguf_quantize(w, Q.BF16)]
    out = [ggml_quantize(w, name)]
    if name in GGUF_QUANTIZES:
        out.append(gguf_quantize(w, Q[name]))
    return out


def test_table_lists_the_required_types():
    assert set(TYPES) == REQUIRED
    assert len(TYPES) == len(set(TYPES))


def test_table_matches_the_gguf_reader():
    """Same names, ids and block sizes as the ftw gguf reader (gguf.constants) for every type."""
    reader = {t.name: t for t in known_types()}
    for name in TYPES:
        t = reader[name]
        assert _runtime.ggml_type_info(name) == (t.id, t.block, t.nbytes), name


@pytest.mark.parametrize("name", TYPES)
def test_to_float_is_bit_exact(name):
    rng, seed = _rng()
    n = _n_values(name)
    w = _weights(rng, 4, n)
    for raw in _quantized(name, w):
        raw = np.ascontiguousarray(raw)
        ref = dequantize(raw, Q[name]).astype(np.float32).reshape(4, n)
        assert np.isfinite(ref).all()
        for r in range(4):
            got = _runtime.ggml_to_float(name, raw[r], n)
            assert got.dtype == np.float32 and got.shape == (n,)
            np.testing.assert_array_equal(got.view(np.uint32), ref[r].view(np.uint32), err_msg=f"{name} row {r} seed {seed}")
        # several rows in one call: rows are back to back
        np.testing.assert_array_equal(_runtime.ggml_to_float(name, raw, 4 * n), ref.reshape(-1))


@pytest.mark.parametrize("name", TYPES)
def test_to_float_random_bytes(name):
    """Arbitrary bit patterns (subnormal, inf and NaN scales, every grid index) decode as gguf does."""
    rng, seed = _rng()
    _, block, nbytes = _runtime.ggml_type_info(name)
    n = block * 64 if block > 1 else 4096
    raw = rng.integers(0, 256, n // block * nbytes, dtype=np.uint8)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        ref = dequantize(raw, Q[name]).astype(np.float32).reshape(-1)
    got = _runtime.ggml_to_float(name, raw, n)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg=f"{name} seed {seed}")
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], ref.view(np.uint32)[~nan], err_msg=f"{name} seed {seed}")


@pytest.mark.parametrize("name", TYPES)
def test_dot_against_float64(name):
    rng, seed = _rng()
    n = _n_values(name)
    w = _weights(rng, 4, n)
    for raw in _quantized(name, w):
        raw = np.ascontiguousarray(raw)
        ref_w = dequantize(raw, Q[name]).astype(np.float64).reshape(4, n)
        for r in range(4):
            x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-2, 2)).astype(np.float32)
            terms = ref_w[r] * x.astype(np.float64)
            ref, scale = terms.sum(), np.abs(terms).sum()
            assert scale > 0
            for portable in (False, True):
                got = _runtime.ggml_dot(name, raw[r], x, portable=portable)
                assert abs(got - ref) <= DOT_RTOL * scale, (
                    f"{name} row {r} portable={portable} seed {seed}: {got} vs {ref} (scale {scale})")


@pytest.mark.parametrize("name", TYPES)
def test_matmul_several_tokens(name):
    """dot_multi (each block decoded once for several tokens) for 1..9 tokens against float64."""
    rng, seed = _rng()
    n = _n_values(name)
    w = _weights(rng, 3, n)
    raw = np.ascontiguousarray(_quantized(name, w)[0])
    ref_w = dequantize(raw, Q[name]).astype(np.float64).reshape(3, n)
    for tokens in (1, 2, 5, 9):
        x = rng.standard_normal((tokens, n)).astype(np.float32)
        got = _runtime.ggml_matmul(name, raw, x)
        assert got.shape == (tokens, 3) and got.dtype == np.float32
        terms = x.astype(np.float64)[:, None, :] * ref_w[None, :, :]
        err = np.abs(got - terms.sum(-1))
        assert (err <= DOT_RTOL * np.abs(terms).sum(-1)).all(), f"{name} tokens={tokens} seed {seed}: {err.max()}"


SIMD_CAP = os.environ.get("FTW_GGML_SIMD", "")


@pytest.mark.parametrize("name", ["Q2_K", "Q4_K", "Q5_K"])
def test_long_rows_one_token(name):
    """dot_rows for long rows (Q2_K's 16-value sums of x go to the heap past 16384 values)."""
    rng, seed = _rng()
    n = 256 * 72
    raw = np.ascontiguousarray(ggml_quantize(_weights(rng, 2, n), name))
    x = rng.standard_normal((1, n)).astype(np.float32)
    terms = dequantize(raw, Q[name]).astype(np.float64).reshape(2, n) * x.astype(np.float64)
    err = np.abs(_runtime.ggml_matmul(name, raw, x)[0] - terms.sum(-1))
    assert (err <= DOT_RTOL * np.abs(terms).sum(-1)).all(), f"{name} seed {seed}: {err}"


def test_simd_level():
    flags = set(open("/proc/cpuinfo").read().split()) if os.path.exists("/proc/cpuinfo") else set()
    want = "avx2" if {"avx2", "fma", "f16c"} <= flags and SIMD_CAP != "portable" else "portable"
    assert _runtime.ggml_simd_level() == want


@pytest.mark.skipif(SIMD_CAP == "portable" or _runtime.ggml_simd_level() == "portable", reason="already portable")
def test_portable_kernels():
    """FTW_GGML_SIMD=portable turns the SIMD kernels off (dot_multi's portable decode-once path
    included): the dot and matmul tests pass that way too."""
    env = dict(os.environ, FTW_GGML_SIMD="portable")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", __file__, "-k", "dot or matmul or simd"],
        env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_unknown_type_refused():
    row = np.zeros(34, np.uint8)
    with pytest.raises(errors.UnsupportedError, match="Q9_9"):
        _runtime.ggml_to_float("Q9_9", row, 32)
    with pytest.raises(errors.UnsupportedError, match="IQ1_S"):  # known to gguf, not decoded here
        _runtime.ggml_dot("IQ1_S", row, np.ones(32, np.float32))
    with pytest.raises(errors.UnsupportedError):
        _runtime.ggml_type_info("q4_k")  # names are gguf's, case included


def test_wrong_sizes_refused():
    rng, _ = _rng()
    raw = np.ascontiguousarray(ggml_quantize(rng.standard_normal(256).astype(np.float32), "Q4_K"))
    x = rng.standard_normal(256).astype(np.float32)
    with pytest.raises(errors.FormatError, match="take 144 bytes, got 143"):
        _runtime.ggml_to_float("Q4_K", raw[:143], 256)
    with pytest.raises(errors.FormatError, match="block size 256"):
        _runtime.ggml_to_float("Q4_K", raw, 128)
    with pytest.raises(errors.FormatError, match="block size 256"):
        _runtime.ggml_dot("Q4_K", raw, x[:255])
    with pytest.raises(errors.FormatError, match="take 288 bytes, got 144"):
        _runtime.ggml_dot("Q4_K", raw, np.concatenate([x, x]))
    with pytest.raises(errors.FormatError, match="float32"):
        _runtime.ggml_dot("Q4_K", raw, x.astype(np.float64))
    with pytest.raises(errors.FormatError, match="uint8"):
        _runtime.ggml_to_float("Q4_K", raw.view(np.int8), 256)
    with pytest.raises(errors.FormatError, match="uint8"):
        _runtime.ggml_dot("Q4_K", np.stack([raw, raw], axis=1)[:, 0], x)  # strided view
    with pytest.raises(errors.FormatError, match="take 288 bytes, got 144"):
        _runtime.ggml_matmul("Q4_K", raw[None], np.ones((2, 512), np.float32))
    with pytest.raises(errors.FormatError, match="2-d float32"):
        _runtime.ggml_matmul("Q4_K", raw[None], x)
