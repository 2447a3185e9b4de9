"""Convert a source checkpoint into an FTW file: plan everything, then stream it.

Everything is resolved before the destination is touched: the reader picks every layer's
format and checks every shape, and only then does the writer open its (temporary) output.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ftw import __version__, spec
from ftw.banks import LayerBanks, SourceTensor
from ftw.container import Selection
from ftw.errors import FtwError
from ftw.spec import decimal_index

from .ftw_writer import FtwWriter

RELEASE_EVERY = 256 << 20  # non-expert tensor bytes written between releases of mapped pages

# a non-expert tensor of decoder layer N, in HF ("model.layers.N.") or GGUF ("blk.N.") naming
_LAYER_OF = re.compile(r"(?:^|\.)(?:layers|blk)\.([0-9]+)\.")


def tensor_layer(name: str) -> int | None:
    m = _LAYER_OF.search(name)
    return decimal_index(m.group(1)) if m else None  # 5000 digits: no layer, not a ValueError


@dataclass
class ConvertPlan:
    source: str
    reader: str
    layers: list[LayerBanks]
    tensors: list[SourceTensor]
    attachments: dict[str, bytes]
    source_files: list[str] = field(default_factory=list)
    selection: Selection = field(default_factory=Selection)

    @property
    def expert_nbytes(self) -> int:
        return sum(lb.nbytes for lb in self.layers)

    @property
    def tensor_nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "reader": self.reader,
            "layers": [
                {"layer": lb.layer, "format": lb.format.name, "options": lb.format.options,
                 "nbytes": lb.nbytes,
                 "banks": {n: {"dtype": b.dtype, "shape": [b.num_experts, *b.row_shape]} for n, b in lb.banks.items()}}
                for lb in self.layers
            ],
            "expert_nbytes": self.expert_nbytes,
            "tensors": len(self.tensors),
            "tensor_nbytes": self.tensor_nbytes,
            "attachments": sorted(self.attachments),
        }


def plan_conversion(reader, layers: Iterable[int] | None = None, experts_only: bool = False) -> ConvertPlan:
    wanted = None if layers is None else sorted(set(layers))
    planned = reader.plan(wanted)  # refuses a layer that is not one of the model's MoE layers
    model = reader.model
    for lb in planned:  # strict when writing: every bank exactly as its format declares it
        lb.check(model.hidden_size, model.intermediate_size(lb.layer), f"{reader.path}: layer {lb.layer}")
    tensors = []
    if not experts_only:
        tensors = reader.tensors()
        if wanted is not None:
            keep = set(wanted)
            tensors = [t for t in tensors if tensor_layer(t.name) in keep or tensor_layer(t.name) is None]
    selection = Selection(None if wanted is None else tuple(wanted), experts_only)
    plan = ConvertPlan(reader.path, reader.name, planned, tensors, reader.attachments(), reader.source_files(),
                       selection)
    check_plan(plan, model)
    return plan


# what every index entry takes at least, beyond its name: '"dtype":"u8","nbytes":0,"offset":4096,
# "shape":[],"xxh3":"<16 hex>"' and its braces; a lower bound, so no plan is refused wrongly
MIN_ENTRY_NBYTES = 70


def check_plan(plan: ConvertPlan, model) -> None:
    """Refuse here, before the destination exists, anything an FTW reader would refuse in the
    output (docs/FORMAT.md): a shape, a layer index or expert count past the limits, a NaN
    in the index (strict JSON has none), an index over the cap. The writer would only find
    out after writing every byte."""
    src = plan.source
    for t in plan.tensors:
        problem = spec.shape_problem(tuple(t.shape), spec.dtype(t.dtype).itemsize)
        if problem:
            raise FtwError(f"{src}: tensor {t.name!r}: {problem}: an FTW file cannot hold it")
    for lb in plan.layers:
        if lb.layer >= spec.MAX_LAYERS:
            raise FtwError(f"{src}: layer {lb.layer}: FTW layer indices are below {spec.MAX_LAYERS}")
        for name, b in lb.banks.items():
            if b.num_experts > spec.MAX_EXPERTS:
                raise FtwError(f"{src}: layer {lb.layer} bank {name}: {b.num_experts} experts, "
                               f"more than the format's {spec.MAX_EXPERTS}")
            problem = spec.shape_problem((b.num_experts, *b.row_shape), spec.dtype(b.dtype).itemsize)
            if problem:
                raise FtwError(f"{src}: layer {lb.layer} bank {name}: {problem}")
    try:
        described = [model.to_json(), *(lb.format.to_json() for lb in plan.layers),
                     *(t.meta for t in plan.tensors if t.meta)]
        size = len(json.dumps(described, allow_nan=False))
    except ValueError:
        raise FtwError(f"{src}: the model or a layer's options hold a NaN or infinite number, which "
                       f"the FTW index (strict JSON) cannot store") from None
    size += sum(len(t.name) + MIN_ENTRY_NBYTES for t in plan.tensors)
    size += sum(len(n) + MIN_ENTRY_NBYTES for lb in plan.layers for n in lb.banks)
    size += sum(len(n) + MIN_ENTRY_NBYTES for n in plan.attachments)
    if size > spec.MAX_INDEX_NBYTES:
        raise FtwError(f"{src}: the FTW index would take at least {size} bytes, over the format's cap of "
                       f"{spec.MAX_INDEX_NBYTES} ({len(plan.tensors)} tensors)")


def write_plan(
    plan: ConvertPlan, reader, dst: str | os.PathLike, *, force: bool = False,
    compress_level: int | None = None, threads: int | None = None,
    progress: Callable[..., None] | None = None,
) -> None:
    """progress(nbytes, layers=0) is called as bytes are written and layers finish."""
    advance = progress or (lambda n=0, layers=0: None)
    with FtwWriter(dst, force=force, compress_level=compress_level, threads=threads, progress=advance) as w:
        w.set_model(reader.model)
        w.set_selection(plan.selection)
        w.set_provenance({
            "tool": "ftw",
            "tool_version": __version__,
            "reader": plan.reader,
            "source": os.path.abspath(plan.source),
            "source_files": [os.path.basename(p) for p in plan.source_files],
            "compression": None if compress_level is None else f"zstd:{compress_level}",
        })
        for lb in plan.layers:
            w.add_layer(lb)
            reader.release_pages()
            advance(0, layers=1)
        since_release = 0
        for t in plan.tensors:
            w.add_tensor(t)
            since_release += t.nbytes
            if since_release >= RELEASE_EVERY:  # embeddings and attention are mapped too
                reader.release_pages()
                since_release = 0
        for name, data in sorted(plan.attachments.items()):
            w.add_attachment(name, data)


def convert(src: str | os.PathLike, dst: str | os.PathLike, *, layers: Iterable[int] | None = None,
            experts_only: bool = False, force: bool = False, compress_level: int | None = None,
            threads: int | None = None, progress: Callable[..., None] | None = None) -> ConvertPlan:
    """Library entry point of `ftw convert`; returns the plan it carried out."""
    from ftw.readers import open_checkpoint

    with open_checkpoint(src) as reader:
        plan = plan_conversion(reader, layers, experts_only)
        write_plan(plan, reader, dst, force=force, compress_level=compress_level, threads=threads,
                   progress=progress)
    return plan
