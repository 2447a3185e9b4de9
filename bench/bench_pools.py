"""Slot pools: miss-fill bandwidth, host planning cost, and LRU vs frequency-weighted LRU.

    python bench/bench_pools.py [--part fill,plan,hits] [--gib 2] [--json]

fill (CUDA only): one step whose every expert misses (two alternating halves of the experts,
    each evicting the other), rows of 9 MiB / 256 KiB / 64 KiB and NVFP4-shaped experts
    (H=7168, I=2048: rows of 14 MiB ... 16 KiB), each through the automatic split, the batch
    call alone and the copy kernel alone; against one large pinned host-to-device copy of the
    same bytes in the same run (the device's own peak). Two times, medians: host-side from
    before planning to the end of the copies, and the copies alone (events on the copy stream).
plan: the host time of planning one decode step of 60 layers (E=128, top_k=8, batch 64, 512
    picks per layer, ~125 distinct experts, 90% of them resident), one request per layer as an
    engine issues them, against the GPU copy time of that step's misses at NVFP4 size
    (24,817,664 bytes per expert, at the NVFP4 miss-fill rate measured in `fill`). On a machine
    without CUDA the host twin plans (and memcpys rows of 16-64 bytes) and no share is given.
hits (CPU too): hit rates of LRU and LRFU (several lambdas) on a generated routing trace: per
    layer a Zipf(s) popularity over the E experts (a random permutation per layer); each token
    re-picks a share r of the previous token's experts and draws the rest by popularity;
    decode batch 1, caches of 10-50% of all experts, the first `warm` tokens not counted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from ftw.formats import LayerFormat
from ftw.loader import ExpertBanks
from ftw.runtime.pools import SlotPools, format_row_bytes

NVFP4 = LayerFormat.of("nvfp4")
BF16 = LayerFormat.of("bf16")
MiB, KiB, GiB = 1 << 20, 1 << 10, 1 << 30


def cuda_ready() -> bool:
    try:
        import torch

        from ftw.runtime import build_info

        return torch.cuda.is_available() and bool(build_info().get("cuda"))
    except Exception:
        return False


# -- fill -------------------------------------------------------------------------------


def banks_of(rows: dict[str, int], fmt: LayerFormat, layers: int, E: int, pinned: bool) -> ExpertBanks:
    import torch

    banks = {}
    for name, n in rows.items():
        banks[name] = {}
        for l in range(layers):
            t = torch.empty((E, n), dtype=torch.uint8, pin_memory=pinned)
            t.fill_(l % 250 + 1)  # touch every page
            banks[name][l] = t
    return ExpertBanks(banks, {l: fmt for l in range(layers)}, E)


def time_fill(pools: SlotPools, layers: int, E: int, reps: int) -> tuple[float, float]:
    """Median seconds of one all-miss step: host (submit to sync, planning included) and
    device (the batch's copies alone, events on the copy stream)."""
    halves = [np.arange(0, E, 2), np.arange(1, E, 2)]
    host, device = [], []
    for i in range(reps + 2):
        routed = {l: halves[i % 2] for l in range(layers)}
        t0 = time.perf_counter()
        pools.decode_step(routed, join=False)
        pools.sync()
        if i >= 2:
            host.append(time.perf_counter() - t0)
            device.append(pools._p.last_copy_ms / 1e3)  # noqa: SLF001
    return statistics.median(host), statistics.median(device)


def peak_copy(nbytes: int, reps: int) -> float:
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    src.fill_(7)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    times = []
    for i in range(reps + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times)


def bench_fill(gib: float, reps: int) -> list[dict]:
    import torch

    cases = [("9 MiB rows", {"gate_up": 9 * MiB}, BF16), ("256 KiB rows", {"gate_up": 256 * KiB}, BF16),
             ("64 KiB rows", {"gate_up": 64 * KiB}, BF16),
             ("NVFP4 experts (H=7168, I=2048)", format_row_bytes(NVFP4, 7168, 2048), NVFP4)]
    out = []
    for label, rows, fmt in cases:
        per_expert = sum(rows.values())
        n = max(4, int(gib * GiB / per_expert)) // 2 * 2
        E = min(n, 128) // 2 * 2
        layers = max(1, round(n / E))
        banks = banks_of(rows, fmt, layers, E, pinned=True)
        pools = SlotPools(banks, slots=layers * E // 2, top_k=1, decode_batch=1, backend="cuda",
                          stream=torch.cuda.current_stream().cuda_stream)
        pools._p.set_timing(True)  # noqa: SLF001
        step_bytes = layers * (E // 2) * per_expert
        peak = peak_copy(step_bytes, reps)
        res = {"case": label, "rows_per_step": layers * (E // 2) * len(rows), "step_bytes": step_bytes,
               "peak_GBps": peak / 1e9}
        for mech, min_row in (("auto", None), ("batch call", 0), ("copy kernel", 1 << 62)):
            if min_row is not None:
                pools._p.set_batch_min_row(min_row)  # noqa: SLF001
            else:
                pools._p.set_batch_min_row(256 * KiB)  # noqa: SLF001
            host_s, dev_s = time_fill(pools, layers, E, reps)
            bw, dev_bw = step_bytes / host_s, step_bytes / dev_s
            res[mech] = {"GBps": bw / 1e9, "ratio": bw / peak, "copy_GBps": dev_bw / 1e9, "copy_ratio": dev_bw / peak}
        res["batch_call_failures"] = pools._p.batch_call_failures  # noqa: SLF001
        out.append(res)
        del pools, banks
        torch.cuda.empty_cache()
    return out


# -- plan -------------------------------------------------------------------------------


def plan_trace(rng, steps: int, L: int, E: int, K: int, B: int, S: int, turnover: float) -> list[list[np.ndarray]]:
    """Per step and layer: B*K picks over a working set of S distinct experts, of which a share
    `turnover` is replaced by experts outside it at every step."""
    sets = [rng.choice(E, S, replace=False) for _ in range(L)]
    trace = []
    for _ in range(steps):
        step = []
        for l in range(L):
            k = int(round(turnover * S))
            outside = np.setdiff1d(np.arange(E), sets[l])
            sets[l] = np.concatenate([rng.permutation(sets[l])[k:], rng.choice(outside, k, replace=False)])
            ws = sets[l]
            step.append(rng.permutation(np.concatenate([ws, rng.choice(ws, B * K - S)])).astype(np.int32))
        trace.append(step)
    return trace


def run_plan(pools: SlotPools, trace, L: int) -> list[float]:
    times = []
    for t, step in enumerate(trace):
        pools.sync()
        if t == 2:
            pools.reset_stats()
        t0 = time.perf_counter()
        pools._p.begin_step()  # noqa: SLF001
        for l in range(L):
            pools.request(l, step[l])
        if t >= 2:
            times.append(time.perf_counter() - t0)
    pools.sync()
    return times


def bench_plan(steps: int, nvfp4_GBps: float | None, backend: str) -> dict:
    """Per layer 512 picks over S=100 distinct experts, 10% of them new at every step; the
    pool holds S slots per layer, so the previous step's set is resident: 90% hits."""
    L, E, K, B, S = 60, 128, 8, 64, 100
    rng = np.random.default_rng(0)
    rows = {n: 16 * (i + 1) for i, n in enumerate(NVFP4.format.bank_names)}  # 6 banks: NVFP4's op count
    host = ExpertBanks({n: {l: np.zeros((E, b), np.uint8) for l in range(L)} for n, b in rows.items()},
                       {l: NVFP4 for l in range(L)}, E)
    best = (S, None)
    banks = host
    if backend == "cuda":
        import torch

        banks = ExpertBanks({n: {l: torch.from_numpy(a).pin_memory() for l, a in per.items()}
                             for n, per in host.banks.items()}, host.layer_formats, E)
    pools = SlotPools(banks, slots=L * best[0], top_k=K, decode_batch=16, backend=backend)
    times = run_plan(pools, plan_trace(rng, steps + 2, L, E, K, B, S, 0.1), L)
    st = pools.stats()["nvfp4"]
    hit = st["hits"] / (st["hits"] + st["misses"])
    misses = st["misses"] / steps
    res = {"backend": backend, "layers": L, "experts": E, "top_k": K, "batch": B, "distinct_per_layer": S,
           "slots_per_layer": best[0], "hit_rate": hit, "misses_per_step": misses,
           "planning_ms": 1e3 * statistics.median(times)}
    if nvfp4_GBps:
        copy_s = misses * 24_817_664 / (nvfp4_GBps * 1e9)
        res.update(copy_ms=1e3 * copy_s, share=statistics.median(times) / copy_s)
    return res


# -- hits -------------------------------------------------------------------------------


def zipf_trace(rng, L: int, E: int, K: int, T: int, s: float, reuse: float) -> list[dict[int, np.ndarray]]:
    pops = []
    for _ in range(L):
        p = 1.0 / np.arange(1, E + 1) ** s
        pops.append(rng.permutation(p / p.sum()))
    prev = [rng.choice(E, K, replace=False, p=pops[l]) for l in range(L)]
    keep = int(round(reuse * K))
    trace = []
    for _ in range(T):
        step = {}
        for l in range(L):
            kept = rng.choice(prev[l], keep, replace=False)
            p = pops[l].copy()
            p[kept] = 0
            new = rng.choice(E, K - keep, replace=False, p=p / p.sum())
            prev[l] = np.concatenate([kept, new])
            step[l] = prev[l]
        trace.append(step)
    return trace


def bench_hits(E: int, K: int, L: int, T: int, warm: int, s: float, reuse: float, lambdas: list[float]) -> dict:
    rng = np.random.default_rng(1)
    trace = zipf_trace(rng, L, E, K, T + warm, s, reuse)
    banks = ExpertBanks({"gate_up": {l: np.zeros((E, 16), np.uint8) for l in range(L)},
                         "down": {l: np.zeros((E, 16), np.uint8) for l in range(L)}},
                        {l: BF16 for l in range(L)}, E)
    rows = []
    for share in (0.1, 0.2, 0.3, 0.4, 0.5):
        row = {"cache": share, "slots_per_layer": share * E}
        for name, ev, lam in [("lru", "lru", 0.0)] + [(f"lrfu {x:g}", "lrfu", x) for x in lambdas]:
            pools = SlotPools(banks, slots=int(share * L * E), top_k=K, decode_batch=1, eviction=ev, lam=lam or 0.05)
            for t, step in enumerate(trace):
                if t == warm:
                    pools.reset_stats()
                pools.decode_step(step)
            st = pools.stats()["bf16"]
            row[name] = st["hits"] / (st["hits"] + st["misses"])
        rows.append(row)
    # the share of picks that repeat on the next token (what "reuse" produces, Zipf included)
    rep = np.mean([len(set(trace[t][l]) & set(trace[t - 1][l])) / K for t in range(1, len(trace)) for l in range(L)])
    return {"experts": E, "top_k": K, "layers": L, "tokens": T, "warmup": warm, "zipf_s": s, "reuse": reuse,
            "repeat_next_token": float(rep), "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", default="fill,plan,hits")
    ap.add_argument("--gib", type=float, default=2.0, help="bytes per fill step (fill)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--plan-steps", type=int, default=20)
    ap.add_argument("--experts", type=int, default=128, help="hits: experts per layer")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4, help="hits: layers in the pool")
    ap.add_argument("--tokens", type=int, default=3000)
    ap.add_argument("--warm", type=int, default=500)
    ap.add_argument("--zipf", type=float, default=1.0)
    ap.add_argument("--reuse", type=float, default=0.375)
    ap.add_argument("--lambdas", default="0.002,0.01,0.05,0.2")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--json-out", help="also write the results as JSON to this file")
    a = ap.parse_args()
    parts = set(a.part.split(","))
    gpu = cuda_ready()
    res: dict = {"cuda": gpu}
    if "fill" in parts:
        if gpu:
            res["fill"] = bench_fill(a.gib, a.reps)
            if not a.json:
                for r in res["fill"]:
                    print(f"fill {r['case']:32s} {r['rows_per_step']:6d} rows/step {r['step_bytes'] / GiB:5.2f} GiB  "
                          f"peak {r['peak_GBps']:5.1f} GB/s  " + "  ".join(
                              f"{m} {r[m]['GBps']:5.1f} GB/s ({r[m]['ratio']:.2f}x; copies alone "
                              f"{r[m]['copy_GBps']:5.1f}, {r[m]['copy_ratio']:.2f}x)"
                              for m in ("auto", "batch call", "copy kernel")), flush=True)
        elif not a.json:
            print("fill: skipped (no CUDA device)")
    if "plan" in parts:
        nv = next((r["auto"]["GBps"] for r in res.get("fill", []) if r["case"].startswith("NVFP4")), None)
        res["plan"] = bench_plan(a.plan_steps, nv, "cuda" if gpu else "host")
        if not a.json:
            p = res["plan"]
            line = (f"plan ({p['backend']}): 60 layers x 512 picks, hit rate {p['hit_rate']:.3f}, "
                    f"{p['misses_per_step']:.0f} misses/step, planning {p['planning_ms']:.2f} ms/step")
            if "share" in p:
                line += f"; NVFP4 copy of the misses {p['copy_ms']:.0f} ms; share {100 * p['share']:.2f}%"
            print(line, flush=True)
    if "hits" in parts:
        lams = [float(x) for x in a.lambdas.split(",") if x]
        res["hits"] = bench_hits(a.experts, a.top_k, a.layers, a.tokens, a.warm, a.zipf, a.reuse, lams)
        if not a.json:
            h = res["hits"]
            print(f"hits: E={h['experts']} top_k={h['top_k']} layers={h['layers']} tokens={h['tokens']} "
                  f"(+{h['warmup']} warm-up) zipf s={h['zipf_s']} reuse={h['reuse']} "
                  f"(repeat on next token {h['repeat_next_token']:.2f})")
            names = [k for k in h["rows"][0] if k not in ("cache", "slots_per_layer")]
            print("  cache  slots/layer  " + "  ".join(f"{n:>10s}" for n in names))
            for r in h["rows"]:
                print(f"  {100 * r['cache']:4.0f}%  {r['slots_per_layer']:11.1f}  " +
                      "  ".join(f"{r[n]:10.3f}" for n in names))
    if a.json:
        print(json.dumps(res, indent=2))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
