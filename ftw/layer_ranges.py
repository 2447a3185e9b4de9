"""Layer selections as users type them: '0-3,10' -> [0, 1, 2, 3, 10]."""

from __future__ import annotations

from .errors import FtwError


def parse_layers(text: str | None) -> list[int] | None:
    if text is None or text.strip() in ("", "all"):
        return None
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi or lo < 0:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                n = int(part)
                if n < 0:
                    raise ValueError
                out.add(n)
        except ValueError:
            raise FtwError(f"--layers: {part!r} is not a layer index or range like 0-3") from None
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
