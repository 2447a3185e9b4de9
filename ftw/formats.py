"""Layer formats: the canonical expert formats, their banks, and the model's MoE shape.

A layer format is (name, options). The name fixes the bank set and how a row is decoded;
options carry what the name cannot (GGUF types, act_block, activation limits). Two layers
with the same name and different options are different formats.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import FormatError, UnsupportedError


@dataclass(frozen=True)
class FormatSpec:
    name: str
    banks: tuple[str, ...]  # always present
    optional_banks: tuple[str, ...] = ()  # present where the model has them (expert biases)

    @property
    def all_banks(self) -> tuple[str, ...]:
        return self.banks + self.optional_banks


FORMATS: dict[str, FormatSpec] = {
    s.name: s
    for s in [
        FormatSpec("bf16", ("gate_up", "down"), ("gate_up_bias", "down_bias")),
        FormatSpec("fp8_block", ("gate_up", "down", "gate_up_scale", "down_scale")),
        FormatSpec(
            "nvfp4",
            ("gate_up", "down", "gate_up_scale", "down_scale", "gate_up_global", "down_global"),
        ),
        FormatSpec(
            "mxfp4",
            ("gate_up", "down", "gate_up_scale", "down_scale", "gate_up_bias", "down_bias"),
        ),
        FormatSpec("ds_fp4", ("gate_up", "down", "gate_up_scale", "down_scale")),
        FormatSpec("gguf", ("gate_up", "down"), ("gate_up_bias", "down_bias")),
        FormatSpec("mxfp8", ("gate_up", "down", "gate_up_scale", "down_scale")),
        # MLX affine: w = scale * q + offset (MLX calls the offset "biases"; here a bias is
        # always an additive output bias, so the affine term gets its own name)
        FormatSpec(
            "affine",
            ("gate_up", "down", "gate_up_scale", "down_scale", "gate_up_offset", "down_offset"),
        ),
    ]
}


def _freeze(options: Mapping[str, Any]) -> str:
    return json.dumps(dict(options), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class LayerFormat:
    """A layer's expert format: name plus options. Hashable; equal iff name and options are."""

    name: str
    options_json: str = "{}"  # canonical JSON keeps the dataclass hashable and comparable

    @classmethod
    def of(cls, name: str, options: Mapping[str, Any] | None = None) -> "LayerFormat":
        if name not in FORMATS:
            raise UnsupportedError(f"unknown layer format {name!r} (known: {', '.join(FORMATS)})")
        return cls(name, _freeze(options or {}))

    @property
    def options(self) -> dict[str, Any]:
        return json.loads(self.options_json)

    @property
    def spec(self) -> FormatSpec:
        return FORMATS[self.name]

    def key(self) -> str:
        """A short human label, unique per distinct format: 'nvfp4' or 'gguf{down_type=Q6_K,...}'."""
        opts = self.options
        if not opts:
            return self.name
        return self.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(opts.items())) + "}"

    def to_json(self) -> dict:
        return {"name": self.name, "options": self.options}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "LayerFormat":
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise FormatError(f"{where}: layer format must be {{name, options}}, got {obj!r:.80}")
        options = obj.get("options", {})
        if not isinstance(options, dict):
            raise FormatError(f"{where}: layer format options must be an object")
        # an unknown name is kept (a newer writer's format): the container still opens,
        # and only code that must decode the layer refuses it
        return cls(obj["name"], _freeze(options))

    def __str__(self) -> str:
        return self.key()


@dataclass
class ModelShape:
    """The MoE shape of a model, read from the source config (each family names it differently)."""

    family: str
    hidden_size: int  # H
    moe_intermediate_size: int  # I
    num_experts: int  # E
    top_k: int
    num_layers: int
    moe_layers: list[int]
    activation: str = "silu"
    extra: dict[str, Any] = field(default_factory=dict)  # family specifics worth keeping

    def to_json(self) -> dict:
        return {
            "family": self.family,
            "hidden_size": self.hidden_size,
            "moe_intermediate_size": self.moe_intermediate_size,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "num_layers": self.num_layers,
            "moe_layers": list(self.moe_layers),
            "activation": self.activation,
            "extra": self.extra,
        }

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "ModelShape":
        ints = ("hidden_size", "moe_intermediate_size", "num_experts", "top_k", "num_layers")
        if not isinstance(obj, dict):
            raise FormatError(f"{where}: model must be an object")
        for k in ints:
            if type(obj.get(k)) is not int or obj[k] < 0:
                raise FormatError(f"{where}: model.{k} must be a non-negative integer")
        layers = obj.get("moe_layers")
        if not isinstance(layers, list) or not all(type(x) is int and x >= 0 for x in layers):
            raise FormatError(f"{where}: model.moe_layers must be a list of layer indices")
        extra = obj.get("extra", {})
        return cls(
            family=str(obj.get("family", "")),
            moe_layers=layers,
            activation=str(obj.get("activation", "silu")),
            extra=extra if isinstance(extra, dict) else {},
            **{k: obj[k] for k in ints},
        )
