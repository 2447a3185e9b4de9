"""`ftw check`: prove an FTW file holds exactly what converting its source would produce.

The expected content is what `plan_conversion` makes of the source with the selection the
file records (`--layers`, `--experts-only`): the model shape (activation included), the MoE
layers and their formats, every bank (dtype, shape, the bytes of every expert), every
non-expert tensor (dtype, shape, meta, bytes) and every attachment. Each difference is named,
what the source has and what the file has, not only the first.

Bytes equal to what the reader re-lays cannot catch a reader that re-lays wrongly, so sample
experts are also decoded two independent ways: the FTW rows through the format's decoder,
and the SOURCE tensors as the checkpoint names them (gate, up and down separately) through
the format's per-projection decoder (LayerBanks.reference). Runtime steps (`--runtime cpu`,
`cuda`) push random tokens through the executors and compare with a float64 MoE computed
from those source weights.

The caller opens the source and passes its reader: ftw/ does not import the readers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .container import FtwFile
from .errors import FtwError, UnsupportedError
from .layer_ranges import format_layers

RUNTIMES = ("none", "cpu", "cuda", "auto")
DECODE_RTOL = 2.0**-23  # bytes are equal; only compressed-tensors' reciprocal global (2^-24) may show


@dataclass
class LayerResult:
    layer: int
    format: str
    banks: int = 0
    bytes_compared: int = 0
    experts_decoded: int = 0
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    runtime: dict | None = None  # {"runtime", "tokens", "max_rel_err", ...} of a runtime step
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be checked, and why

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def result(self) -> str:
        return "ok" if self.ok else "FAIL"


@dataclass
class CheckReport:
    source: str
    file: str
    selection: str = ""  # "layers 1-2 of 0-3 (converted with --layers 1-2)"
    runtime: str = "none"
    strict: bool = False
    layers: dict[int, LayerResult] = field(default_factory=dict)
    tensors_compared: int = 0
    tensor_bytes_compared: int = 0
    attachments_compared: int = 0
    problems: list[str] = field(default_factory=list)  # not tied to one layer
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(r.ok for r in self.layers.values())

    def all_problems(self) -> list[str]:
        return self.problems + [f"layer {r.layer}: {p}" for r in self.layers.values() for p in r.problems]

    def to_json(self) -> dict:
        return {
            "source": self.source, "file": self.file, "ok": self.ok, "selection": self.selection,
            "runtime": self.runtime, "strict": self.strict,
            "layers": [vars(r) | {"ok": r.ok, "result": r.result} for r in self.layers.values()],
            "tensors_compared": self.tensors_compared,
            "tensor_bytes_compared": self.tensor_bytes_compared,
            "attachments_compared": self.attachments_compared,
            "problems": self.problems, "notes": self.notes,
        }


@dataclass
class CheckContext:
    f: FtwFile
    reader: object  # a ftw.readers.CheckpointReader
    plan: object  # the ConvertPlan the file's selection gives
    report: CheckReport
    experts: int  # sample experts per layer for the decoding step
    threads: int
    progress: Callable[..., None]
    seed: int | None = None

    def layer_result(self, layer: int) -> LayerResult:
        r = self.report.layers.get(layer)
        if r is None:
            fmt = self.f.layer_formats.get(layer)
            r = self.report.layers[layer] = LayerResult(layer, fmt.key() if fmt else "-")
        return r

    def common_layers(self):
        """Layers both the source's plan and the file have, with the source's LayerBanks."""
        return [(lb.layer, lb) for lb in self.plan.layers if lb.layer in self.f.layers]


def _u8(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _short(v, n: int = 80) -> str:
    s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."


# -- steps ------------------------------------------------------------------------------------


def step_container(ctx: CheckContext) -> None:
    try:
        ctx.f.verify(threads=ctx.threads, progress=ctx.progress)
    except UnsupportedError:
        raise
    except FtwError as e:  # a sealed file whose content contradicts itself: named, and the rest still compared
        ctx.report.problems.append(f"container: {e}")


def step_model(ctx: CheckContext) -> None:
    src, have = ctx.reader.model.to_json(), (ctx.f.model.to_json() if ctx.f.model else None)
    if have is None:
        ctx.report.problems.append("model: the file records none; the source's is " + _short(src))
        return
    for key in sorted(set(src) | set(have)):
        if src.get(key) != have.get(key):
            ctx.report.problems.append(f"model.{key}: source {_short(src.get(key))}, file {_short(have.get(key))}")


def step_layers(ctx: CheckContext) -> None:
    """The file's MoE layers against the selection it records."""
    want = {lb.layer for lb in ctx.plan.layers}
    for layer in sorted(want - set(ctx.f.layers)):
        ctx.layer_result(layer).problems.append("in the source (and the file's selection), missing from the file")
    for layer in sorted(set(ctx.f.layers) - want):
        ctx.layer_result(layer).problems.append("in the file, not in the source's selection "
                                                f"({ctx.report.selection})")


