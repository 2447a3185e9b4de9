"""Layer selections as users type them: '0-3,10' -> [0, 1, 2, 3, 10]."""

from __future__ import annotations

from . import spec
from .errors import FtwError
from .spec import decimal_index


def parse_layers(text: str | None, limit: int | None = None) -> list[int] | None:
    """limit: one past the highest layer the model has. A range is checked against it before
    it is expanded, so '0-10000000000' is one error, not a list of ten billion layers."""
    if text is None or text.strip() in ("", "all"):
        return None
    bound = spec.MAX_LAYERS if limit is None else min(limit, spec.MAX_LAYERS)
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        lo_s, dash, hi_s = part.partition("-")
        lo = decimal_index(lo_s)
        hi = decimal_index(hi_s) if dash else lo
        if lo is None or hi is None or lo > hi:
            raise FtwError(f"--layers: {part!r} is not a layer index or range like 0-3") from None
        if hi >= bound:
            what = f"the model's {limit} layers" if limit is not None and limit <= spec.MAX_LAYERS \
                else f"the format's limit of {spec.MAX_LAYERS} layers"
            raise FtwError(f"--layers: {part!r} goes past {what} (highest index {bound - 1})")
        out.update(range(lo, hi + 1))
    return sorted(out)


def format_layers(layers) -> str:
    """The inverse: [0, 1, 2, 3, 10] -> '0-3,10'."""
    layers = sorted(layers)
    parts, i = [], 0
    while i < len(layers):
        j = i
        while j + 1 < len(layers) and layers[j + 1] == layers[j] + 1:
            j += 1
        parts.append(str(layers[i]) if i == j else f"{layers[i]}-{layers[j]}")
        i = j + 1
    return ",".join(parts)
