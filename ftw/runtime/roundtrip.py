"""`ftw check --runtime cpu`'s step: random hidden states and routings through the CPU executor,
compared with a float64 MoE computed from the SOURCE checkpoint's own expert weights.

The reference here knows nothing of the FTW file or the executor: it takes float64 gate / up /
down (and biases) per expert, as check's independent reader decoded them from the source, and
the model's activation (ftw.formats.Activation.apply, the schema's formula). So one comparison
covers the reader, the writer, the loader and the executor's kernels at once.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import FtwError


def reference_moe(weights_by_expert: Mapping[int, Mapping[str, np.ndarray]], activation, x: np.ndarray,
                  ids: np.ndarray, w: np.ndarray) -> np.ndarray:
    """float64 routed-expert output [T, H] for hidden x [T, H], ids and weights [T, k]."""
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            W = weights_by_expert[int(ids[t, j])]
            gate = W["gate"] @ x[t] + W.get("gate_bias", 0.0)
            up = W["up"] @ x[t] + W.get("up_bias", 0.0)
            h = activation.apply(gate, up)
            out[t] += float(w[t, j]) * (W["down"] @ h + W.get("down_bias", 0.0))
    return out


def random_tokens(rng: np.random.Generator, T: int, H: int, experts: np.ndarray, k: int):
    """T random float32 hidden states (N(0, 1)), each routed to k distinct experts drawn from
    `experts` with weights in [0.1, 1): (x [T, H], ids [T, k] int64, w [T, k] float32)."""
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids = np.stack([rng.choice(experts, size=k, replace=False) for _ in range(T)]).astype(np.int64)
    return x, ids, rng.uniform(0.1, 1.0, (T, k)).astype(np.float32)


def roundtrip_cpu(executor, layer: int, weights_by_expert: Mapping[int, Mapping[str, np.ndarray]], activation,
                  rng: np.random.Generator, steps: int = 4, max_tokens: int = 8, top_k: int = 4) -> dict:
    """`steps` forwards of `layer` with T in [1, max_tokens] random float32 hidden states
    (N(0, 1)) routed to random experts among those in weights_by_expert (k = min(top_k, their
    number), distinct per token, weights in [0.1, 1)). Returns {"max_rel_err": the largest
    ||out - ref|| / ||ref|| over the steps, "tokens": tokens pushed through, "steps": steps}."""
    experts = np.array(sorted(weights_by_expert), dtype=np.int64)
    if experts.size == 0:
        raise FtwError(f"layer {layer}: no expert weights to compare the executor with")
    H = next(iter(weights_by_expert.values()))["down"].shape[0]
    k = min(top_k, experts.size)
    worst, tokens = 0.0, 0
    for _ in range(steps):
        T = int(rng.integers(1, max_tokens + 1))
        x, ids, w = random_tokens(rng, T, H, experts, k)
        out = np.asarray(executor.forward(layer, x, ids, w), dtype=np.float64)
        ref = reference_moe(weights_by_expert, activation, x, ids, w)
        norm = float(np.linalg.norm(ref))
        err = float(np.linalg.norm(out - ref)) / norm if norm > 0 else float(np.linalg.norm(out))
        worst = max(worst, err)
        tokens += T
    return {"max_rel_err": worst, "tokens": tokens, "steps": steps}
