"""`ftw check --runtime cuda`: the round trip through the GPU.

converted file -> pinned banks (load_expert_banks(pin=True)) -> per-format slot pools (CUDA
backend) -> each layer's kernel reading its own pool's slots -> compared with the float64 MoE
computed from the SOURCE checkpoint's tensors, and with the CPU executor. The cache is sized
one expert short of a layer's E per pool, so a stream of random decode steps hits, misses and
evicts in every pool; prefill chunks run through the staging region, tokens grouped by expert.
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedError
from .check_step import TOLERANCE, source_weights
from .roundtrip import random_tokens, reference_moe

DECODE_STEPS = 12
PREFILL_TOKENS = 24


def _tokens(rng: np.random.Generator, T: int, H: int, E: int, k: int):
    x, ids, w = random_tokens(rng, T, H, np.arange(E), min(k, E))
    return x, ids.astype(np.int32), w


def _forward(rt, torch, fmt, view, num_slots, dtypes, H, I, x, ids, w, activation, stream):  # noqa: E741
    """One layer-step on a pool (or staging) view: pairs routed to experts this view does not
    hold are skipped by the kernels, so passes over the cache and staging add up."""
    from ..formats import get_format
    from .cuda_experts import _activation, ggml_type_ids, workspace

    T, K = ids.shape
    dev = torch.device("cuda")
    names = get_format(fmt.name).bank_names
    bias = next((dtypes[n] for n in names if n.endswith("_bias") and n in dtypes), "bf16")
    scale = dtypes.get("gate_up_scale", "f32") if fmt.name == "fp8_block" else "f32"
    xb = torch.from_numpy(x).to(dev).to(torch.bfloat16).contiguous()
    ids_t = torch.from_numpy(ids.astype(np.int32)).to(dev)
    w_t = torch.from_numpy(w.astype(np.float32)).to(dev)
    out = torch.zeros((T, H), dtype=torch.float32, device=dev)
    ws = workspace(T, K, I, view.num_experts, H, dev)
    kind, alpha, limit = _activation(activation)
    bo, bi = fmt.options.get("block_size", [128, 128]) if fmt.name == "fp8_block" else (128, 128)
    rt.cuda_experts_forward(
        fmt.name, list(view.bank_base), list(view.row_bytes), view.slot_of_expert, view.num_experts, num_slots,
        H, I, T, K, xb.data_ptr(), ids_t.data_ptr(), w_t.data_ptr(), out.data_ptr(), ws.data_ptr(),
        ws.numel() * ws.element_size(), kind, alpha, limit, int(bo), int(bi), scale, bias, stream,
        ggml_type_ids(fmt))
    return out


def cuda_step(ctx) -> None:
    import torch

    from .. import _runtime as rt
    from ..loader import load_expert_banks
    from . import cuda_experts
    from .pools import SlotPools

    if not cuda_experts.available():
        raise UnsupportedError("ftw check --runtime cuda: this build has no CUDA kernels or torch sees no GPU "
                               "(ftw.runtime.build_info() says what was built)")
    rng = np.random.default_rng(ctx.seed)
    model, f, rep = ctx.reader.model, ctx.f, ctx.report
    run = []
    for layer, _ in ctx.common_layers():
        r = rep.layers[layer]
        if not r.ok:
            continue
        fmt = f.layer_formats[layer]
        reason = cuda_experts.unsupported_reason(fmt)  # per format, and per ggml type for gguf
        if reason is not None:
            r.runtime = {"runtime": "cuda", "run": False, "reason": reason}
            (r.problems if rep.strict else r.notes).append(f"not run on cuda: {reason}")
        else:
            run.append(layer)
    if not run:
        return
    banks = load_expert_banks(f.path, layers=run, pin=True, threads=ctx.threads)
    E, k, H = banks.num_experts, model.top_k, model.hidden_size
    pools_n = len(banks.formats())
    per_pool = max(min(k, E), E - 1)  # one expert short of a whole layer: every pool evicts
    stream = torch.cuda.current_stream().cuda_stream
    sp = SlotPools(banks, slots=per_pool * pools_n, top_k=k, decode_batch=1, prefill_chunk=PREFILL_TOKENS,
                   backend="cuda", stream=stream)
    plan = dict(ctx.common_layers())
    weights = {layer: source_weights(plan[layer]) for layer in run}
    cpu = None
    try:
        from . import CpuMoeExecutor

        cpu = CpuMoeExecutor(banks)  # the same pinned host banks, read in place
    except (ImportError, UnsupportedError):
        cpu = None
    worst = {layer: 0.0 for layer in run}
    worst_cpu = {layer: 0.0 for layer in run}
    tokens = {layer: 0 for layer in run}

    def compare(layer, x, ids, w, got):
        ref = reference_moe(weights[layer], model.activation, x, ids, w)
        denom = float(np.linalg.norm(ref)) or 1.0
        worst[layer] = max(worst[layer], float(np.linalg.norm(got - ref)) / denom)
        if cpu is not None:
            c = np.asarray(cpu.forward(layer, x, ids, w), dtype=np.float64)
            worst_cpu[layer] = max(worst_cpu[layer], float(np.linalg.norm(got - c)) / denom)
        tokens[layer] += x.shape[0]

    # decode: one token per layer-step; a layer's kernel runs right after its experts are made
    # resident, as a serving engine runs it (a pool one expert short of E evicts on the way)
    for _ in range(DECODE_STEPS):
        for layer in run:
            x, ids, w = _tokens(rng, 1, H, E, k)
            sp.decode_step({layer: ids.reshape(-1)})
            view = sp.view(layer)
            slots = sp.plan["pools"][sp.pool_of(layer)]["slots"]
            got = _forward(rt, torch, f.layer_formats[layer], view, slots, banks.dtypes, H,
                           model.intermediate_size(layer), x, ids, w, model.activation, stream)
            torch.cuda.synchronize()
            compare(layer, x, ids, w, got.double().cpu().numpy())
    # prefill: a chunk of tokens per layer, the cache's hits then staged groups, summed
    for layer in run:
        x, ids, w = _tokens(rng, PREFILL_TOKENS, H, E, k)
        total = None
        for view, _experts in sp.prefill_layer(layer, np.unique(ids)):
            pool = sp.plan["pools"][sp.pool_of(layer)]
            slots = pool["slots"] if view.staging_half < 0 else pool["staging_group"]
            part = _forward(rt, torch, f.layer_formats[layer], view, slots, banks.dtypes, H,
                            model.intermediate_size(layer), x, ids, w, model.activation, stream)
            torch.cuda.synchronize()
            total = part if total is None else total + part
        compare(layer, x, ids, w, total.double().cpu().numpy())
    stats = sp.stats()
    for layer in run:
        r = rep.layers[layer]
        fmt_key = f.layer_formats[layer].key()
        s = stats.get(fmt_key, {})
        r.runtime = {"runtime": "cuda", "run": True, "tokens": tokens[layer], "max_rel_err": worst[layer],
                     "max_rel_err_vs_cpu": worst_cpu[layer] if cpu is not None else None,
                     "tolerance": TOLERANCE["cuda"], "pool": s}
        if not worst[layer] <= TOLERANCE["cuda"]:
            r.problems.append(f"cuda kernels: relative error {worst[layer]:.3g} > {TOLERANCE['cuda']:g} "
                              f"against the float64 MoE from the source")
        if cpu is not None and not worst_cpu[layer] <= TOLERANCE["cuda"]:
            r.problems.append(f"cuda kernels: relative difference {worst_cpu[layer]:.3g} from the CPU executor")
        if s and not (s.get("misses", 0) and s.get("evictions", 0)):
            r.notes.append(f"pool {fmt_key}: {s.get('hits', 0)} hits, {s.get('misses', 0)} misses, "
                           f"{s.get('evictions', 0)} evictions")
