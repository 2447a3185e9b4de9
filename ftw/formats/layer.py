"""A layer's format (name + options), the model's activation, and the model's MoE shape.

A layer format is (name, options). The name picks the registered format class (ftw/formats/),
which fixes the bank set and the decoder; options carry what the name cannot (GGUF types,
block sizes, act_block). Two layers with the same name and different options are different
formats.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..errors import FormatError, UnsupportedError
from .base import FORMATS, BankSpec, ExpertFormat, Rows, Weights, get_format


def _freeze(options: Mapping[str, Any]) -> str:
    return json.dumps(dict(options), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class LayerFormat:
    """A layer's expert format: name plus options. Hashable; equal iff name and options are."""

    name: str
    options_json: str = "{}"  # canonical JSON keeps the dataclass hashable and comparable

    @classmethod
    def of(cls, name: str, options: Mapping[str, Any] | None = None, where: str = "layer format") -> "LayerFormat":
        """A format to write: the name must be registered and every option valid."""
        options = dict(options or {})
        get_format(name).check_options(options, where)
        return cls(name, _freeze(options))

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "LayerFormat":
        """A format read from a file: a name this ftw does not know is kept (a newer writer's
        format; the file still opens and only decoding or computing the layer refuses it),
        a known name has its options checked."""
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise FormatError(f"{where}: layer format must be {{name, options}}, got {obj!r:.80}")
        options = obj.get("options", {})
        if not isinstance(options, dict):
            raise FormatError(f"{where}: layer format options must be an object")
        if obj["name"] in FORMATS:
            FORMATS[obj["name"]].check_options(options, where, reading=True)
        return cls(obj["name"], _freeze(options))

    @property
    def options(self) -> dict[str, Any]:
        return json.loads(self.options_json)

    @property
    def known(self) -> bool:
        return self.name in FORMATS

    @property
    def format(self) -> type[ExpertFormat]:
        """The registered class; UnsupportedError for a name this ftw does not know."""
        return get_format(self.name)

    def banks(self, H: int, I: int) -> dict[str, BankSpec]:  # noqa: E741
        return self.format.banks(H, I, self.options)

    def decode(self, rows: Rows, H: int, I: int) -> Weights:  # noqa: E741
        """One expert's float64 weights {gate [I, H], up [I, H], down [H, I], biases}."""
        return self.format.decode(rows, H, I, self.options)

    def key(self) -> str:
        """A short human label, unique per distinct format: 'nvfp4' or 'gguf{down_type=Q6_K,...}'."""
        opts = self.options
        if not opts:
            return self.name
        return self.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(opts.items())) + "}"

    def to_json(self) -> dict:
        return {"name": self.name, "options": self.options}

    def __str__(self) -> str:
        return self.key()


# -- the activation -------------------------------------------------------------------------

ACTIVATIONS = {
    "silu": "silu(gate) * up; with limit: gate = min(gate, limit), up = clamp(up, -limit, limit) first",
    "swiglu_oai": "gate = min(gate, limit), up = clamp(up, -limit, limit); (up + 1) * gate * sigmoid(alpha * gate)",
}


