"""Checks and row helpers shared by the per-expert and stacked bank builders."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ftw.banks import LayerBanks, RowPieces
from ftw.errors import SourceError
from ftw.formats import LayerFormat

from ..safetensors_index import SafetensorsIndex
from .base import Dims, ExpertGroup, Family

ROLES = ("gate", "up", "down")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def io_dims(dims: Dims, role: str) -> tuple[int, int]:
    """(out, in) of a projection: gate and up are [I, H], down is [H, I]."""
    return (dims.I, dims.H) if role != "down" else (dims.H, dims.I)


def fit_block(pairs: list[tuple[int, int]]) -> int | None:
    """The block b with ceil(dim / b) == count for every (dim, count); 128 first: it is everyone's."""
    for b in [128] + [1 << k for k in range(13)]:
        if all(cdiv(dim, b) == count for dim, count in pairs):
            return b
    return None


def expect(
    index: SafetensorsIndex,
    name: str,
    layer: int,
    dtypes: str | tuple[str, ...],
    shapes: tuple | list[tuple],
    why: str = "",
) -> None:
    info = index.info(name)
    dtypes = (dtypes,) if isinstance(dtypes, str) else dtypes
    shapes = shapes if isinstance(shapes, list) else [shapes]
    if info.dtype not in dtypes or info.shape not in [tuple(s) for s in shapes]:
        want = "/".join(dtypes) + " " + " or ".join(str(list(s)) for s in shapes)
        raise SourceError(
            f"layer {layer}: tensor {name!r} ({info.shard}) is {info.dtype} {list(info.shape)}, "
            f"expected {want}{why}"
        )


def check_names(group: ExpertGroup, need: Sequence[str], optional: Sequence[str] = ()) -> None:
    for k in need:
        if k not in group.names:
            raise SourceError(f"layer {group.layer}: missing expert tensor {group.base}{k}")
    for rest, name in sorted(group.names.items()):
        if rest not in need and rest not in optional:
            raise SourceError(f"layer {group.layer}: unexpected expert tensor {name!r} (expected {', '.join(need)})")


def views(index: SafetensorsIndex, names: list[list[str]]) -> Callable[[int], list[np.ndarray]]:
    return lambda e: [index.array(n) for n in names[e]]


def stacked_views(index: SafetensorsIndex, name: str) -> Callable[[int], list[np.ndarray]]:
    return lambda e: [index.array(name)[e]]


def make_layer(family: Family, layer: int, dims: Dims, fmt: str, options: dict, rows: dict[str, RowPieces],
               dtypes: dict[str, str] | None = None) -> LayerBanks:
    """The layer's banks, dtypes and row shapes taken from its format; `rows` says where each
    bank's rows come from, `dtypes` only where the format allows several (scale precision)."""
    lf = LayerFormat.of(fmt, {**options, **family.options(fmt)}, f"layer {layer}")
    return LayerBanks.build(layer, lf, dims.H, dims.I, dims.E, rows, dtypes)