def step_banks(ctx: CheckContext) -> None:
    f = ctx.f
    for layer, lb in ctx.common_layers():
        r = ctx.layer_result(layer)
        fmt = f.layer_formats[layer]
        if fmt != lb.format:
            r.problems.append(f"format: source {lb.format}, file {fmt}")
            continue
        have, want = set(f.layers[layer]), set(lb.banks)
        for name in sorted(want - have):
            r.problems.append(f"bank {name}: in the source, missing from the file")
        for name in sorted(have - want):
            r.problems.append(f"bank {name}: in the file, not in the source")
        for name in sorted(have & want):
            src, info = lb.banks[name], f.layers[layer][name]
            r.banks += 1
            if info.dtype != src.dtype or info.shape != (src.num_experts, *src.row_shape):
                r.problems.append(f"bank {name}: source {src.dtype} {[src.num_experts, *src.row_shape]}, "
                                  f"file {info.dtype} {list(info.shape)}")
                continue
            differ = []
            for e in range(src.num_experts):
                a, b = _u8(f.expert_row(layer, name, e)), _u8(src.row_array(e))
                if not np.array_equal(a, b):
                    differ.append(e)
                r.bytes_compared += a.nbytes
            if differ:
                r.problems.append(f"bank {name}: bytes of {len(differ)} of {src.num_experts} experts differ "
                                  f"from the source (experts {format_layers(differ[:8])}"
                                  f"{', ...' if len(differ) > 8 else ''})")
        # the source is memory-mapped: drop what this layer touched, or RSS grows to the model
        # (the FTW side is read with pread during a check and maps nothing)
        ctx.reader.release_pages()
        ctx.progress(0, layers=1)


def sample_experts(num_experts: int, count: int) -> list[int]:
    """First, last and evenly spaced experts between: corruption at either end shows."""
    if count >= num_experts:
        return list(range(num_experts))
    return sorted({round(i * (num_experts - 1) / max(count - 1, 1)) for i in range(count)})


def compare_weights(r: LayerResult, e: int, ours: dict, theirs: dict, where: str) -> bool:
    if set(ours) != set(theirs):
        r.problems.append(f"expert {e}: decodes to {sorted(ours)} in the file, {sorted(theirs)} {where}")
        return False
    ok = True
    for k, w in ours.items():
        ref = theirs[k]
        if ref.shape != w.shape:
            r.problems.append(f"expert {e} {k}: shape {list(w.shape)} in the file, {list(ref.shape)} {where}")
            ok = False
            continue
        if not w.size:
            continue
        err = float(np.nanmax(np.abs(w - ref)))
        scale = float(np.nanmax(np.abs(ref)))
        rel = err / scale if scale else (0.0 if err == 0 else float("inf"))
        r.max_abs_err, r.max_rel_err = max(r.max_abs_err, err), max(r.max_rel_err, rel)
        if rel > DECODE_RTOL or np.isnan(w).sum() != np.isnan(ref).sum():
            r.problems.append(f"expert {e} {k}: max |error| {err:.3g} against max |w| {scale:.3g} {where}")
            ok = False
    return ok


def step_decode(ctx: CheckContext) -> None:
    f = ctx.f
    for layer, lb in ctx.common_layers():
        r = ctx.layer_result(layer)
        if not r.ok:
            continue
        num_experts = next(iter(lb.banks.values())).num_experts
        where = "decoded from the source's own tensors"
        if lb.reference is None:
            where = "decoded from the reader's banks"
            r.notes.append("no independent reference for this layout: compared with the reader's banks")
        for e in sample_experts(num_experts, ctx.experts):
            try:
                with np.errstate(all="ignore"):
                    ours = f.decode_expert(layer, e)
                    theirs = lb.reference_expert(e) if lb.reference is not None else lb.decode_expert(e)
            except UnsupportedError as err:
                r.notes.append(f"not decoded: {err}")  # the bytes were still compared
                break
            except FtwError as err:  # the layer's banks contradict its format or the model
                r.problems.append(f"not decoded: {err}")
                break
            if not compare_weights(r, e, ours, theirs, where):
                break
            r.experts_decoded += 1


