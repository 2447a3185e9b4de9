"""CPU executor speed (issue 11, "Performance"): weight bytes read per second against the
machine's read bandwidth measured in the same run, and against the straightforward references.

For each format at H=2048, I=768, E=128, top_k=8:
- T=1 (decode) and T=32 (independent random routings), with all threads and with one;
- weight bytes per second = bytes of the routed experts' banks (each distinct expert of a step
  counted once) / time per step, as a ratio of the read bandwidth of a threaded sum over a
  buffer larger than the last-level cache, with the same thread count (ftw._runtime._read_sum);
- the working set is larger than the LLC: enough layers (2 x LLC or more of banks, each layer
  one step in turn) and T=1 routings that walk through every expert, so no step finds its
  weights in the cache;
- baselines for the same routed experts (T=1): quantized formats: the format's numpy reference
  decoder (ftw.formats, timed) then a float32 matmul; bf16: torch's bf16 matmuls.

Banks are one expert's random banks (tests/bank_factory.py) repeated over the E experts and the
layers: every expert has its own memory, so reads are real; values do not matter for speed.

    .venv/bin/python bench/bench_cpu_executor.py [--formats bf16,nvfp4] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from bank_factory import random_layer  # noqa: E402

from ftw import _runtime  # noqa: E402
from ftw.formats import Activation, ModelShape, get_format  # noqa: E402
from ftw.loader import ExpertBanks  # noqa: E402
from ftw.runtime import CpuMoeExecutor  # noqa: E402

H, I, E, K = 2048, 768, 128, 8  # noqa: E741
ACT = Activation("silu", limit=10.0)

FORMATS = {
    "bf16": ("bf16", {}),
    "fp8_block": ("fp8_block", {}),
    "nvfp4": ("nvfp4", {}),
    "mxfp4": ("mxfp4", {}),
    "ds_fp4": ("ds_fp4", {}),
    "mxfp8": ("mxfp8", {}),
    "affine4": ("affine", {"bits": 4, "group_size": 64}),
    "Q4_K": ("gguf", {"gate_up_type": "Q4_K", "down_type": "Q4_K"}),
    "Q8_0": ("gguf", {"gate_up_type": "Q8_0", "down_type": "Q8_0"}),
}


def llc_bytes() -> int:
    best = 32 << 20
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in base.glob("index*"):
        try:
            size = (idx / "size").read_text().strip()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1], 1)
            best = max(best, int(size.rstrip("KMG")) * mult)
        except (OSError, ValueError):
            pass
    return best


def read_bandwidth(buf: np.ndarray, threads: int, seconds: float = 1.0) -> tuple[float, float]:
    """(bytes per wall second, bytes per CPU second of this thread: meaningful for 1 thread,
    which runs inline)."""
    _runtime._read_sum(buf, threads)  # fault in, warm the threads
    reps, t0, c0 = 0, time.perf_counter(), time.thread_time()
    while time.perf_counter() - t0 < seconds:
        _runtime._read_sum(buf, threads)
        reps += 1
    return reps * buf.nbytes / (time.perf_counter() - t0), reps * buf.nbytes / (time.thread_time() - c0)


def build(name: str, options: dict, layers: int, rng) -> tuple[ExpertBanks, dict]:
    """`layers` layers of E experts, every expert a copy of one random expert's banks."""
    one = random_layer(name, H, I, 1, rng, options, biases=False)
    banks: dict[str, dict[int, np.ndarray]] = {}
    for bank, a in one.banks.items():
        banks[bank] = {}
        for layer in range(layers):
            big = np.empty((E,) + a.shape[1:], dtype=a.dtype)
            big[:] = a[0]
            banks[bank][layer] = big
    model = ModelShape(family="bench", hidden_size=H, moe_intermediate_size=I, num_experts=E, top_k=K,
                       num_layers=layers, moe_layers=list(range(layers)), activation=ACT)
    eb = ExpertBanks(banks=banks, layer_formats={l: one.fmt for l in range(layers)}, num_experts=E,
                     dtypes={}, model=model)
    return eb, one.rows(0)


