"""Shared bits of the benchmark scripts: data folder, timing, raw baselines, output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "bench", "_data")  # git-ignored; on the same disk as the repo
GiB = 1 << 30


def timed(fn, *a, **kw):
    t = time.perf_counter()
    r = fn(*a, **kw)
    return time.perf_counter() - t, r


def folder_nbytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def fsync_tree(path: str) -> None:
    files = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def cp_baseline(src: str, dst: str) -> float:
    """`cp -r` to the same disk, then fsync what it wrote (the writer fsyncs too)."""
    shutil.rmtree(dst, ignore_errors=True) if os.path.isdir(dst) else (os.path.exists(dst) and os.remove(dst))
    t = time.perf_counter()
    subprocess.run(["cp", "-r", src, dst], check=True)
    fsync_tree(dst)
    return time.perf_counter() - t


def raw_read(paths: list[str], chunk: int = 64 << 20, keep: bool = True) -> float:
    """Sequential read() of whole files (page cache warm), single thread.

    keep=True reads into fresh 64 MiB buffers and keeps them, as a load must keep its bytes.
    (One giant buffer is slower here: its first-touch faults ran at 0.4-1.1 GB/s on this
    sandbox, against 1.7-2.6 GB/s for 64 MiB buffers.) keep=False reuses one buffer: the
    pure copy rate, a stricter ceiling that no load which keeps its data can reach."""
    t = time.perf_counter()
    kept = []
    reused = np.empty(chunk, dtype=np.uint8)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while True:
                buf = np.empty(chunk, dtype=np.uint8) if keep else reused
                n = f.readinto(buf)
                if not n:
                    break
                if keep:
                    kept.append(buf)
    return time.perf_counter() - t


def evict(paths: list[str]) -> None:
    """Drop files from the page cache, so phases of a benchmark don't crowd each other out
    of a 24 GiB machine (posix_fadvise DONTNEED)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def warm(paths: list[str]) -> None:
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.read(64 << 20):
                pass


def run_child(code: str) -> tuple[float, int]:
    """Run python code in a child; returns (seconds, the child's peak RSS in bytes).

    The child reports its own VmHWM: wait4's ru_maxrss would count the parent's pages that
    the fork shared before exec, and this parent holds the benchmark's data."""
    report = "\nprint('VmHWM', [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])"
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code + report], cwd=ROOT, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}): {proc.stderr[-2000:]}")
    hwm = [l for l in proc.stdout.splitlines() if l.startswith("VmHWM")][-1]
    return dt, int(hwm.split()[1]) * 1024


def report(rows: list[tuple[str, str, str]], as_json: bool, extra: dict | None = None) -> None:
    if as_json:
        print(json.dumps({"rows": [dict(zip(("figure", "value", "vs baseline"), r)) for r in rows], **(extra or {})}, indent=2))
        return
    w = max(len(r[0]) for r in rows)
    for name, value, ratio in rows:
        print(f"{name:<{w}}  {value:>16}  {ratio}")
