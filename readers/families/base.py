"""What a model family says about itself: tensor naming and config keys. Nothing else.

A family class is a handful of class attributes (where a layer's tensors live, how the
expert block and its projections are named, which config keys hold the MoE shape) plus,
where the family has an odd layout, a hook. Format detection and bank assembly live once in
``readers.families.experts``; the reader in ``readers.safetensors_reader``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ftw.errors import SourceError
from ftw.formats import ModelShape

if TYPE_CHECKING:
    from ftw.banks import BankSource

    from ..safetensors_index import SafetensorsIndex


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
        self.text: dict = tc if isinstance(tc, dict) and tc else config

    # -- config -------------------------------------------------------------------------

    def get_int(self, keys: tuple[str, ...]) -> int:
        for k in keys:
            v = self.text.get(k)
            if type(v) is int and v >= 0:
                return v
        raise SourceError(f"{self.where}: {self.name} config needs one of {', '.join(keys)} (a non-negative integer)")

    def moe_layers(self, num_layers: int) -> list[int]:
        return list(range(num_layers))

    def activation(self) -> str:
        return str(self.text.get("hidden_act", "silu"))

    def extra(self) -> dict[str, Any]:
        return {}

    def shape(self) -> ModelShape:
        n = self.get_int(("num_hidden_layers", "n_layers"))
        return ModelShape(
            family=self.name,
            hidden_size=self.get_int(("hidden_size",)),
            moe_intermediate_size=self.get_int(self.width_keys),
            num_experts=self.get_int(self.expert_count_keys),
            top_k=self.get_int(self.top_k_keys),
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
    ) -> "tuple[str, dict[str, Any], dict[str, BankSource]] | None":
        """Banks of a stacked ([E, ...] tensors) layer in a family-specific layout; None: the generic ones apply."""
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
