"""Convert a source checkpoint into an FTW file: plan everything, then stream it.

Everything is resolved before the destination is touched: the reader picks every layer's
format and checks every shape, and only then does the writer open its (temporary) output.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ftw import __version__
from ftw.banks import LayerBanks, SourceTensor
from ftw.container import Selection
from ftw.errors import FtwError

from .ftw_writer import FtwWriter

# a non-expert tensor of decoder layer N, in HF ("model.layers.N.") or GGUF ("blk.N.") naming
RELEASE_EVERY = 256 << 20  # non-expert tensor bytes written between releases of mapped pages

_LAYER_OF = re.compile(r"(?:^|\.)(?:layers|blk)\.(\d+)\.")


def tensor_layer(name: str) -> int | None:
    m = _LAYER_OF.search(name)
    return int(m.group(1)) if m else None


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
    if wanted is not None:
        unknown = [l for l in wanted if l not in reader.model.moe_layers]
        if unknown:
            raise FtwError(
                f"{reader.path}: layer {unknown[0]} is not a MoE layer (MoE layers: {reader.model.moe_layers})"
            )
    planned = reader.plan(wanted)
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
    return ConvertPlan(reader.path, reader.name, planned, tensors, reader.attachments(), reader.source_files(),
                       selection)


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
