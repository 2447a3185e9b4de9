"""The main job on every bundled sample: convert, check, and one table a newcomer can read.

    python scripts/demo.py [--out out] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def samples() -> list[tuple[str, str]]:
    """(name, source path) of every bundled sample: safetensors folders, then GGUF files."""
    out = []
    with open(os.path.join(ROOT, "samples", "manifest.json")) as f:
        for name, s in sorted(json.load(f)["samples"].items()):
            out.append((name, os.path.join(ROOT, "samples", s["path"])))
    with open(os.path.join(ROOT, "samples", "gguf", "manifest.json")) as f:
        for name, s in sorted(json.load(f)["samples"].items()):
            out.append((name.removesuffix(".gguf"), os.path.join(ROOT, "samples", "gguf", s["files"][0])))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "out"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--runtime", choices=["none", "cpu", "cuda", "auto"], default="cpu",
                    help="runtime the random tokens go through (cuda: the GPU slot pools and kernels)")
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ftw.cli import human
    from ftw.check import check
    from ftw.readers import open_checkpoint
    from ftw.errors import FtwError
    from ftw.layer_ranges import format_layers
    from ftw.writers.convert import convert

    os.makedirs(args.out, exist_ok=True)
    rows = []
    for name, src in samples():
        dst = os.path.join(args.out, name + ".ftw")
        t = time.perf_counter()
        try:
            plan = convert(src, dst, force=True)
            with open_checkpoint(src) as reader:
                report = check(reader, dst, runtime=args.runtime)
            groups: dict[str, list[int]] = {}
            for lb in plan.layers:
                groups.setdefault(lb.format.key(), []).append(lb.layer)
            rows.append({
                "sample": name, "reader": plan.reader,
                "formats": "; ".join(f"{k} [{format_layers(v)}]" for k, v in groups.items()),
                "source_nbytes": sum(os.path.getsize(p) for p in plan.source_files),
                "ftw_nbytes": os.path.getsize(dst),
                "bytes_compared": sum(r.bytes_compared for r in report.layers.values()) + report.tensor_bytes_compared,
                # None when no layer ran on the runtime (affine on cuda): no error to report
                "runtime_rel_err": max((r.runtime["max_rel_err"] for r in report.layers.values()
                                        if r.runtime and r.runtime.get("run")), default=None),
                "not_run": sum(1 for r in report.layers.values() if r.runtime and not r.runtime.get("run")),
                "ok": report.ok, "problem": "" if report.ok else report.all_problems()[0],
                "seconds": time.perf_counter() - t,
            })
        except FtwError as e:
            rows.append({"sample": name, "reader": "", "formats": "", "source_nbytes": 0, "ftw_nbytes": 0,
                         "bytes_compared": 0, "ok": False, "problem": str(e), "seconds": time.perf_counter() - t})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        console = Console(width=200) if not sys.stdout.isatty() else Console()
        t = Table(title="Every bundled sample: converted to FTW, then checked against its source", title_justify="left")
        rt = f"{args.runtime} rel err"
        for c in ("sample", "reader", "layer formats [layers]", "source", "ftw", "bit-exact bytes", rt, "check"):
            t.add_column(c, justify="right" if c in ("source", "ftw", "bit-exact bytes", rt) else "left")
        for r in rows:
            t.add_row(r["sample"], r["reader"], r["formats"], human(r["source_nbytes"]), human(r["ftw_nbytes"]),
                      human(r["bytes_compared"]),
                      ("-" if r.get("runtime_rel_err") is None else f"{r['runtime_rel_err']:.1e}")
                      + (f" ({r['not_run']} layers not run)" if r.get("not_run") else ""),
                      "[green]ok[/]" if r["ok"] else f"[red]{escape(r['problem'])}[/]")
        console.print(t)
        good = sum(r["ok"] for r in rows)
        console.print(f"{good}/{len(rows)} samples round-trip: the whole file equal to what converting the source "
                      f"gives, experts decoded from the file equal to the source's own tensors, and random tokens "
                      f"through the {args.runtime} runtime within its tolerance of a float64 MoE from the source "
                      f"(layers it has no kernel for are counted as not run). FTW files are in {args.out}/")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
