"""GGUF experts: raw ggml rows of any ggml type, per layer and per projection.

gate_up holds gate's rows' bytes, then up's; down holds down's rows. When gate and up share a
type, gate_up is [2I, row_bytes]; when they differ their rows have different sizes, so it is
one flat byte row per expert. Options name the types: gate_up_type, or gate_type and up_type
(exclusive), and down_type. Decoding is gguf.quants' own, bit-exact to ggml.
"""

from __future__ import annotations

import numpy as np

from ..errors import FormatError, UnsupportedError
from .base import BankSpec, ExpertFormat, Option, add_biases, bias_banks, register
from .ggml_types import ggml_type_named


def _is_type_name(v) -> str | None:
    try:
        ggml_type_named(v)
        return None
    except UnsupportedError:
        return "a ggml type name (Q4_K, Q6_K, IQ2_XS, ...)"


def row_nbytes(type_name: str, values: int, where: str = "") -> int:
    """Bytes of one row of `values` values in a ggml type."""
    t = ggml_type_named(type_name)
    if values % t.block:
        raise FormatError(f"{where}{type_name} rows hold whole blocks of {t.block} values; {values} is not a multiple")
    return t.row_nbytes(values)


@register
class Gguf(ExpertFormat):
    name = "gguf"
    summary = "raw ggml rows; gate_up = gate rows then up rows; types per projection"
    bank_names = ("gate_up", "down", "gate_up_bias", "down_bias")
    options = (
        Option("gate_up_type", _is_type_name, "ggml type of gate and up rows"),
        Option("gate_type", _is_type_name, "ggml type of gate rows (with up_type, when they differ)"),
        Option("up_type", _is_type_name, "ggml type of up rows"),
        Option("down_type", _is_type_name, "ggml type of down rows", required=True),
    )
    required_options = (("gate_up_type", "down_type"), ("gate_type", "up_type", "down_type"))
    legacy_options = ("swiglu_limit", "swiglu_alpha")

    @classmethod
    def check_combination(cls, options, where):
        if "gate_up_type" in options and ("gate_type" in options or "up_type" in options):
            raise FormatError(f"{where}: gguf option 'gate_up_type' excludes 'gate_type' and 'up_type'")
        if ("gate_type" in options) != ("up_type" in options):
            raise FormatError(f"{where}: gguf options 'gate_type' and 'up_type' go together")

    @staticmethod
    def types(options) -> tuple[str, str, str]:
        """(gate, up, down) ggml type names."""
        gate = options.get("gate_type", options.get("gate_up_type"))
        up = options.get("up_type", options.get("gate_up_type"))
        return gate, up, options["down_type"]

    @classmethod
    def banks(cls, H, I, options):
        gate, up, down = cls.types(options)
        if "gate_up_type" in options:
            gate_up = (2 * I, row_nbytes(gate, H, "gguf gate_up: "))
        else:
            gate_up = (I * row_nbytes(gate, H, "gguf gate: ") + I * row_nbytes(up, H, "gguf up: "),)
        return {
            "gate_up": BankSpec("gate_up", ("u8",), gate_up),
            "down": BankSpec("down", ("u8",), (H, row_nbytes(down, I, "gguf down: "))),
            **bias_banks(H, I, ("f32", "f16"), optional=True),
        }

    @classmethod
    def infer_dims(cls, shapes, options):
        H, down_row = shapes["down"][0], shapes["down"][1]
        t = ggml_type_named(cls.types(options)[2])
        return H, down_row // t.nbytes * t.block

    @classmethod
    def decode(cls, rows, H, I, options):
        from gguf import GGMLQuantizationType as Q
        from gguf.quants import dequantize

        gate_t, up_t, down_t = (Q[t] for t in cls.types(options))
        gu = np.asarray(rows["gate_up"]).view(np.uint8).reshape(-1)
        gate_nbytes = I * row_nbytes(gate_t.name, H)
        try:
            gate = dequantize(gu[:gate_nbytes].reshape(I, -1), gate_t)
            up = dequantize(gu[gate_nbytes:].reshape(I, -1), up_t)
            down = dequantize(np.asarray(rows["down"]).view(np.uint8).reshape(H, -1), down_t)
        except NotImplementedError as e:  # gguf.quants lacks a few types (Q8_1, Q8_K, integer types)
            raise UnsupportedError(f"gguf.quants cannot decode {gate_t.name}/{up_t.name}/{down_t.name}: {e}") from None
        w = {"gate": gate.astype(np.float64), "up": up.astype(np.float64), "down": down.astype(np.float64)}
        return add_biases(w, rows, I, lambda a: np.asarray(a, dtype=np.float64))

    @classmethod
    def decode_projection(cls, parts, options):
        """parts: {"weight": the projection's raw ggml rows [out, row bytes], "type": its ggml type name}."""
        from gguf import GGMLQuantizationType as Q
        from gguf.quants import dequantize

        w = np.asarray(parts["weight"]).view(np.uint8)
        try:
            return dequantize(w.reshape(w.shape[0], -1), Q[parts["type"]]).astype(np.float64)
        except NotImplementedError as e:
            raise UnsupportedError(f"gguf.quants cannot decode {parts['type']}: {e}") from None
