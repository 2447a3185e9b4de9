"""Random expert banks of every registered format, for tests of runtimes (CPU executor, CUDA
kernels, slot pools) that need real-looking banks without a checkpoint.

    layer = random_layer("nvfp4", H=256, I=128, E=8, rng=rng)        # bank -> [E, *row_shape]
    layer.banks["gate_up"], layer.fmt (LayerFormat), layer.weights(e) (float64 via the decoder)
    banks = expert_banks({0: layer, 1: other}, activation=Activation("silu", limit=10.0))

Banks have the dtypes and row shapes the format class declares (checked here), in the numpy
views the loader returns (bf16 as uint16, e4m3 / e8m0 / packed FP4 as uint8). Values are fresh
random data, never zeros, sized so that with N(0, 1) hidden states the gate and up projections
reach magnitudes ~10-20: activation clamps (limit 7 or 10) are hit on a good share of rows.
`weights(e)` decodes one expert with the format's own float64 reference decoder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ftw.formats import Activation, LayerFormat, ModelShape, get_format
from ftw.formats.codes import E4M3
from ftw.loader import ExpertBanks, merge_expert_banks

# target magnitude of one projection output for N(0, 1) inputs of length K: std(W x) ~ TARGET
TARGET = 12.0
POOL_ROWS = 96  # gguf: rows quantized per projection (see _gguf_banks)

_E4M3_FINITE = np.array([b for b in range(256) if (b & 0x7F) != 0x7F], dtype=np.uint8)
_E4M3_ORDER = np.argsort(E4M3[_E4M3_FINITE], kind="stable")
_E4M3_SORTED = E4M3[_E4M3_FINITE][_E4M3_ORDER]


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """Nearest e4m3fn code of each value (saturating at +-448); ties go to the lower code."""
    x = np.clip(np.asarray(x, dtype=np.float64), -448.0, 448.0)
    i = np.clip(np.searchsorted(_E4M3_SORTED, x), 1, len(_E4M3_SORTED) - 1)
    lo, hi = _E4M3_SORTED[i - 1], _E4M3_SORTED[i]
    pick = np.where(np.abs(x - lo) <= np.abs(hi - x), i - 1, i)
    return _E4M3_FINITE[_E4M3_ORDER[pick]]


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float -> bf16 bit patterns (uint16), round to nearest even."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def _float_bank(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return bf16_bits(x)
    return np.asarray(x, dtype={"f16": np.float16, "f32": np.float32}[dtype])


@dataclass
class RandomLayer:
    fmt: LayerFormat
    H: int
    I: int  # noqa: E741
    banks: dict[str, np.ndarray]  # bank -> [E, *row_shape]
    num_experts: int = field(init=False)

    def __post_init__(self):
        self.num_experts = next(iter(self.banks.values())).shape[0]

    def rows(self, e: int) -> dict[str, np.ndarray]:
        return {name: bank[e] for name, bank in self.banks.items()}

    def weights(self, e: int) -> dict[str, np.ndarray]:
        """Expert e in float64 through the format's reference decoder."""
        return get_format(self.fmt.name).decode(self.rows(e), self.H, self.I, dict(self.fmt.options))


def _sigma(K: int) -> float:
    return TARGET / np.sqrt(K)


def _e8m0_around(rng, shape, value: float, spread: int = 2) -> np.ndarray:
    """E8M0 bytes near 2^round(log2(value)), +-spread binades."""
    centre = 127 + int(np.round(np.log2(value)))
    return (centre + rng.integers(-spread, spread + 1, size=shape)).astype(np.uint8)


def _nibbles(rng, shape) -> np.ndarray:
    return rng.integers(0, 256, size=shape, dtype=np.uint8)


def _proj_dims(H: int, I: int) -> dict[str, tuple[int, int]]:  # noqa: E741
    return {"gate_up": (2 * I, H), "down": (H, I)}


