"""`ftw convert` against `cp -r` + `sync` of the same source, per source layout, whole processes.

    .venv/bin/python bench/bench_convert.py [--layout per_expert --layout gguf ...] [--rounds 5]
                                            [--size-gib 3.2] [--keep] [--json]

Layouts (bench/synthetic.py makes each once under bench/_data, >= --size-gib):
  per_expert    qwen3_moe bf16, one tensor per expert: H=1024, I=512, E=32 (1 MiB tensors)
                AND H=2048, I=768, E=64 (3 MiB tensors): two rows
  stacked       the same model as transformers 5's fused [E, 2I, H] / [E, H, I] tensors
  nvfp4         ModelOpt NVFP4 per-expert, first and last MoE layers bf16
  gguf          Q4_K_M-style qwen3moe GGUF (gate/up Q4_K, down Q6_K), H=2048, I=768, E=128
  gpt_oss_bf16  gpt-oss bf16: [E, H, 2I] gate/up interleaved + biases: transposed, not copied

Per layout: the source is read once (page cache warm), then --rounds rounds, each running
`cp -r SRC DST && sync` and `python -m ftw.cli convert SRC DST.ftw && sync` (run through runpy, to report its own peak RSS) in their own
processes, one after the other (interleaved, so a noisy neighbour hits both alike); what
either wrote is deleted and synced away before the next timing. Printed: the median of the
per-round ratios convert/cp, the median wall of each, user+sys CPU of each (median), and the
converter's peak RSS against its largest layer's banks + a fixed 512 MiB window.

The fixed cost: the same `ftw convert` of the smallest bundled sample against
`python -c "import numpy, click"`, interleaved, median of the per-round ratios (goal <= 2x).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import DATA, ROOT, GiB, folder_nbytes, warm  # noqa: E402

WORK = DATA  # where sources and outputs go (--data): the same disk as the repo by default
from synthetic import make_checkpoint, make_layout  # noqa: E402

# case -> (layout, H, I, E, goal)
CASES = {
    "per_expert": [("per_expert_h1024", "per_expert", 1024, 512, 32, 1.3),
                   ("per_expert_h2048", "per_expert", 2048, 768, 64, 1.3)],
    "stacked": [("stacked", "stacked", 2048, 768, 64, 1.3)],
    "nvfp4": [("nvfp4", "nvfp4", 2048, 768, 64, 1.3)],
    "gguf": [("gguf", "gguf", 2048, 768, 128, 1.3)],
    "gpt_oss_bf16": [("gpt_oss_bf16", "gpt_oss_bf16", 2048, 768, 32, 2.0)],
}
WINDOW = 512 << 20  # the fixed part of the peak-RSS bound
# `ftw convert` as `python -m ftw.cli` runs it, reporting its own peak RSS when it exits: wait4's
# figure for a child includes the pages of this process that the child shared before its exec
CLI = ("import atexit, os, runpy, sys\n"
       "atexit.register(lambda: os.write(2, ('VmHWM ' + [l.split()[1] for l in open('/proc/self/status')"
       " if l.startswith('VmHWM')][0] + '\\n').encode()))\n"
       "sys.argv[0] = 'ftw'\n"
       "runpy.run_module('ftw.cli', run_name='__main__', alter_sys=True)\n")


def ensure_checkpoint(size_gib: float) -> str:
    """The mixed NVFP4 checkpoint bench_load.py reads (its FTW is this path + '.ftw')."""
    src = os.path.join(DATA, f"mixed-{size_gib:g}g")
    if not os.path.exists(os.path.join(src, "config.json")):
        shutil.rmtree(src, ignore_errors=True)
        print(f"making {src} ...", file=sys.stderr)
        make_layout(src, "nvfp4", size_gib=size_gib, hidden=2048, inter=768, experts=64)
    return src


def run(argv: list[str], cwd: str = ROOT) -> dict:
    """One process: wall seconds, user+sys CPU and peak RSS of it and its children (wait4)."""
    t = time.perf_counter()
    p = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.read().decode()[-2000:]}")
    hwm = [l.split()[1] for l in p.stderr.read().decode().splitlines() if l.startswith("VmHWM ")]
    p.stderr.close()
    return {"wall": wall, "user": ru.ru_utime, "sys": ru.ru_stime, "rss": int(hwm[-1]) * 1024 if hwm else None}


def remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)
    os.sync()  # freeing a file's dirty pages is not part of the next timing


def source_of(case: tuple, size_gib: float) -> tuple[str, str]:
    """(folder to cp, path to convert): a GGUF converts from its file, cp copies its folder."""
    name, layout, H, I, E, _ = case
    src = os.path.join(WORK, f"bench-{name}-{size_gib:g}g")
    marker = os.path.join(src, ".complete")
    if not os.path.exists(marker):
        shutil.rmtree(src, ignore_errors=True)
        print(f"making {src} ...", file=sys.stderr)
        # in a child: the generator's pools would otherwise be in this process when it forks
        # the timed ones, and wait4 counts a child's pages from before its exec
        code = ("import json, sys; from synthetic import make_layout; "
                f"json.dump(make_layout({src!r}, {layout!r}, size_gib={size_gib}, hidden={H}, inter={I}, "
                f"experts={E}), open({marker!r}, 'w'))")
        subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(os.path.abspath(__file__)), check=True)
    with open(marker) as f:
        made = json.load(f)
    return src, made.get("path", src)


def largest_layer(path: str) -> int:
    code = ("import ftw, sys\nwith ftw.open(sys.argv[1]) as f:\n"
            " print(max(sum(b.raw_nbytes for b in banks.values()) for banks in f.layers.values()))")
    return int(subprocess.run([sys.executable, "-c", code, path], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout)


def bench_case(case: tuple, args) -> dict:
    name, layout, H, I, E, goal = case
    folder, src = source_of(case, args.size_gib)
    files = [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs]
    src_nbytes = folder_nbytes(folder)
    warm(files)
    cp_dst, ftw_dst = os.path.join(WORK, "bench-cp"), os.path.join(WORK, "bench-out.ftw")
    convert = [sys.executable, "-c", CLI, "convert", src, ftw_dst]
    rounds = []
    for _ in range(args.rounds):
        remove(cp_dst)
        c = run(["sh", "-c", 'cp -r "$0" "$1" && sync', folder, cp_dst])
        remove(cp_dst)
        remove(ftw_dst)
        t = run(["sh", "-c", '"$0" "$@" && sync', *convert])
        rounds.append((c, t))
        print(f"  {name}: cp {c['wall']:.2f} s, convert {t['wall']:.2f} s", file=sys.stderr)
    largest = largest_layer(ftw_dst)
    remove(ftw_dst)
    if not args.keep:
        shutil.rmtree(folder)
    med = lambda xs: statistics.median(xs)  # noqa: E731
    ratios = [t["wall"] / c["wall"] for c, t in rounds]
    return {
        "case": name, "layout": layout, "H": H, "I": I, "E": E, "source_nbytes": src_nbytes,
        "cp_wall": med([c["wall"] for c, _ in rounds]), "convert_wall": med([t["wall"] for _, t in rounds]),
        "ratios": ratios, "median_ratio": med(ratios), "goal": goal,
        "cp_cpu": med([c["user"] + c["sys"] for c, _ in rounds]),
        "cp_user": med([c["user"] for c, _ in rounds]), "cp_sys": med([c["sys"] for c, _ in rounds]),
        "convert_user": med([t["user"] for _, t in rounds]), "convert_sys": med([t["sys"] for _, t in rounds]),
        "convert_rss": max(t["rss"] for _, t in rounds), "rss_limit": largest + WINDOW, "largest_layer": largest,
    }


def smallest_sample() -> str:
    root = os.path.join(ROOT, "samples", "st")
    names = [n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n, "config.json"))]
    return os.path.join(root, min(names, key=lambda n: folder_nbytes(os.path.join(root, n))))


def bench_fixed(args) -> dict:
    sample = smallest_sample()
    dst = os.path.join(WORK, "bench-fixed.ftw")
    rounds = []
    for _ in range(args.fixed_rounds):
        base = run([sys.executable, "-c", "import numpy, click"])
        remove(dst)
        t = run([sys.executable, "-c", CLI, "convert", sample, dst])
        rounds.append((base, t))
    remove(dst)
    ratios = [t["wall"] / b["wall"] for b, t in rounds]
    return {"case": "fixed cost", "sample": os.path.basename(sample), "sample_nbytes": folder_nbytes(sample),
            "baseline_wall": statistics.median(b["wall"] for b, _ in rounds),
            "convert_wall": statistics.median(t["wall"] for _, t in rounds),
            "ratios": ratios, "median_ratio": statistics.median(ratios), "goal": 2.0}


def table(results: list[dict], fixed: dict | None) -> str:
    lines = ["| layout | source | cp -r + sync: wall, user+sys | ftw convert + sync: wall, user+sys | "
             "median of per-round ratios (rounds) | goal | convert peak RSS (limit) |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        ok = "met" if r["median_ratio"] <= r["goal"] else f"missed by {r['median_ratio'] / r['goal'] - 1:.0%}"
        rss_ok = "" if r["convert_rss"] <= r["rss_limit"] else " OVER"
        src = f"{r['source_nbytes'] / GiB:.2f} GiB, H={r['H']} I={r['I']} E={r['E']}"
        lines.append(
            f"| {r['case']} | {src} | {r['cp_wall']:.2f} s, {r['cp_user']:.2f}+{r['cp_sys']:.2f} s | "
            f"{r['convert_wall']:.2f} s, {r['convert_user']:.2f}+{r['convert_sys']:.2f} s | "
            f"**{r['median_ratio']:.2f}x** ({' '.join(f'{x:.2f}' for x in r['ratios'])}) | <= {r['goal']}x {ok} | "
            f"{r['convert_rss'] / 2**20:.0f} MiB ({r['rss_limit'] / 2**20:.0f} MiB){rss_ok} |")
    if fixed:
        ok = "met" if fixed["median_ratio"] <= fixed["goal"] else f"missed by {fixed['median_ratio'] / fixed['goal'] - 1:.0%}"
        lines.append(
            f"| fixed cost: `convert` of {fixed['sample']} ({fixed['sample_nbytes'] / 1024:.0f} KiB) | | "
            f"`python -c \"import numpy, click\"` {fixed['baseline_wall']:.3f} s | {fixed['convert_wall']:.3f} s | "
            f"**{fixed['median_ratio']:.2f}x** ({' '.join(f'{x:.2f}' for x in fixed['ratios'])}) | <= 2x {ok} | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", action="append", choices=list(CASES), help="repeatable; default: all")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--fixed-rounds", type=int, default=7)
    ap.add_argument("--no-fixed", action="store_true", help="skip the fixed-cost measurement")
    ap.add_argument("--size-gib", type=float, default=3.2, help="each source is at least this big")
    ap.add_argument("--keep", action="store_true", help="keep the generated sources under bench/_data")
    ap.add_argument("--data", default=DATA, help="folder for the sources and outputs (default bench/_data)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    global WORK
    WORK = args.data
    os.makedirs(WORK, exist_ok=True)
    results = []
    for layout in args.layout or list(CASES):
        for case in CASES[layout]:
            results.append(bench_case(case, args))
            print(json.dumps(results[-1]), file=sys.stderr)  # a crash later loses nothing
    fixed = None if args.no_fixed else bench_fixed(args)
    command = "python bench/bench_convert.py " + " ".join(sys.argv[1:])
    if args.json:
        print(json.dumps({"command": command, "results": results, "fixed": fixed}, indent=2))
    else:
        print(f"command: {command}\n")
        print(table(results, fixed))


if __name__ == "__main__":
    main()
