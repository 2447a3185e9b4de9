"""What a model family says about itself: tensor naming, config keys and, where a family has
an odd layout, a hook.

A family class is a handful of class attributes (where a layer's tensors live, how the
expert block and its projections are named, which config keys hold the MoE shape) plus,
where the family has an odd layout, a hook. Format detection and bank assembly live once in
``readers.families.experts``; the reader in ``readers.safetensors_reader``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import math

from ftw import spec
from ftw.errors import SourceError, UnsupportedError
from ftw.formats import Activation, ModelShape

if TYPE_CHECKING:
    from ftw.banks import RowPieces

    from ..safetensors_index import SafetensorsIndex


MAX_DIM = 1 << 24  # bound of hidden and intermediate sizes; real models are below 1 << 16


@dataclass(frozen=True)
class Dims:
    E: int
    H: int
    I: int  # noqa: E741 (the model's own symbol)


@dataclass
class ExpertGroup:
    """One decoder layer's routed-expert tensors, found by name alone."""

    layer: int
    base: str  # 'model.layers.3.mlp.experts.': every expert tensor of the layer starts with it
    names: dict[str, str]  # the rest of the name ('0.gate_proj.weight', 'gate_up_proj') -> full name


class Family:
    name: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()
    # decoder layer L lives under prefix + 'L.'; the first prefix is the family's usual one
    layer_prefixes: ClassVar[tuple[str, ...]] = ("model.layers.",)
    # `switch_mlp` is where mlx-lm keeps the stacked experts of the same models
    expert_blocks: ClassVar[tuple[str, ...]] = ("mlp.experts", "mlp.switch_mlp")
    # (gate, up, down) names of per-expert projections, in the order tried
    projections: ClassVar[tuple[tuple[str, str, str], ...]] = (("gate_proj", "up_proj", "down_proj"),)
    expert_count_keys: ClassVar[tuple[str, ...]] = ("num_experts", "num_local_experts", "n_routed_experts")
    width_keys: ClassVar[tuple[str, ...]] = ("moe_intermediate_size",)
    top_k_keys: ClassVar[tuple[str, ...]] = ("num_experts_per_tok", "experts_per_token")
    # top-level names of next-token-prediction modules (skipped, like layers >= num_hidden_layers)
    mtp_prefixes: ClassVar[tuple[str, ...]] = ("mtp.", "model.mtp.", "model.language_model.mtp.")

    def __init__(self, config: dict, where: str):
        self.config = config
        self.where = where  # the config.json path, for messages
        tc = config.get("text_config")
        if tc is not None and not isinstance(tc, dict):
            raise SourceError(f"{where}: text_config must be an object, got {short(tc)}")
        self.text: dict = tc if isinstance(tc, dict) and tc else config

    # -- config -------------------------------------------------------------------------
    # Every value a family reads is checked here (type and range) and refused with one
    # SourceError naming the key: never a TypeError later, nor minutes spent on 10**12 layers.

    def bad(self, key: str, want: str, v: Any) -> SourceError:
        return SourceError(f"{self.where}: {key} must be {want}, got {short(v)}")

    def int_key(self, key: str, default: Any = None, lo: int = 0, hi: int = MAX_DIM) -> int:
        """An integer in [lo, hi]; absent: default (None: the key is required)."""
        if key not in self.text:
            if default is None:
                raise SourceError(f"{self.where}: {self.name} config needs {key}")
            return default
        v = self.text[key]
        if type(v) is not int or not lo <= v <= hi:
            raise self.bad(key, f"an integer in [{lo}, {hi}]", v)
        return v

    def get_int(self, keys: tuple[str, ...], lo: int = 0, hi: int = MAX_DIM) -> int:
        """The first of keys the config gives (null: not given), checked: a wrong value is an
        error, not skipped over."""
        for k in keys:
            if self.text.get(k) is not None:
                return self.int_key(k, lo=lo, hi=hi)
        raise SourceError(f"{self.where}: {self.name} config needs one of {', '.join(keys)} (an integer)")

    def check_layer_keys(self, num_layers: int) -> None:
        """The keys that pick MoE layers, whichever family reads them (families read them
        with plain .get() after this)."""
        for key, lo in (("first_k_dense_replace", 0), ("moe_layer_freq", 1), ("decoder_sparse_step", 1),
                        ("num_nextn_predict_layers", 0)):
            self.int_key(key, 0, lo=lo, hi=spec.MAX_LAYERS)
        only = self.text.get("mlp_only_layers")
        if only is not None and (
            not isinstance(only, list) or not all(type(x) is int and 0 <= x < spec.MAX_LAYERS for x in only)
        ):
            raise self.bad("mlp_only_layers", "a list of layer indices", only)
        types = self.text.get("mlp_layer_types")
        if types is not None:
            if not isinstance(types, list) or not all(isinstance(x, str) for x in types):
                raise self.bad("mlp_layer_types", "a list of strings", types)
            if types and len(types) < num_layers:
                raise SourceError(f"{self.where}: mlp_layer_types has {len(types)} entries for {num_layers} layers")

    def mtp_layers(self) -> int:
        """Next-token-prediction layers numbered after the decoder layers (DeepSeek, GLM)."""
        return self.int_key("num_nextn_predict_layers", 0, hi=spec.MAX_LAYERS)

    def moe_layers(self, num_layers: int) -> list[int]:
        return list(range(num_layers))

    def activation(self) -> Activation:
        """silu-gated experts, clamped where the config has a `swiglu_limit` (DeepSeek-V4, GLM-5 Flash)."""
        act = self.text.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise UnsupportedError(f"{self.where}: hidden_act {short(act)}: ftw computes silu-gated experts only")
        limit = self.swiglu_limit(None)
        return Activation("silu", limit=limit)

    def swiglu_limit(self, default: float | None) -> float | None:
        if "swiglu_limit" not in self.text:
            return default
        v = self.text["swiglu_limit"]  # an explicit null is refused: unclamped or default?
        # 10**400 is a JSON integer no float holds: isfinite() would raise OverflowError
        if type(v) not in (int, float) or not (abs(v) < 1e300 and math.isfinite(v) and v > 0):
            raise SourceError(f"{self.where}: swiglu_limit must be a finite positive number, got {short(v)}")
        return float(v)

    def extra(self) -> dict[str, Any]:
        return {}

    def shape(self) -> ModelShape:
        n = self.get_int(("num_hidden_layers", "n_layers"), hi=spec.MAX_LAYERS)
        self.check_layer_keys(n)
        E = self.get_int(self.expert_count_keys, hi=spec.MAX_EXPERTS)
        top_k = self.get_int(self.top_k_keys, hi=spec.MAX_EXPERTS)
        if 0 < E < top_k:
            raise SourceError(f"{self.where}: {self.top_k_keys[0]} {top_k} is more than the {E} experts")
        return ModelShape(
            family=self.name,
            hidden_size=self.get_int(("hidden_size",), lo=1),
            moe_intermediate_size=self.get_int(self.width_keys, lo=1),
            num_experts=E,
            top_k=top_k,
            num_layers=n,
            moe_layers=self.moe_layers(n),
            activation=self.activation(),
            extra=self.extra(),
        )

    # -- per-layer hooks ----------------------------------------------------------------

    def options(self, fmt: str) -> dict[str, Any]:
        """Options this family adds to a layer format (activation limits, act_block)."""
        return {}

    def stacked(
        self, group: ExpertGroup, dims: Dims, index: "SafetensorsIndex"
    ) -> "tuple[str, dict[str, Any], dict[str, RowPieces]] | None":
        """(format, options, rows per bank) of a stacked ([E, ...] tensors) layer in a
        family-specific layout; None: the generic ones apply."""
        return None

    def expected_first(self, base: str) -> str:
        """The first tensor a layer with no expert tensors at all should have had."""
        return f"{base}0.{self.projections[0][0]}.weight"


def mlp_layer_types_moe(text: dict, num_layers: int, first_k_dense: int) -> list[int]:
    """MoE layers from `mlp_layer_types` (anything but 'dense'), else from `first_k_dense_replace`."""
    types = text.get("mlp_layer_types")
    if isinstance(types, list) and types:
        return [i for i, t in enumerate(types[:num_layers]) if t != "dense"]
    return list(range(min(first_k_dense, num_layers), num_layers))


def short(v: Any) -> str:
    """A config value for a message: short, and safe for 100,000-deep lists or 5000-digit ints."""
    try:
        text = repr(v)
    except (RecursionError, ValueError):
        return f"a {type(v).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."
