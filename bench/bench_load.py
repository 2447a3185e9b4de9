"""load_expert_banks vs a raw sequential read of the same FTW file, and vs safetensors.

    python bench/bench_load.py [--size-gib 4] [--json]

Uses (or makes) the synthetic checkpoint and FTW files of bench_convert.py. Page cache warm.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_convert import ensure_checkpoint  # noqa: E402
from common import GiB, raw_read, report, timed, warm  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gib", type=float, default=4.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    src = ensure_checkpoint(args.size_gib)
    from ftw import load_expert_banks
    from writers.convert import convert

    dst, zdst = src + ".ftw", src + ".zstd.ftw"
    if not os.path.exists(dst):
        convert(src, dst, force=True)
    if not os.path.exists(zdst):
        convert(src, zdst, force=True, compress_level=3)
    warm([dst])
    raw_s = raw_read([dst])
    size = os.path.getsize(dst)
    load_s, eb = timed(load_expert_banks, dst, threads=args.threads)
    expert_nbytes = eb.nbytes
    del eb
    pin_s, eb = timed(load_expert_banks, dst, pin=True, threads=args.threads)
    pinned = eb.pinned
    del eb
    warm([zdst])
    z_s, eb = timed(load_expert_banks, zdst, threads=args.threads)
    del eb

    # the same experts through safetensors, one safe_open per shard and get_tensor per tensor
    from safetensors import safe_open

    shards = sorted(os.path.join(src, f) for f in os.listdir(src) if f.endswith(".safetensors"))
    warm(shards)
    t = time.perf_counter()
    got = 0
    for s in shards:
        with safe_open(s, framework="pt") as f:
            for k in f.keys():
                if ".experts." in k and not k.endswith("input_scale"):
                    got += f.get_tensor(k).nbytes
    st_s = time.perf_counter() - t
    rows = [
        ("FTW file", f"{size / GiB:.2f} GiB", f"experts {expert_nbytes / GiB:.2f} GiB"),
        ("raw sequential read", f"{raw_s:.2f} s", f"{size / raw_s / GiB:.2f} GiB/s (baseline)"),
        ("load_expert_banks", f"{load_s:.2f} s",
         f"{expert_nbytes / load_s / GiB:.2f} GiB/s = {(expert_nbytes / load_s) / (size / raw_s):.2f}x raw read (goal >= 0.85x)"),
        (f"load_expert_banks pin=True ({'pinned' if pinned else 'no CUDA: torch, unpinned'})", f"{pin_s:.2f} s",
         f"{(expert_nbytes / pin_s) / (size / raw_s):.2f}x raw read"),
        ("load_expert_banks, zstd file", f"{z_s:.2f} s", f"{z_s / load_s:.2f}x the raw FTW's load time"),
        ("safetensors safe_open/get_tensor", f"{st_s:.2f} s",
         f"{got / GiB:.2f} GiB; load_expert_banks is {st_s / load_s:.2f}x faster"),
    ]
    report(rows, args.json, {"command": "python bench/bench_load.py " + " ".join(sys.argv[1:])})


if __name__ == "__main__":
    main()
