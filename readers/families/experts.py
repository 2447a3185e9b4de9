"""Expert-bank machinery shared by every family: find a layer's expert tensors, detect its
layout and format from names and dtypes, check every name, dtype and shape, and describe the
banks (per_expert.py, stacked.py).

Nothing here reads tensor data: a BankSource's row function fetches zero-copy views of the
memory map when the writer asks for expert e, so planning a layer costs header lookups only.
"""

from __future__ import annotations

import re
from typing import Sequence

from ftw.banks import LayerBanks
from ftw.errors import SourceError

from ..safetensors_index import SafetensorsIndex
from .base import Dims, ExpertGroup, Family
from .per_expert import per_expert
from .stacked import stacked


def layer_pattern(family: Family) -> re.Pattern:
    prefixes = "|".join(re.escape(p) for p in family.layer_prefixes)
    blocks = "|".join(re.escape(b) for b in family.expert_blocks)
    return re.compile(rf"^((?:{prefixes})(\d+)\.(?:{blocks})\.)(.+)$")


def scan(family: Family, names: Sequence[str]) -> dict[int, ExpertGroup]:
    """Group expert tensor names by layer; a layer named two ways (two prefixes) is an error."""
    pat = layer_pattern(family)
    groups: dict[int, ExpertGroup] = {}
    for name in names:
        m = pat.match(name)
        if not m:
            continue
        base, layer, rest = m.group(1), int(m.group(2)), m.group(3)
        g = groups.setdefault(layer, ExpertGroup(layer, base, {}))
        if g.base != base:
            raise SourceError(f"layer {layer}: expert tensors under both {g.base!r} and {base!r}")
        g.names[rest] = name
    return groups


def layer_banks(family: Family, group: ExpertGroup, dims: Dims, index: SafetensorsIndex) -> LayerBanks:
    """Detect the layer's layout (stacked or per-expert) and resolve it; reads no tensor data."""
    per = any(rest.split(".", 1)[0].isdigit() for rest in group.names)
    if per:
        return per_expert(family, group, dims, index)
    return stacked(family, group, dims, index)
