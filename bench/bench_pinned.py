"""Pinned loading on a CUDA machine: which way of filling pinned host memory is fastest.

    python bench/bench_pinned.py [--size-gib 4] [--threads 8] [--json]

Writes a synthetic mixed FTW (bf16 + nvfp4-like banks), warms the page cache, then times,
against a raw sequential read of the file measured in the same run:
  - load_expert_banks(pin=True): pageable page-aligned buffers filled by N threads, then
    cudaHostRegister in place (the loader's way)
  - load_expert_banks() into pageable numpy (no pinning)
  - the previous way: torch.empty(pin_memory=True) (cudaHostAlloc) per bank, then the fill,
    cold and then again with torch's caching host allocator holding the freed blocks
and the host-to-device copy rate out of the loaded banks (pinned memory copies at ~55 GB/s
on an H200 host, pageable at ~8), which shows the banks really are pinned.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import GiB, raw_read, report, warm  # noqa: E402


def make_ftw(path: str, size_gib: float) -> None:
    from ftw.banks import BankSource, LayerBanks
    from ftw.formats import LayerFormat, ModelShape
    from ftw.writers import FtwWriter

    E, H, I = 64, 2048, 768
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 255, 64 << 20, dtype=np.uint8)

    def bank(dtype, row_shape, itemsize):
        n = int(np.prod(row_shape)) * itemsize
        return BankSource(dtype, row_shape, E, lambda e: [pool[(e * 4099) % (pool.size - n):][:n]])

    bf16 = {"gate_up": bank("bf16", (2 * I, H), 2), "down": bank("bf16", (H, I), 2)}
    nvfp4 = {"gate_up": bank("u8", (2 * I, H // 2), 1), "down": bank("u8", (H, I // 2), 1),
             "gate_up_scale": bank("f8_e4m3", (2 * I, H // 16), 1), "down_scale": bank("f8_e4m3", (H, I // 16), 1),
             "gate_up_global": bank("f32", (2 * I,), 4), "down_global": bank("f32", (H,), 4)}
    per_nvfp4 = sum(b.nbytes for b in nvfp4.values())
    per_bf16 = sum(b.nbytes for b in bf16.values())
    n_nvfp4 = max(1, int((size_gib * GiB - 2 * per_bf16) / per_nvfp4))
    layers = n_nvfp4 + 2
    with FtwWriter(path, force=True) as w:
        w.set_model(ModelShape("synthetic", H, I, E, 8, layers, list(range(layers))))
        for L in range(layers):
            is_bf16 = L in (0, layers - 1)
            w.add_layer(LayerBanks(L, LayerFormat.of("bf16" if is_bf16 else "nvfp4"), bf16 if is_bf16 else nvfp4))


def torch_pinned_load(path: str, threads: int) -> list:
    """The old loader's pinned path, kept here for comparison."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    import ftw

    out, tasks = [], []
    with ftw.open(path) as f, ThreadPoolExecutor(threads) as pool:
        for layer, banks in f.layers.items():
            for info in banks.values():
                t = torch.empty(info.raw_nbytes, dtype=torch.uint8, pin_memory=True)
                out.append(t)
                dst = t.numpy()
                for lo in range(0, info.raw_nbytes, 16 << 20):
                    hi = min(lo + (16 << 20), info.raw_nbytes)
                    tasks.append(pool.submit(f.read_into, info.blob.offset + lo, dst[lo:hi]))
        for t in tasks:
            t.result()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gib", type=float, default=4.0)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--data", default="/tmp/ftw-bench")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import torch

    from ftw import load_expert_banks

    os.makedirs(args.data, exist_ok=True)
    path = os.path.join(args.data, "pinned.ftw")
    make_ftw(path, args.size_gib)
    size = os.path.getsize(path)
    warm([path])
    raw_s = min(raw_read([path]) for _ in range(2))
    cuda = torch.cuda.is_available()
    if cuda:  # CUDA's start-up (seconds) must not land in the first variant's time
        torch.cuda.init()
        torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)

    def timed(fn):
        t = time.perf_counter()
        r = fn()
        return time.perf_counter() - t, r

    rows = [("FTW file", f"{size / GiB:.2f} GiB", f"CUDA: {torch.cuda.get_device_name() if cuda else 'none'}"),
            ("raw sequential read", f"{raw_s:.2f} s", f"{size / raw_s / GiB:.2f} GiB/s (baseline)")]

    def row(name, seconds, nbytes, extra=""):
        rows.append((name, f"{seconds:.2f} s", f"{nbytes / seconds / GiB:.2f} GiB/s = "
                     f"{(nbytes / seconds) / (size / raw_s):.2f}x raw read{extra}"))

    s, eb = timed(lambda: load_expert_banks(path, pin=True, threads=args.threads))
    nbytes = eb.nbytes
    row(f"load_expert_banks pin=True, {args.threads} threads (fill, then cudaHostRegister)", s, nbytes,
        f"; pinned={eb.pinned}")
    if cuda:
        t = eb.banks["gate_up"][1]
        dev = torch.empty(t.shape, dtype=t.dtype, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            dev.copy_(t, non_blocking=True)
        torch.cuda.synchronize()
        h2d = 10 * t.numel() * t.element_size() / (time.perf_counter() - t0)
        rows.append(("  H2D copy from a loaded bank", f"{h2d / 1e9:.1f} GB/s", f"is_pinned={t.is_pinned()}"))
    del eb
    s, eb = timed(lambda: load_expert_banks(path, threads=args.threads))
    row(f"load_expert_banks pageable numpy, {args.threads} threads", s, nbytes)
    del eb
    if cuda:
        # the previous way: torch's pinned allocator (cudaHostAlloc) per bank, then the fill;
        # the first run is cold, the second reuses the caching host allocator's freed blocks
        for label in ("cold", "warm: cached pinned blocks"):
            s, banks = timed(lambda: torch_pinned_load(path, args.threads))
            row(f"torch.empty(pin_memory=True) + {args.threads}-thread fill ({label})", s, nbytes)
            del banks
    report(rows, args.json, {"command": "python bench/bench_pinned.py " + " ".join(sys.argv[1:])})
    os.remove(path)


if __name__ == "__main__":
    main()