def step_tensors(ctx: CheckContext) -> None:
    f, rep = ctx.f, ctx.report
    want = {t.name: t for t in ctx.plan.tensors}
    for name in sorted(set(want) - set(f.tensors)):
        rep.problems.append(f"tensor {name}: in the source, missing from the file")
    for name in sorted(set(f.tensors) - set(want)):
        rep.problems.append(f"tensor {name}: in the file, not in the source's selection")
    for name in sorted(set(want) & set(f.tensors)):
        src, info = want[name], f.tensors[name]
        rep.tensors_compared += 1
        if info.dtype != src.dtype or tuple(info.shape) != tuple(src.shape):
            rep.problems.append(f"tensor {name}: source {src.dtype} {list(src.shape)}, file {info.dtype} {list(info.shape)}")
            continue
        if (info.meta or {}) != (src.meta or {}):
            rep.problems.append(f"tensor {name}: meta {_short(info.meta)} in the file, {_short(src.meta)} in the source")
        a, b = _u8(f.tensor(name)), _u8(src.data())
        if not np.array_equal(a, b):
            rep.problems.append(f"tensor {name}: bytes differ from the source")
        rep.tensor_bytes_compared += a.nbytes
    want_att = ctx.plan.attachments
    for name in sorted(set(want_att) - set(f.attachments)):
        rep.problems.append(f"attachment {name}: in the source, missing from the file")
    for name in sorted(set(f.attachments) - set(want_att)):
        rep.problems.append(f"attachment {name}: in the file, not in the source")
    for name in sorted(set(want_att) & set(f.attachments)):
        rep.attachments_compared += 1
        if f.attachment(name) != want_att[name]:
            rep.problems.append(f"attachment {name}: bytes differ from the source")


STEPS: list[Callable[[CheckContext], None]] = [
    step_container, step_model, step_layers, step_banks, step_decode, step_tensors,
]


def selection_text(f: FtwFile, model_layers: list[int]) -> str:
    sel = f.selection
    have = format_layers(sorted(f.layers)) or "none"
    text = f"layers {have} of {format_layers(model_layers) or 'none'}"
    how = []
    if sel.layers is not None:
        how.append(f"--layers {format_layers(list(sel.layers))}")
    if sel.experts_only:
        how.append("--experts-only")
    return text + (f" (converted with {' '.join(how)})" if how else "")


def resolve_runtime(runtime: str) -> str:
    if runtime not in RUNTIMES:
        raise FtwError(f"--runtime {runtime!r}: expected one of {', '.join(RUNTIMES)}")
    if runtime != "auto":
        return runtime
    from .runtime import cuda_device_count

    return "cuda" if cuda_device_count() > 0 else "cpu"


def check(reader, path: str | os.PathLike | FtwFile, *, experts: int = 3, runtime: str = "none",
          strict: bool = False, threads: int | None = None, seed: int | None = None,
          progress: Callable[..., None] | None = None) -> CheckReport:
    """reader: the opened source (ftw.readers.open_checkpoint); path: an FTW path or an open
    FtwFile (the caller keeps it open); progress(nbytes, layers=0)."""
    from contextlib import nullcontext

    from .container import open as open_ftw
    from .writers.convert import plan_conversion

    runtime = resolve_runtime(runtime)
    opened = nullcontext(path) if isinstance(path, FtwFile) else open_ftw(path)
    with opened as f:
        report = CheckReport(str(reader.path), f.path, runtime=runtime, strict=strict)
        report.selection = selection_text(f, reader.model.moe_layers)
        sel = f.selection
        try:
            plan = plan_conversion(reader, None if sel.layers is None else list(sel.layers), sel.experts_only)
        except FtwError as e:  # the recorded selection names layers the source does not have
            report.problems.append(f"selection: {e}")
            return report
        for layer in sorted(set(f.layers) | {lb.layer for lb in plan.layers}):
            ctx_fmt = f.layer_formats.get(layer)
            report.layers[layer] = LayerResult(layer, (ctx_fmt or next(lb.format for lb in plan.layers
                                                                         if lb.layer == layer)).key())
        ctx = CheckContext(f, reader, plan, report, experts, threads or min(4, os.cpu_count() or 1),
                           progress or (lambda n=0, layers=0: None), seed)
        f.pread_only, was = True, f.pread_only  # a file cut short mid-check: an error, not a SIGBUS
        steps = list(STEPS)
        if runtime != "none":
            from .runtime.check_step import runtime_step

            steps.append(runtime_step(runtime))
        try:
            for step in steps:
                step(ctx)
        finally:
            f.pread_only = was
        return report