def _make(name: str, H: int, I: int, E: int, options: dict, rng, biases: bool) -> dict[str, np.ndarray]:  # noqa: E741,C901
    specs = get_format(name).banks(H, I, options)
    out: dict[str, np.ndarray] = {}
    dims = _proj_dims(H, I)
    if name == "bf16":
        for p, (rows, K) in dims.items():
            out[p] = bf16_bits(rng.standard_normal((E, rows, K)) * _sigma(K))
    elif name in ("fp8_block",):
        bo, bi = options.get("block_size", [128, 128])
        for p, (rows, K) in dims.items():
            out[p] = e4m3_encode(rng.standard_normal((E, rows, K)) * 64)
            s_shape = (E,) + specs[p + "_scale"].row_shape
            dt = specs[p + "_scale"].dtypes[0] if "scale_dtype" not in options else options["scale_dtype"]
            out[p + "_scale"] = _float_bank(rng.uniform(0.5, 2.0, s_shape) * _sigma(K) / 64, dt)
    elif name == "mxfp8":
        for p, (rows, K) in dims.items():
            out[p] = e4m3_encode(rng.standard_normal((E, rows, K)) * 64)
            out[p + "_scale"] = _e8m0_around(rng, (E, rows, K // 32), _sigma(K) / 64)
    elif name == "nvfp4":
        for p, (rows, K) in dims.items():
            out[p] = _nibbles(rng, (E, rows, K // 2))
            # e4m3 block scales in [1, 8], a per-row global of sigma / (|e2m1| ~ 3 * scale ~ 4)
            out[p + "_scale"] = e4m3_encode(rng.uniform(1.0, 8.0, (E, rows, K // 16)))
            out[p + "_global"] = (rng.uniform(0.5, 2.0, (E, rows)) * _sigma(K) / 10).astype(np.float32)
    elif name in ("mxfp4", "ds_fp4"):
        for p, (rows, K) in dims.items():
            out[p] = _nibbles(rng, (E, rows, K // 2))
            out[p + "_scale"] = _e8m0_around(rng, (E, rows, K // 32), _sigma(K) / 3)
    elif name == "affine":
        bits, gs = options["bits"], options["group_size"]
        for p, (rows, K) in dims.items():
            out[p] = rng.integers(0, 2**32, size=(E, rows, K * bits // 32), dtype=np.uint32)
            levels = 2**bits - 1
            scale = rng.uniform(0.5, 2.0, (E, rows, K // gs)) * _sigma(K) * 3.4 / levels
            dt = options.get("scale_dtype", "bf16")
            out[p + "_scale"] = _float_bank(scale, dt)
            out[p + "_offset"] = _float_bank(-scale * levels / 2 + rng.normal(0, 0.1, scale.shape) * _sigma(K), dt)
    elif name == "gguf":
        out.update(_gguf_banks(H, I, E, options, rng))
    else:
        raise NotImplementedError(f"bank_factory has no recipe for format {name!r}")
    if biases or specs.get("gate_up_bias") is not None and not specs["gate_up_bias"].optional:
        dt = specs["gate_up_bias"].dtypes[0]
        out["gate_up_bias"] = _float_bank(rng.standard_normal((E, 2 * I)) * 3.0, dt)
        out["down_bias"] = _float_bank(rng.standard_normal((E, H)) * 3.0, dt)
    for bname, arr in out.items():
        spec = specs[bname]
        assert arr.shape[1:] == spec.row_shape, (name, bname, arr.shape, spec.row_shape)
    missing = [b for b, s in specs.items() if not s.optional and b not in out]
    assert not missing, (name, missing)
    return out


def _gguf_banks(H: int, I: int, E: int, options: dict, rng) -> dict[str, np.ndarray]:  # noqa: E741
    from samples.make_gguf_samples import quantize

    gate_t = options.get("gate_type", options.get("gate_up_type"))
    up_t = options.get("up_type", options.get("gate_up_type"))
    down_t = options["down_type"]

    def q(rows: int, K: int, t: str) -> np.ndarray:
        # ggml's IQ quantizers are slow: quantize a pool of distinct rows, then draw every
        # expert's rows from it at random (experts still differ; the bytes are real encodings)
        pool = min(E * rows, POOL_ROWS)
        w = (rng.standard_normal((pool, K)) * _sigma(K)).astype(np.float32)
        b = np.asarray(quantize(w, t))
        if b.dtype != np.uint8:  # F32/F16 come back as floats
            b = b.view(np.uint8)
        b = b.reshape(pool, -1)
        pick = np.arange(E * rows) if pool == E * rows else rng.integers(0, pool, E * rows)
        return b[pick].reshape(E, rows, -1)

    gate, up = q(I, H, gate_t), q(I, H, up_t)
    if "gate_up_type" in options:
        gate_up = np.concatenate([gate, up], axis=1)
    else:
        gate_up = np.concatenate([gate.reshape(E, -1), up.reshape(E, -1)], axis=1)
    return {"gate_up": np.ascontiguousarray(gate_up), "down": q(H, I, down_t)}


def random_layer(name: str, H: int, I: int, E: int, rng: np.random.Generator,  # noqa: E741
                 options: dict[str, Any] | None = None, biases: bool = False) -> RandomLayer:
    """Random banks of one layer in format `name` (options as the format takes them; for
    fp8_block and affine an extra test-only key `scale_dtype` picks the scale banks' dtype)."""
    options = dict(options or {})
    scale_dtype = options.pop("scale_dtype", None)
    fmt = LayerFormat.of(name, options)
    make_opts = dict(options, **({"scale_dtype": scale_dtype} if scale_dtype else {}))
    return RandomLayer(fmt, H, I, _make(name, H, I, E, make_opts, rng, biases))


def expert_banks(layers: dict[int, RandomLayer], activation: Activation | None = None,
                 top_k: int = 2) -> ExpertBanks:
    """An ExpertBanks over the given layers (as the loader returns, placeholders included)."""
    first = next(iter(layers.values()))
    model = ModelShape(
        family="test", hidden_size=first.H, moe_intermediate_size=first.I,
        num_experts=first.num_experts, top_k=top_k, num_layers=max(layers) + 1,
        moe_layers=sorted(layers), activation=activation or Activation("silu"),
        layer_intermediate_sizes={l: r.I for l, r in layers.items() if r.I != first.I},
    )
    parts = [
        ExpertBanks(banks={n: {l: a} for n, a in r.banks.items()}, layer_formats={l: r.fmt},
                    num_experts=r.num_experts, dtypes={}, model=model)
        for l, r in layers.items()
    ]
    return merge_expert_banks(parts)
