"""ggml row dot products (csrc/formats/gguf/ggml_types.*), one thread, against memory bandwidth.

For each type: a bank of rows (n=2048 values each, H of a Qwen3-30B-A3B-sized expert) bigger
than the last-level cache, built by tiling rows that ggml's own quantizer wrote; one float32 x
against every row (decode, T=1) through ftw._runtime.ggml_matmul. Measured in the same run:
- the machine's single-thread read bandwidth: numpy's float32 sum over a buffer of the same size
  (the streaming ceiling a memory-bound dot could reach);
- the straightforward reference for the same rows: gguf.quants.dequantize (numpy) then a float32
  matvec, dequantization timed (on a slice, per byte).
Best of --rounds each, kernel and baselines alternated. Times are this thread's CPU time by
default (--clock cpu): on a shared machine a compute-bound kernel loses whole time slices that a
wall clock would charge to it; --clock wall for an idle machine.

    .venv/bin/python bench/bench_ggml_dot.py [--mib 1024] [--rounds 3] [--types Q4_K,Q8_0]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ftw import _runtime  # noqa: E402
from samples.ggml_quant import quantize  # noqa: E402

N = 2048
DISTINCT = 256  # rows quantized by ggml, then tiled to the bank size


def bank(name: str, nbytes: int, rng) -> np.ndarray:
    w = rng.standard_normal((DISTINCT, N)).astype(np.float32)
    if name == "F32":
        rows = w.view(np.uint8)
    elif name == "F16":
        rows = w.astype(np.float16).view(np.uint8)
    elif name == "BF16":
        rows = (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    else:
        rows = quantize(w, name)
    reps = max(1, nbytes // rows.nbytes)
    return np.ascontiguousarray(np.tile(rows, (reps, 1)))


CLOCK = time.thread_time


def best(fn, rounds: int) -> float:
    t = float("inf")
    for _ in range(rounds):
        t0 = CLOCK()
        fn()
        t = min(t, CLOCK() - t0)
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024, help="bank size per type (beyond the LLC)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--types", default=",".join(t for t in _runtime.ggml_types() if t != "F32"))
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args()
    global CLOCK
    CLOCK = time.thread_time if a.clock == "cpu" else time.perf_counter
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, N)).astype(np.float32)
    flat = np.ones(a.mib << 18, dtype=np.float32)  # a.mib MiB
    rows_out = []
    for name in a.types.split(","):
        rows = bank(name, a.mib << 20, rng)
        ref_rows = rows[: max(1, (8 << 20) // rows.shape[1])]  # 8 MiB slice for the numpy reference
        _runtime.ggml_matmul(name, rows[:64], x)  # warm
        t_kernel = t_read = float("inf")
        for _ in range(a.rounds):  # alternate kernel and ceiling
            t_kernel = min(t_kernel, best(lambda: _runtime.ggml_matmul(name, rows, x), 1))
            t_read = min(t_read, best(lambda: flat.sum(), 1))
        t_ref = best(lambda: dequantize(ref_rows, Q[name]).reshape(-1, N) @ x[0], a.rounds)
        kernel = rows.nbytes / t_kernel / 1e9
        read = flat.nbytes / t_read / 1e9
        ref = ref_rows.nbytes / t_ref / 1e9
        r = {"type": name, "bank_mib": rows.nbytes >> 20, "kernel_gbs": round(kernel, 2),
             "read_gbs": round(read, 2), "kernel_over_read": round(kernel / read, 2),
             "numpy_ref_gbs": round(ref, 3), "kernel_over_ref": round(kernel / ref, 1),
             "gvalues_s": round(rows.shape[0] * N / t_kernel / 1e9, 2)}
        rows_out.append(r)
        if not a.json:
            print(f"{name:8s} kernel {kernel:6.2f} GB/s ({r['gvalues_s']:5.2f} Gvalues/s)  read {read:6.2f} GB/s "
                  f"-> {r['kernel_over_read']:.2f}x   numpy dequant+matvec {ref:6.3f} GB/s -> {r['kernel_over_ref']:.0f}x",
                  flush=True)
        del rows
    if a.json:
        print(json.dumps({"simd": _runtime.ggml_simd_level(), "rows": rows_out}, indent=1))


if __name__ == "__main__":
    main()
