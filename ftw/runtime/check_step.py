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
from ..formats import Activation

# relative error ||out - ref|| / ||ref|| allowed per runtime: the CPU executor accumulates in
# float32 from float32 hidden states; the CUDA kernels round activations to bf16 between gate
# and down (documented per format in docs/RUNTIME.md)
TOLERANCE = {"cpu": 1e-4, "cuda": 2e-2}
TOKENS = (1, 3, 8, 33)  # decode sizes and one small prefill


def moe_reference(weights: dict[int, dict[str, np.ndarray]], activation: Activation, hidden: np.ndarray,
                  topk_ids: np.ndarray, topk_weights: np.ndarray) -> np.ndarray:
    """float64 routed-expert output: sum_k w_k * (down @ act(gate @ x + bg, up @ x + bu) + bd)."""
    x = hidden.astype(np.float64)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e, w in zip(topk_ids[t], topk_weights[t]):
            p = weights[int(e)]
            g, u = p["gate"] @ x[t], p["up"] @ x[t]
            if "gate_bias" in p:
                g, u = g + p["gate_bias"], u + p["up_bias"]
            y = p["down"] @ activation.apply(g, u)
            if "down_bias" in p:
                y = y + p["down_bias"]
            out[t] += float(w) * y
    return out


def _tokens(rng: np.random.Generator, T: int, H: int, E: int, k: int):
    hidden = rng.standard_normal((T, H)).astype(np.float32)
    ids = np.stack([rng.choice(E, size=min(k, E), replace=False) for _ in range(T)]).astype(np.int32)
    w = rng.random(ids.shape).astype(np.float32) + 0.1
    return hidden, ids, (w / w.sum(1, keepdims=True)).astype(np.float32)


def _cpu_layers(ctx, layers: list[int]):
    """(executor or None, reason) per layer, one executor per format group."""
    from ..loader import load_expert_banks
    from . import CpuMoeExecutor

    banks = load_expert_banks(ctx.f.path, layers=layers, threads=ctx.threads)
    out = {}
    for fmt, group in banks.formats().items():
        try:
            part = banks.subset(group) if hasattr(banks, "subset") else banks
            ex = CpuMoeExecutor(part)
            out.update({layer: (ex, "") for layer in group})
        except UnsupportedError as e:
            out.update({layer: (None, str(e)) for layer in group})
    return out


def runtime_step(runtime: str) -> Callable:
    if runtime == "cuda":
        from .cuda_check import cuda_step

        return cuda_step
    if runtime != "cpu":
        raise FtwError(f"no runtime step for {runtime!r}")
    return cpu_step


def cpu_step(ctx) -> None:
    rng = np.random.default_rng(ctx.seed)
    model = ctx.reader.model
    layers = [layer for layer, _ in ctx.common_layers() if ctx.report.layers[layer].ok]
    if not layers:
        return
    executors = _cpu_layers(ctx, layers)
    plan = dict(ctx.common_layers())
    for layer in layers:
        r = ctx.report.layers[layer]
        ex, reason = executors[layer]
        if ex is None:
            r.runtime = {"runtime": "cpu", "run": False, "reason": reason}
            (r.problems if ctx.report.strict else r.notes).append(f"not run on cpu: {reason}")
            continue
        lb = plan[layer]
        E = next(iter(lb.banks.values())).num_experts
        H = model.hidden_size
        weights = {e: lb.reference_expert(e) if lb.reference is not None else lb.decode_expert(e) for e in range(E)}
        worst, tokens = 0.0, 0
        for T in TOKENS:
            hidden, ids, w = _tokens(rng, T, H, E, model.top_k)
            got = np.asarray(ex.forward(layer, hidden, ids, w), dtype=np.float64)
            ref = moe_reference(weights, model.activation, hidden, ids, w)
            denom = float(np.linalg.norm(ref)) or 1.0
            worst = max(worst, float(np.linalg.norm(got - ref)) / denom)
            tokens += T
        r.runtime = {"runtime": "cpu", "run": True, "tokens": tokens, "max_rel_err": worst,
                     "tolerance": TOLERANCE["cpu"]}
        if not worst <= TOLERANCE["cpu"]:
            r.problems.append(f"cpu executor: relative error {worst:.3g} > {TOLERANCE['cpu']:g} "
                              f"against the float64 MoE from the source")
