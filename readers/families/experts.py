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
from ftw import spec
from ftw.errors import SourceError
from ftw.spec import decimal_index

from ..safetensors_index import SafetensorsIndex
from .base import Dims, ExpertGroup, Family, short
from .per_expert import per_expert
from .stacked import stacked


def layer_pattern(family: Family) -> re.Pattern:
    prefixes = "|".join(re.escape(p) for p in family.layer_prefixes)
    blocks = "|".join(re.escape(b) for b in family.expert_blocks)
    # [0-9], not \d: \d also matches Arabic-Indic and other digits, which int() accepts
    return re.compile(rf"^((?:{prefixes})([0-9]+)\.(?:{blocks})\.)(.+)$")


def layer_number(text: str, name: str) -> int:
    """A tensor name's layer number: canonical decimal below spec.MAX_LAYERS, or refused
    ('03' next to '3' would be one layer under two names; 5000 digits overflow int())."""
    n = decimal_index(text, spec.MAX_LAYERS)
    if n is None:
        raise SourceError(f"tensor {short(name)}: layer number {short(text)} is not a canonical decimal "
                          f"below {spec.MAX_LAYERS} (ASCII digits, no leading zeros)")
    return n


def scan(family: Family, names: Sequence[str]) -> dict[int, ExpertGroup]:
    """Group expert tensor names by layer; a layer named two ways (two prefixes) is an error."""
    pat = layer_pattern(family)
    groups: dict[int, ExpertGroup] = {}
    for name in names:
        m = pat.match(name)
        if not m:
            continue
        base, layer, rest = m.group(1), layer_number(m.group(2), name), m.group(3)
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
