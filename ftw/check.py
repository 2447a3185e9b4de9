"""`ftw check`: prove an FTW file holds what its source checkpoint holds.

A check is a list of steps; each step adds findings per layer to one report. The steps here
are the container's own integrity, bit-exact banks against the source reader, and
dequantized sample experts from both sides. Runtime steps (CPU executor, GPU slot pools)
plug in by appending to STEPS.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .container import FtwFile
from .errors import FtwError, UnsupportedError
from .mapped import release_pages


@dataclass
class LayerResult:
    layer: int
    format: str
    banks: int = 0
    bytes_compared: int = 0
    experts_dequantized: int = 0
    max_abs_err: float = 0.0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be checked, and why

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class CheckReport:
    source: str
    file: str
    layers: dict[int, LayerResult] = field(default_factory=dict)
    tensors_compared: int = 0
    tensor_bytes_compared: int = 0
    attachments_compared: int = 0
    problems: list[str] = field(default_factory=list)  # not tied to one layer

    @property
    def ok(self) -> bool:
        return not self.problems and all(r.ok for r in self.layers.values())

    def to_json(self) -> dict:
        return {
            "source": self.source, "file": self.file, "ok": self.ok,
            "layers": [vars(r) | {"ok": r.ok} for r in self.layers.values()],
            "tensors_compared": self.tensors_compared,
            "tensor_bytes_compared": self.tensor_bytes_compared,
            "attachments_compared": self.attachments_compared,
            "problems": self.problems,
        }


@dataclass
class CheckContext:
    f: FtwFile
    reader: object  # a readers.CheckpointReader
    plan: dict  # layer -> LayerBanks from the source reader
    report: CheckReport
    experts: int  # sample experts per layer for numeric steps
    threads: int
    progress: Callable[..., None]


def _u8(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def step_container(ctx: CheckContext) -> None:
    ctx.f.verify(threads=ctx.threads, progress=ctx.progress)


def step_bytes(ctx: CheckContext) -> None:
    f = ctx.f
    for layer, lb in ctx.plan.items():
        r = ctx.report.layers[layer]
        fmt = f.layer_formats[layer]
        if fmt != lb.format:
            r.problems.append(f"format {fmt} in FTW, {lb.format} in source")
            continue
        if set(f.layers[layer]) != set(lb.banks):
            r.problems.append(f"banks {sorted(f.layers[layer])} in FTW, {sorted(lb.banks)} in source")
            continue
        for name, src in lb.banks.items():
            info = f.layers[layer][name]
            r.banks += 1
            if info.dtype != src.dtype or info.shape != (src.num_experts, *src.row_shape):
                r.problems.append(f"bank {name}: {info.dtype} {list(info.shape)} in FTW, "
                                  f"{src.dtype} {[src.num_experts, *src.row_shape]} in source")
                continue
            for e in range(src.num_experts):
                a, b = _u8(f.expert_row(layer, name, e)), _u8(src.row_array(e))
                if not np.array_equal(a, b):
                    first = int(np.flatnonzero(a != b)[0])
                    r.problems.append(f"bank {name} expert {e}: bytes differ from byte {first}")
                    break
                r.bytes_compared += a.nbytes
        # both sides are memory-mapped: drop what this layer touched, or RSS grows to the model
        ctx.reader.release_pages()
        release_pages(f.mm)
        ctx.progress(0, layers=1)


def sample_experts(num_experts: int, count: int) -> list[int]:
    """First, last and evenly spaced experts between: corruption at either end shows."""
    if count >= num_experts:
        return list(range(num_experts))
    return sorted({round(i * (num_experts - 1) / max(count - 1, 1)) for i in range(count)})


def step_dequant(ctx: CheckContext) -> None:
    f = ctx.f
    reference = getattr(ctx.reader, "reference_expert", None)
    for layer, lb in ctx.plan.items():
        r = ctx.report.layers[layer]
        if not r.ok:
            continue
        fmt = lb.format
        num_experts = next(iter(lb.banks.values())).num_experts
        H, I = ctx.reader.model.hidden_size, ctx.reader.model.intermediate_size(layer)
        for e in sample_experts(num_experts, ctx.experts):
            try:
                ours = f.decode_expert(layer, e)
            except UnsupportedError as err:
                r.notes.append(f"not dequantized: {err}")  # the bytes were still compared
                break
            # the source side: the reader's own float reference when it has one (decoded from
            # the source tensors), else the source's canonical rows through the same decoder
            theirs = reference(layer, e) if reference else None
            if theirs is None:
                theirs = fmt.decode({n: b.row_array(e) for n, b in lb.banks.items()}, H, I)
            if set(ours) != set(theirs):
                r.problems.append(f"expert {e}: decodes to {sorted(ours)} here, {sorted(theirs)} in the source")
                break
            for k, w in ours.items():
                if theirs[k].shape != w.shape:
                    r.problems.append(f"expert {e} {k}: shape {w.shape} differs from the source's {theirs[k].shape}")
                    break
                err = float(np.nanmax(np.abs(w - theirs[k]))) if w.size else 0.0
                scale = float(np.nanmax(np.abs(theirs[k]))) if w.size else 0.0
                r.max_abs_err = max(r.max_abs_err, err)
                if err > 1e-6 * max(scale, 1e-30):  # bytes are equal: only the documented
                    # compressed-tensors reciprocal global (2^-24 relative) may show here
                    r.problems.append(f"expert {e} {k}: max |error| {err:.3g} (scale {scale:.3g})")
            else:
                r.experts_dequantized += 1


def step_tensors(ctx: CheckContext) -> None:
    f = ctx.f
    rep = ctx.report
    src = {t.name: t for t in ctx.reader.tensors()}
    for name, info in f.tensors.items():
        if name not in src:
            rep.problems.append(f"tensor {name}: in FTW, not in the source")
            continue
        a, b = _u8(f.tensor(name)), _u8(src[name].data())
        if not np.array_equal(a, b):
            rep.problems.append(f"tensor {name}: bytes differ from the source")
        rep.tensors_compared += 1
        rep.tensor_bytes_compared += a.nbytes
    attachments = ctx.reader.attachments()
    for name in f.attachments:
        if attachments.get(name) != f.attachment(name):
            rep.problems.append(f"attachment {name}: differs from the source")
        rep.attachments_compared += 1


STEPS: list[Callable[[CheckContext], None]] = [step_container, step_bytes, step_dequant, step_tensors]


def check(src: str | os.PathLike, path: str | os.PathLike | FtwFile, *, experts: int = 3,
          threads: int | None = None, progress: Callable[..., None] | None = None) -> CheckReport:
    """path may be an open FtwFile (the caller keeps it open); progress(nbytes, layers=0)."""
    from contextlib import nullcontext

    from ftw.readers import open_checkpoint

    from .container import open as open_ftw

    opened = nullcontext(path) if isinstance(path, FtwFile) else open_ftw(path)
    with opened as f, open_checkpoint(src) as reader:
        path = f.path
        report = CheckReport(os.fspath(src), path)
        layers = sorted(f.layers)
        missing = [l for l in layers if l not in reader.model.moe_layers]
        if missing:
            raise FtwError(f"{path}: layer {missing[0]} is not a MoE layer of {src}")
        plan = {lb.layer: lb for lb in reader.plan(layers)}
        for layer in layers:
            report.layers[layer] = LayerResult(layer, f.layer_formats[layer].key())
        ctx = CheckContext(f, reader, plan, report, experts, threads or min(4, os.cpu_count() or 1),
                           progress or (lambda n=0, layers=0: None))
        for step in STEPS:
            step(ctx)
        return report
