"""load_expert_banks vs a raw sequential read of the same FTW file, and vs safetensors.

    python bench/bench_load.py [--size-gib 4] [--rounds 3] [--json]

Uses (or makes) the synthetic checkpoint and FTW files of bench_convert.py. Page cache warm.
Every variant ends with the bytes in memory the process owns, except the two marked "views"
(memory-mapped, nothing copied until touched). Rounds are interleaved; best of N is shown,
and for the main figure also the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_convert import ensure_checkpoint  # noqa: E402
from common import GiB, evict, raw_read, report, warm  # noqa: E402


def timed(fn) -> float:
    gc.collect()
    t = time.perf_counter()
    r = fn()
    dt = time.perf_counter() - t
    del r
    gc.collect()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gib", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    src = ensure_checkpoint(args.size_gib)
    import ftw
    from ftw import load_expert_banks
    from ftw.writers.convert import convert

    dst, zdst = src + ".ftw", src + ".zstd.ftw"
    if not os.path.exists(dst):
        convert(src, dst, force=True)
    if not os.path.exists(zdst):
        convert(src, zdst, force=True, compress_level=3)
    shards = sorted(os.path.join(src, f) for f in os.listdir(src) if f.endswith(".safetensors"))
    size = os.path.getsize(dst)
    with ftw.open(dst) as f:
        expert_nbytes = sum(b.raw_nbytes for banks in f.layers.values() for b in banks.values())

    from safetensors import safe_open

    def st_views():
        out = []
        for s in shards:
            with safe_open(s, framework="pt") as f:
                out += [f.get_tensor(k) for k in f.keys() if ".experts." in k and not k.endswith("input_scale")]
        return out

    def st_owned():
        return [t.clone() for t in st_views()]

    def ftw_views():
        with ftw.open(dst) as f:
            return [f.bank(l, n) for l in f.layers for n in f.layers[l]]

    # three phases, each with only its own files in the page cache (24 GiB machine)
    phases = [
        ([dst], {
            "raw": lambda: raw_read([dst]),
            "copy": lambda: raw_read([dst], keep=False),
            "load": lambda: load_expert_banks(dst, threads=args.threads),
            "pin": lambda: load_expert_banks(dst, pin=True, threads=args.threads),
            "ftw_views": ftw_views,
        }),
        ([zdst], {"zstd": lambda: load_expert_banks(zdst, threads=args.threads)}),
        (shards, {"st_owned": st_owned, "st_views": st_views}),
    ]
    times: dict[str, list[float]] = {}
    for files, variants in phases:
        evict([dst, zdst, *shards])
        warm(files)
        for _ in range(args.rounds):
            for name, fn in variants.items():
                times.setdefault(name, []).append(timed(fn))
    best = {k: min(v) for k, v in times.items()}
    paired = sorted((size / r) and (expert_nbytes / l) / (size / r) for r, l in zip(times["raw"], times["load"]))
    rate = lambda n, s: f"{n / s / GiB:.2f} GiB/s"  # noqa: E731
    pinned = load_expert_banks(dst, layers=[min(ftw.open(dst).layers)], pin=True).pinned
    rows = [
        ("FTW file", f"{size / GiB:.2f} GiB", f"experts {expert_nbytes / GiB:.2f} GiB; {args.rounds} rounds, best of each"),
        ("raw sequential read, kept", f"{best['raw']:.2f} s", f"{rate(size, best['raw'])} (baseline)"),
        ("raw sequential read into one reused buffer", f"{best['copy']:.2f} s",
         f"{rate(size, best['copy'])} (pure copy ceiling; load_expert_banks at "
         f"{(expert_nbytes / best['load']) / (size / best['copy']):.2f}x of it)"),
        ("load_expert_banks", f"{best['load']:.2f} s",
         f"{rate(expert_nbytes, best['load'])} = {(expert_nbytes / best['load']) / (size / best['raw']):.2f}x raw read, "
         f"median paired {paired[len(paired) // 2]:.2f}x (goal >= 0.85x)"),
        (f"load_expert_banks pin=True ({'pinned' if pinned else 'no CUDA here: torch tensors, unpinned'})",
         f"{best['pin']:.2f} s", f"{(expert_nbytes / best['pin']) / (size / best['raw']):.2f}x raw read"),
        ("load_expert_banks, zstd:3 file", f"{best['zstd']:.2f} s", f"{best['zstd'] / best['load']:.2f}x the raw FTW's load time"),
        ("safetensors get_tensor + clone (owned)", f"{best['st_owned']:.2f} s",
         f"load_expert_banks takes {best['load'] / best['st_owned']:.2f}x its time"),
        ("safetensors get_tensor (views)", f"{best['st_views']:.3f} s", f"ftw.open + bank views: {best['ftw_views']:.3f} s"),
    ]
    report(rows, args.json, {"command": "python bench/bench_load.py " + " ".join(sys.argv[1:]), "times": times})


if __name__ == "__main__":
    main()
