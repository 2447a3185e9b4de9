"""`ftw check --runtime cpu|cuda`: random tokens through a runtime, against a float64 MoE
computed from the SOURCE checkpoint's own tensors (LayerBanks.reference_expert), so one check
covers the reader, the writer, the loader and the runtime at once.

A layer whose format the runtime has no kernel for is reported "not run on <runtime>" and
fails the check only with --strict.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import FtwError, UnsupportedError

# relative error ||out - ref|| / ||ref|| allowed per runtime: the CPU executor accumulates in
# float32 from float32 hidden states; the CUDA kernels round x and the activation to bf16
# (ftw/runtime/cuda_experts.py says where)
TOLERANCE = {"cpu": 1e-4, "cuda": 2e-2}
STEPS = 6  # random forwards per layer, T in [1, MAX_TOKENS]: decode sizes and small prefill
MAX_TOKENS = 33


def runtime_step(runtime: str) -> Callable:
    if runtime == "cuda":
        from .cuda_check import cuda_step

        return cuda_step
    if runtime != "cpu":
        raise FtwError(f"no runtime step for {runtime!r}")
    return cpu_step


def source_weights(lb) -> dict[int, dict[str, np.ndarray]]:
    """Every expert's float64 weights from the source's own tensors (the reader's banks only
    for a layout without an independent reference)."""
    E = next(iter(lb.banks.values())).num_experts
    with np.errstate(all="ignore"):
        return {e: lb.reference_expert(e) if lb.reference is not None else lb.decode_expert(e) for e in range(E)}


def _cpu_executors(ctx, layers: list[int]) -> dict[int, tuple[object, str]]:
    """(executor or None, why not) per layer: one load and one executor per format, so a
    format the executor cannot run leaves the others running."""
    from ..loader import load_expert_banks
    from . import CpuMoeExecutor

    by_format: dict = {}
    for layer in layers:
        by_format.setdefault(ctx.f.layer_formats[layer], []).append(layer)
    out = {}
    for group in by_format.values():
        try:
            ex = CpuMoeExecutor(load_expert_banks(ctx.f, layers=group, threads=ctx.threads))
            out.update({layer: (ex, "") for layer in group})
        except UnsupportedError as e:
            out.update({layer: (None, str(e)) for layer in group})
    return out


def cpu_step(ctx) -> None:
    from .roundtrip import roundtrip_cpu

    rng = np.random.default_rng(ctx.seed)
    model = ctx.reader.model
    plan = dict(ctx.common_layers())
    layers = [layer for layer in plan if ctx.report.layers[layer].ok]
    executors = _cpu_executors(ctx, layers) if layers else {}
    for layer in layers:
        r = ctx.report.layers[layer]
        ex, reason = executors[layer]
        if ex is None:
            r.runtime = {"runtime": "cpu", "run": False, "reason": reason}
            (r.problems if ctx.report.strict else r.notes).append(f"not run on cpu: {reason}")
            continue
        got = roundtrip_cpu(ex, layer, source_weights(plan[layer]), model.activation, rng, steps=STEPS,
                            max_tokens=MAX_TOKENS, top_k=model.top_k)
        r.runtime = {"runtime": "cpu", "run": True, "tokens": got["tokens"], "max_rel_err": got["max_rel_err"],
                     "tolerance": TOLERANCE["cpu"]}
        if not got["max_rel_err"] <= TOLERANCE["cpu"]:
            r.problems.append(f"cpu executor: relative error {got['max_rel_err']:.3g} > {TOLERANCE['cpu']:g} "
                              f"against the float64 MoE from the source")