def _finite_positive(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and v > 0


@dataclass(frozen=True)
class Activation:
    """How a routed expert combines gate and up: the one definition every part reads.

    - silu:               out = silu(gate) * up
    - silu with limit:    gate = min(gate, limit); up = clamp(up, -limit, limit); silu(gate) * up
                          (DeepSeek-V4's swiglu_limit)
    - swiglu_oai:         gate = min(gate, limit); up = clamp(up, -limit, limit);
                          out = (up + 1) * gate * sigmoid(alpha * gate)   (gpt-oss)
    Expert biases, where a format has them, are added to gate and up before, and to the down
    projection's output after.
    """

    kind: str = "silu"
    limit: float | None = None
    alpha: float | None = None

    def __post_init__(self):
        self.validate("activation")

    def validate(self, where: str, *, reading: bool = False) -> None:
        if self.kind not in ACTIVATIONS:
            if reading:
                return  # a newer writer's activation: the file opens, computing refuses it
            raise FormatError(f"{where}: kind {self.kind!r} is not an activation ftw knows ({', '.join(ACTIVATIONS)})")
        for k in ("limit", "alpha"):
            v = getattr(self, k)
            if v is not None and not _finite_positive(v):
                raise FormatError(f"{where}: {k} must be a finite positive number, got {v!r:.40}")
        if self.kind == "silu" and self.alpha is not None:
            raise FormatError(f"{where}: silu takes no alpha")
        if self.kind == "swiglu_oai" and (self.limit is None or self.alpha is None):
            raise FormatError(f"{where}: swiglu_oai needs alpha and limit")

    def to_json(self) -> dict:
        out: dict[str, Any] = {"kind": self.kind}
        if self.limit is not None:
            out["limit"] = float(self.limit)
        if self.alpha is not None:
            out["alpha"] = float(self.alpha)
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str, legacy_extra: Mapping[str, Any] | None = None) -> "Activation":
        """The model's `activation`: an object, or (files before 0.2) a kind name whose
        parameters sat in model.extra (swiglu_limit, swiglu_alpha)."""
        if isinstance(obj, str):
            extra = legacy_extra or {}
            limit, alpha = extra.get("swiglu_limit"), extra.get("swiglu_alpha")
            if obj == "swiglu_oai":
                obj = {"kind": obj, "limit": limit if limit is not None else 7.0, "alpha": alpha if alpha is not None else 1.702}
            else:
                obj = {"kind": obj, **({"limit": limit} if limit is not None else {})}
        if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
            raise FormatError(f"{where}: activation must be {{kind, limit?, alpha?}}, got {obj!r:.60}")
        for k in ("limit", "alpha"):
            if obj.get(k) is not None and not _finite_positive(obj[k]):
                raise FormatError(f"{where}: activation {k} must be a finite positive number, got {obj[k]!r:.40}")
        act = object.__new__(cls)  # validated below with the reading rules
        object.__setattr__(act, "kind", obj["kind"])
        object.__setattr__(act, "limit", obj.get("limit"))
        object.__setattr__(act, "alpha", obj.get("alpha"))
        act.validate(where, reading=True)
        return act

    def apply(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """The float64 reference: gate and up [..., I] (biases already added) -> [..., I]."""
        gate, up = np.asarray(gate, dtype=np.float64), np.asarray(up, dtype=np.float64)
        if self.kind not in ACTIVATIONS:
            raise UnsupportedError(f"activation {self.kind!r} is not one ftw can compute")
        if self.limit is not None:
            gate = np.minimum(gate, self.limit)
            up = np.clip(up, -self.limit, self.limit)
        if self.kind == "silu":
            return gate * _sigmoid(gate) * up
        return (up + 1.0) * gate * _sigmoid(self.alpha * gate)

    def __str__(self) -> str:
        params = ", ".join(f"{k}={v:g}" for k, v in (("alpha", self.alpha), ("limit", self.limit)) if v is not None)
        return f"{self.kind}({params})" if params else self.kind


def _sigmoid(z: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-z) without overflow: e^-|z| never exceeds 1 (tokens far out in either direction
    give the exact limits 0 and 1 rather than a RuntimeWarning)."""
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


# -- the model --------------------------------------------------------------------------------


@dataclass
class ModelShape:
    """The MoE shape of a model, read from the source config (each family names it differently)."""

    family: str
    hidden_size: int  # H
    moe_intermediate_size: int  # I of the first MoE layer
    num_experts: int  # E
    top_k: int
    num_layers: int
    moe_layers: list[int]
    activation: Activation = field(default_factory=Activation)
    extra: dict[str, Any] = field(default_factory=dict)  # family specifics worth keeping
    # I of the layers whose width differs from moe_intermediate_size (GGUF's per-layer
    # expert_feed_forward_length); empty for almost every model
    layer_intermediate_sizes: dict[int, int] = field(default_factory=dict)

    def __post_init__(self):
        if isinstance(self.activation, str):  # ModelShape(..., activation="silu")
            self.activation = Activation(self.activation)

    def intermediate_size(self, layer: int) -> int:
        return self.layer_intermediate_sizes.get(layer, self.moe_intermediate_size)

    def to_json(self) -> dict:
        out = {
            "family": self.family,
            "hidden_size": self.hidden_size,
            "moe_intermediate_size": self.moe_intermediate_size,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "num_layers": self.num_layers,
            "moe_layers": list(self.moe_layers),
            "activation": self.activation.to_json(),
            "extra": self.extra,
        }
        if self.layer_intermediate_sizes:
            out["moe_intermediate_sizes"] = {str(k): v for k, v in sorted(self.layer_intermediate_sizes.items())}
        return out

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
        extra = extra if isinstance(extra, dict) else {}
        # per-layer widths: a model field since 0.2; GGUF files before it kept them in extra
        widths = obj.get("moe_intermediate_sizes", extra.get("moe_intermediate_sizes", {}))
        if not isinstance(widths, dict) or not all(
            isinstance(k, str) and k.isdigit() and type(v) is int and v >= 0 for k, v in widths.items()
        ):
            raise FormatError(f"{where}: model.moe_intermediate_sizes must map layer keys to non-negative integers")
        return cls(
            family=str(obj.get("family", "")),
            moe_layers=layers,
            activation=Activation.from_json(obj.get("activation", "silu"), f"{where}: model.activation", extra),
            extra=extra,
            layer_intermediate_sizes={int(k): v for k, v in widths.items() if v != obj["moe_intermediate_size"]},
            **{k: obj[k] for k in ints},
        )