def expert_bytes(eb: ExpertBanks) -> int:
    return sum(per[0].nbytes // E for per in eb.banks.values())


def time_steps(ex, layers: int, T: int, rng, seconds: float) -> tuple[float, float, float]:
    """(wall seconds per step, this thread's CPU seconds per step, distinct experts per step)
    over a time budget. With one thread the executor runs inline, so CPU time is its time
    whatever else the machine runs."""
    x = rng.standard_normal((T, H)).astype(np.float32)
    w = rng.uniform(0.1, 1.0, (T, K)).astype(np.float32)
    walk = rng.permutation(E)

    def routing(step: int) -> np.ndarray:
        if T == 1:  # walk through every expert of a layer before coming back to one
            base = (step // layers) * K
            return walk[(base + np.arange(K)) % E][None].astype(np.int64)
        return np.stack([rng.choice(E, K, replace=False) for _ in range(T)]).astype(np.int64)

    plans = [routing(s) for s in range(4 * layers * (E // K) if T == 1 else 64)]
    for s in range(min(len(plans), 2 * layers)):  # warm-up
        ex.forward(s % layers, x, plans[s], w)
    steps, distinct, t0, c0 = 0, 0, time.perf_counter(), time.thread_time()
    while True:
        ids = plans[steps % len(plans)]
        ex.forward(steps % layers, x, ids, w)
        distinct += len(np.unique(ids))
        steps += 1
        if time.perf_counter() - t0 > seconds and steps >= 2 * layers:
            break
    return (time.perf_counter() - t0) / steps, (time.thread_time() - c0) / steps, distinct / steps


def numpy_reference_step(fmt_name: str, options: dict, rows: dict, x: np.ndarray) -> float:
    """Seconds for one T=1 step the straightforward way: decode each of the K routed experts
    with the format's numpy decoder, then float32 matmuls."""
    cls = get_format(fmt_name)
    t0 = time.perf_counter()
    out = np.zeros(H, np.float32)
    for _ in range(K):
        W = cls.decode(rows, H, I, options)
        g = W["gate"].astype(np.float32) @ x
        u = W["up"].astype(np.float32) @ x
        h = ACT.apply(g, u).astype(np.float32)
        out += W["down"].astype(np.float32) @ h
    return time.perf_counter() - t0


def torch_bf16_step(eb: ExpertBanks, x: np.ndarray, threads: int, rng, reps: int = 20) -> float:
    import torch

    torch.set_num_threads(threads)
    gu = torch.from_numpy(eb.banks["gate_up"][0]).view(torch.bfloat16)
    dn = torch.from_numpy(eb.banks["down"][0]).view(torch.bfloat16)
    xt = torch.from_numpy(x).to(torch.bfloat16)[None]
    walk = rng.permutation(E)
    times = []
    for r in range(reps):
        ids = walk[(r * K + np.arange(K)) % E]
        t0 = time.perf_counter()
        out = torch.zeros(1, H, dtype=torch.float32)
        for e in ids:
            y = xt @ gu[e].T
            g, u = y[:, :I].float(), y[:, I:].float()
            g = torch.clamp(g, max=10.0)
            u = torch.clamp(u, -10.0, 10.0)
            h = (torch.nn.functional.silu(g) * u).to(torch.bfloat16)
            out += (h @ dn[e].T).float()
        times.append(time.perf_counter() - t0)
    return float(np.median(times[2:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seconds", type=float, default=1.5, help="time budget per measurement")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    llc = llc_bytes()
    probe = np.ones(max(2 * llc, 1 << 30), np.uint8)
    bws = {n: read_bandwidth(probe, n) for n in sorted({1, args.threads})}
    del probe
    bw = {n: v[0] for n, v in bws.items()}
    bw1_cpu = bws[1][1]
    print(f"LLC {llc / 2**20:.0f} MiB; read bandwidth: " + ", ".join(f"{n} thread(s) {v / 1e9:.2f} GB/s" for n, v in bw.items())
          + f"; 1 thread per CPU second {bw1_cpu / 1e9:.2f} GB/s")
    rows_out = []
    for key in args.formats.split(","):
        name, options = FORMATS[key]
        probe_banks, _ = build(name, options, 1, rng)
        per_expert = expert_bytes(probe_banks)
        del probe_banks
        layers = max(1, -(-2 * llc // (per_expert * E)))
        eb, rows = build(name, options, layers, rng)
        x = rng.standard_normal(H).astype(np.float32)
        res = {"format": key, "expert_MiB": per_expert / 2**20, "layers": layers}
        for threads in sorted({args.threads, 1}):
            ex = CpuMoeExecutor(eb, threads=threads)
            for T in (1, 32):
                dt, cpu, distinct = time_steps(ex, layers, T, rng, args.seconds)
                gbs = distinct * per_expert / dt
                res[f"T{T}_t{threads}_ms"] = dt * 1e3
                res[f"T{T}_t{threads}_GBps"] = gbs / 1e9
                res[f"T{T}_t{threads}_vs_bw"] = gbs / bw[threads]
                if threads == 1:
                    res[f"T{T}_t1_cpu_ms"] = cpu * 1e3
                    res[f"T{T}_t1_cpu_vs_bw"] = distinct * per_expert / cpu / bw1_cpu
        t1 = res[f"T1_t{args.threads}_ms"] / 1e3
        if name == "bf16":
            ref = torch_bf16_step(eb, x, args.threads, rng)
            res["baseline"] = "torch bf16 matmul"
        else:
            ref = min(numpy_reference_step(name, options, rows, x) for _ in range(2))
            res["baseline"] = "numpy decode + f32 matmul"
        res["baseline_ms"] = ref * 1e3
        res["speedup_vs_baseline"] = ref / t1
        rows_out.append(res)
        del eb
        print(f"{key:9s} expert {res['expert_MiB']:.2f} MiB x{layers} layers | "
              f"T=1 {args.threads}t {res[f'T1_t{args.threads}_ms']:.2f} ms {res[f'T1_t{args.threads}_GBps']:.2f} GB/s "
              f"= {res[f'T1_t{args.threads}_vs_bw']:.2f}x bw | T=1 1t {res['T1_t1_GBps']:.2f} GB/s = {res['T1_t1_vs_bw']:.2f}x "
              f"(CPU time {res['T1_t1_cpu_vs_bw']:.2f}x) | "
              f"T=32 {res[f'T32_t{args.threads}_ms']:.1f} ms {res[f'T32_t{args.threads}_GBps']:.2f} GB/s "
              f"(1 thread: {res['T32_t1_cpu_ms']:.0f} ms CPU, {res['T32_t1_cpu_vs_bw']:.2f}x) | "
              f"{res['baseline']} {ref * 1e3:.1f} ms: {res['speedup_vs_baseline']:.1f}x", flush=True)
    if args.json:
        print(json.dumps({"read_bandwidth_GBps": {str(k): v / 1e9 for k, v in bw.items()},
                          "read_bandwidth_1t_per_cpu_second_GBps": bw1_cpu / 1e9, "llc_bytes": llc,
                          "results": rows_out}, indent=2))


if __name__ == "__main__":
    main()
