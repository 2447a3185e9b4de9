"""Convert a >= 4 GiB synthetic mixed checkpoint and compare with `cp -r` of its folder.

    python bench/bench_convert.py [--size-gib 4] [--keep] [--json]

Prints: convert time vs cp -r + fsync to the same disk (goal <= 1.3x), the converter's peak
RSS vs its largest layer's banks + 512 MiB, and --compress zstd's size ratio and time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import DATA, GiB, cp_baseline, folder_nbytes, report, run_child, warm  # noqa: E402
from synthetic import make_checkpoint  # noqa: E402

# bf16 layer: 3*I*H*2*E bytes; nvfp4 layer: about 3*I*H*(1/2 + 1/16)*E
SHAPE = dict(experts=64, hidden=2048, inter=768)


def layers_for(size_gib: float) -> int:
    E, H, I = SHAPE["experts"], SHAPE["hidden"], SHAPE["inter"]
    bf16, nvfp4 = 6 * I * H * E, 3 * I * H * E * 9 / 16
    return max(3, int((size_gib * GiB - 2 * bf16) / nvfp4) + 3)


def ensure_checkpoint(size_gib: float) -> str:
    src = os.path.join(DATA, f"mixed-{size_gib:g}g")
    if not os.path.exists(os.path.join(src, "config.json")):
        shutil.rmtree(src, ignore_errors=True)
        print(f"making {src} ...", file=sys.stderr)
        make_checkpoint(src, layers=layers_for(size_gib), **SHAPE)
    return src


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gib", type=float, default=4.0)
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint and FTW files (bench_load uses them)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N for each timing (the machine is shared)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    src = ensure_checkpoint(args.size_gib)
    src_nbytes = folder_nbytes(src)
    shards = sorted(os.path.join(src, f) for f in os.listdir(src) if f.endswith(".safetensors"))
    warm(shards)
    dst = src + ".ftw"
    code = f"from writers.convert import convert; convert({src!r}, {dst!r}, force=True)"
    rounds, conv_rss = [], 0
    for _ in range(args.repeat):  # interleaved, so a noisy neighbour hits both alike
        c = cp_baseline(src, src + ".cp")
        shutil.rmtree(src + ".cp")
        t, rss = run_child(code)
        rounds.append((c, t))
        conv_rss = max(conv_rss, rss)
    cp_s, conv_s = min(c for c, _ in rounds), min(t for _, t in rounds)
    paired = sorted(t / c for c, t in rounds)
    median = paired[len(paired) // 2]
    dst_nbytes = os.path.getsize(dst)

    import ftw

    with ftw.open(dst) as f:
        largest = max(sum(b.raw_nbytes for b in banks.values()) for banks in f.layers.values())
    zdst = src + ".zstd.ftw"
    z_s, z_rss = run_child(f"from writers.convert import convert; convert({src!r}, {zdst!r}, force=True, compress_level=3)")
    with ftw.open(zdst) as f:
        expert_raw = sum(b.raw_nbytes for banks in f.layers.values() for b in banks.values())
        expert_stored = sum(b.blob.nbytes for banks in f.layers.values() for b in banks.values())
        by_codec: dict[str, list[int]] = {}
        for banks in f.layers.values():
            for b in banks.values():
                key = f"{b.dtype}/{b.codec}"
                by_codec.setdefault(key, [0, 0])
                by_codec[key][0] += b.raw_nbytes
                by_codec[key][1] += b.blob.nbytes
    rows = [
        ("source checkpoint", f"{src_nbytes / GiB:.2f} GiB", f"{len(shards)} shards"),
        ("cp -r + fsync (best of N)", f"{cp_s:.2f} s", f"{src_nbytes / cp_s / GiB:.2f} GiB/s (baseline)"),
        ("ftw convert (best of N)", f"{conv_s:.2f} s", f"{conv_s / cp_s:.2f}x cp time (goal <= 1.3x)"),
        ("  per round: cp / convert s", " ".join(f"{c:.1f}/{t:.1f}" for c, t in rounds),
         f"median paired ratio {median:.2f}x"),
        ("convert peak RSS", f"{conv_rss / 2**20:.0f} MiB",
         f"limit {(largest + 512 * 2**20) / 2**20:.0f} MiB = largest layer {largest / 2**20:.0f} MiB + 512 MiB"),
        ("ftw file", f"{dst_nbytes / GiB:.2f} GiB", f"{dst_nbytes / src_nbytes:.3f}x source size"),
        ("convert --compress zstd:3", f"{z_s:.2f} s", f"{z_s / cp_s:.2f}x cp time, peak RSS {z_rss / 2**20:.0f} MiB"),
        ("zstd expert bytes", f"{expert_stored / GiB:.2f} GiB", f"ratio {expert_raw / expert_stored:.3f} (raw/stored)"),
    ]
    for key, (raw, stored) in sorted(by_codec.items()):
        rows.append((f"  {key}", f"{stored / 2**20:.0f} MiB", f"ratio {raw / stored:.3f}"))
    report(rows, args.json, {"command": "python bench/bench_convert.py " + " ".join(sys.argv[1:])})
    if not args.keep:
        for p in (dst, zdst):
            os.remove(p)


if __name__ == "__main__":
    main()
