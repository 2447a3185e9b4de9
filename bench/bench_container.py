"""Container benchmark: every figure is a ratio against a baseline measured in the same run.

    .venv/bin/python bench/bench_container.py --size-gib 4 [--keep] [--json]

Builds a ~SIZE GiB FTW of mixed banks (bf16, nvfp4-like u8 + e4m3 scales + f32 globals,
fp8-like e4m3 + f32 block scales) and a 100 MiB one in bench/_data/, then measures:
write vs `cp` of the same bytes to the same disk, open + index, verify, reading every bank
vs a sequential read(), and zstd on realistic bf16 and 4-bit rows. Figures go to
docs/BENCHMARKS.md ("## Container"); nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from statistics import median

import numpy as np
import xxhash

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import ftw  # noqa: E402
from ftw.banks import BankSource, LayerBanks, SourceTensor  # noqa: E402
from ftw.formats import LayerFormat, ModelShape  # noqa: E402
from ftw.writers import FtwWriter  # noqa: E402
from ftw.container import _join_planes  # noqa: E402
from ftw.writers.ftw_writer import split_planes  # noqa: E402

DATA = os.path.join(ROOT, "bench", "_data")
H, I = 2048, 768  # a mid-size MoE layer: a bf16 gate_up row is 6 MiB
E_BIG, E_SMALL = 64, 8  # the 100 MiB file needs smaller layers to hold a mix of formats
GB = 1e9
CHUNK = 64 << 20


def bf16_normal(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random normal weights rounded to bf16 (round to nearest even), as u16 bit patterns."""
    f = (rng.standard_normal(n, dtype=np.float32) * 0.02).view(np.uint32)
    return ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype(np.uint16)


class Pool:
    """Source rows cut from one random buffer per dtype, so building a 4 GiB file costs no
    generation time inside the timed write; consecutive rows start at different offsets."""

    def __init__(self, rng: np.random.Generator, nbytes: int = 256 << 20):
        self.bf16 = bf16_normal(rng, nbytes // 2).view(np.uint8)
        self.bytes = rng.integers(0, 256, nbytes, dtype=np.uint8)
        self.n = 0

    def bank(self, dtype: str, row_shape: tuple[int, ...], itemsize: int, E: int) -> BankSource:
        src = self.bf16 if dtype == "bf16" else self.bytes
        nbytes = int(np.prod(row_shape)) * itemsize
        base = (self.n * 4099 * 64) % (len(src) - nbytes * E) if len(src) > nbytes * E else 0
        self.n += 1

        def row(e: int):
            start = (base + e * nbytes) % (len(src) - nbytes)
            return [src[start : start + nbytes]]

        return BankSource(dtype, row_shape, E, row)


def layer_banks(pool: Pool, layer: int, kind: str, E: int) -> LayerBanks:
    if kind == "bf16":
        banks = {"gate_up": pool.bank("bf16", (2 * I, H), 2, E), "down": pool.bank("bf16", (H, I), 2, E)}
    elif kind == "nvfp4":
        banks = {
            "gate_up": pool.bank("u8", (2 * I, H // 2), 1, E),
            "down": pool.bank("u8", (H, I // 2), 1, E),
            "gate_up_scale": pool.bank("f8_e4m3", (2 * I, H // 16), 1, E),
            "down_scale": pool.bank("f8_e4m3", (H, I // 16), 1, E),
            "gate_up_global": pool.bank("f32", (2 * I,), 4, E),
            "down_global": pool.bank("f32", (H,), 4, E),
        }
    else:  # fp8_block
        banks = {
            "gate_up": pool.bank("f8_e4m3", (2 * I, H), 1, E),
            "down": pool.bank("f8_e4m3", (H, I), 1, E),
            "gate_up_scale": pool.bank("f32", (2 * -(-I // 128), -(-H // 128)), 4, E),
            "down_scale": pool.bank("f32", (-(-H // 128), -(-I // 128)), 4, E),
        }
    return LayerBanks(layer, LayerFormat.of(kind, {}), banks)


def plan(size: int, E: int) -> list[str]:
    """Layer formats cycling bf16 / nvfp4 / fp8_block / nvfp4 until the banks reach size."""
    cycle, kinds, total = ["bf16", "nvfp4", "fp8_block", "nvfp4"], [], 0
    rng = np.random.default_rng(0)
    tiny = Pool(rng, 1 << 20)
    sizes = {k: layer_banks(tiny, 0, k, E).nbytes for k in cycle}
    while total < size:
        k = cycle[len(kinds) % len(cycle)]
        if kinds and total + sizes[k] > size * 1.05:
            break
        kinds.append(k)
        total += sizes[k]
    return kinds


def build(path: str, size: int, pool: Pool) -> tuple[float, int]:
    """Write an FTW of about size bytes, raw banks; returns (seconds incl. fsync, bytes)."""
    if os.path.exists(path):
        os.unlink(path)
    E = E_BIG if size > (1 << 30) else E_SMALL
    kinds = plan(size, E)
    t = time.perf_counter()
    with FtwWriter(path) as w:
        w.set_model(ModelShape("bench", H, I, E, 8, len(kinds), list(range(len(kinds)))))
        w.set_provenance({"reader": "bench", "tool": "bench_container.py"})
        for layer, kind in enumerate(kinds):
            w.add_layer(layer_banks(pool, layer, kind, E))
        w.add_tensor(SourceTensor("embed", "bf16", (4096, H), lambda: pool.bf16[: 4096 * H * 2]))
        w.add_attachment("config.json", json.dumps({"hidden_size": H}).encode())
    return time.perf_counter() - t, os.path.getsize(path)


def plain_copy(src: str, dst: str) -> float:
    """Seconds for the plainest copy of src: 64 MiB read()/write() pairs, then fsync. It
    writes the very bytes the writer wrote (this virtual disk's speed depends on content)."""
    buf = bytearray(CHUNK)
    t = time.perf_counter()
    with open(src, "rb", buffering=0) as fin:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            while n := fin.readinto(buf):
                view = memoryview(buf)[:n]
                while view:
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    secs = time.perf_counter() - t
    os.unlink(dst)
    return secs


def build_many_blobs(path: str) -> None:
    """A file whose index is as long as a large real model's: DeepSeek-V3 has 58 MoE layers of
    4 fp8_block banks and ~1,220 other tensors. Open time follows the blob count, not bytes."""
    one = np.ones(16, np.uint8)
    fmt = LayerFormat.of("fp8_block", {"block_size": [128, 128]})
    with FtwWriter(path, force=True) as w:
        for layer in range(58):
            names = ("gate_up", "down", "gate_up_scale", "down_scale")
            w.add_layer(LayerBanks(layer, fmt, {n: BankSource("u8", (16,), 256, lambda e: [one]) for n in names}))
        for i in range(61 * 20):
            name = f"model.layers.{i // 20}.self_attn.projection_{i % 20}.weight"
            w.add_tensor(SourceTensor(name, "u8", (16,), lambda: one))


def bench_write(path: str, size: int, pool: Pool, rounds: int) -> dict:
    """Writer, cp and a plain write, interleaved `rounds` times: this disk's write speed
    swings by 3x from minute to minute, so each figure is the best of its rounds."""
    copy = path + ".cp"
    samples: dict[str, list[float]] = {"write_s": [], "cp_s": [], "plain_s": []}
    for _ in range(rounds):
        secs, nbytes = build(path, size, pool)
        samples["write_s"].append(secs)
        t = time.perf_counter()
        subprocess.run(["cp", path, copy], check=True)
        fd = os.open(copy, os.O_RDONLY)
        os.fsync(fd)  # the writer fsyncs before its rename: so must the baseline
        os.close(fd)
        samples["cp_s"].append(time.perf_counter() - t)
        os.unlink(copy)
        samples["plain_s"].append(plain_copy(path, copy))
    best = {k: min(v) for k, v in samples.items()}
    return {
        "file_bytes": nbytes,
        "rounds": rounds,
        "samples_s": samples,
        "write_GBps": nbytes / best["write_s"] / GB,
        "cp_GBps": nbytes / best["cp_s"] / GB,
        "write_time_over_cp": best["write_s"] / best["cp_s"],
        "disk_write_GBps": nbytes / best["plain_s"] / GB,
        "write_over_disk": best["plain_s"] / best["write_s"],
    }


def read_syscalls() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("syscr")).split()[1])


def bench_open(path: str, runs: int = 50) -> dict:
    def open_index():
        with ftw.open(path) as f:
            # touch the whole parsed index, as `ftw inspect` would
            return sum(b.blob.nbytes for banks in f.layers.values() for b in banks.values())

    def baseline():
        # the least any reader can do: open the file and read its last 64 bytes
        fd = os.open(path, os.O_RDONLY)
        os.pread(fd, 64, os.fstat(fd).st_size - 64)
        os.close(fd)

    open_index(), baseline()
    times, base = [], []
    syscr0 = read_syscalls()
    for _ in range(runs):
        t = time.perf_counter()
        open_index()
        times.append(time.perf_counter() - t)
    syscr = (read_syscalls() - syscr0) / runs
    for _ in range(runs):
        t = time.perf_counter()
        baseline()
        base.append(time.perf_counter() - t)
    with ftw.open(path) as f:
        n_blobs = sum(1 for _ in f.blobs())
    return {
        "file_bytes": os.path.getsize(path),
        "blobs": n_blobs,
        "open_ms": median(times) * 1e3,
        "read_syscalls_per_open": syscr,
        "baseline_open_pread_ms": median(base) * 1e3,
        "open_over_baseline": median(times) / median(base),
    }


def hash_ceiling(nbytes: int = 512 << 20) -> float:
    buf = np.random.default_rng(1).integers(0, 256, nbytes, dtype=np.uint8)
    xxhash.xxh3_64_intdigest(buf[: 1 << 20])
    t = time.perf_counter()
    for start in range(0, nbytes, CHUNK):
        xxhash.xxh3_64_intdigest(buf[start : start + CHUNK])
    return nbytes / (time.perf_counter() - t) / GB


def bench_verify(path: str) -> dict:
    """Page cache warm (a first pass fills it: the copies before may have evicted pages);
    each thread count best of 2, each pass on a fresh open so its map starts unpopulated."""
    cores = os.cpu_count() or 1
    out = {"xxh3_in_memory_GBps_1core": hash_ceiling()}
    with ftw.open(path) as f:
        f.verify()
    for threads in sorted({1, cores}):
        secs = float("inf")
        for _ in range(2):
            with ftw.open(path) as f:
                t = time.perf_counter()
                n = f.verify(threads=threads)
                secs = min(secs, time.perf_counter() - t)
        out[f"verify_GBps_{threads}t"] = n / secs / GB
        out[f"verify_GBps_per_core_{threads}t"] = n / secs / GB / threads
        out[f"verify_over_xxh3_ceiling_{threads}t"] = n / secs / GB / threads / out["xxh3_in_memory_GBps_1core"]
    return out


def bench_read(path: str) -> dict:
    """Every bank from the map (fresh open, warm page cache) vs read() of the whole file,
    both touching every byte with xxh3 so the two do the same work per byte."""

    def read_banks() -> int:
        n = 0
        with ftw.open(path) as f:
            for layer, banks in f.layers.items():
                for name in banks:
                    a = f.bank(layer, name).reshape(-1).view(np.uint8)
                    for start in range(0, a.size, CHUNK):
                        xxhash.xxh3_64_intdigest(a[start : start + CHUNK])
                    n += a.size
                    del a
        return n

    def read_file() -> int:
        buf = bytearray(CHUNK)
        n = 0
        with open(path, "rb", buffering=0) as fh:
            while True:
                got = fh.readinto(buf)
                if not got:
                    return n
                xxhash.xxh3_64_intdigest(memoryview(buf)[:got])
                n += got

    read_file()  # warm the page cache
    best_banks = best_file = 0.0
    for _ in range(3):
        t = time.perf_counter()
        n = read_file()
        best_file = max(best_file, n / (time.perf_counter() - t) / GB)
        t = time.perf_counter()
        m = read_banks()
        best_banks = max(best_banks, m / (time.perf_counter() - t) / GB)
    return {
        "read_file_GBps": best_file,
        "read_banks_GBps": best_banks,
        "banks_over_read": best_banks / best_file,
    }


def bench_zstd(level: int) -> dict:
    """Size ratio and per-expert decompression (as the reader decodes a row) for realistic
    rows: bf16 of random normal weights with and without the byte-plane split, and 4-bit."""
    import zstandard

    rng = np.random.default_rng(2)
    row_bytes = 2 * I * H * 2  # one bf16 gate_up row: 6 MiB
    rows = {
        "bf16_split": (bf16_normal(rng, row_bytes // 2 * 8).view(np.uint8), 2),
        "bf16_plain": (None, 1),
        "fp4_packed": (rng.integers(0, 256, row_bytes // 4 * 8, dtype=np.uint8), 1),
    }
    rows["bf16_plain"] = (rows["bf16_split"][0], 1)
    out = {"level": level}
    for label, (data, planes) in rows.items():
        n = data.size // 8
        experts = [data[i * n : (i + 1) * n] for i in range(8)]
        frames = []
        for row in experts:
            raw = split_planes(memoryview(row), 2) if planes == 2 else row
            frames.append(zstandard.ZstdCompressor(level=level, write_content_size=True).compress(raw))
        dst = np.empty(n, np.uint8)
        dctx = zstandard.ZstdDecompressor()
        t = time.perf_counter()
        for _ in range(3):
            for f in frames:
                raw = dctx.decompress(f, max_output_size=n)
                if planes == 2:
                    _join_planes(np.frombuffer(raw, np.uint8), 2, dst)  # as the reader does
                else:
                    dst[:] = np.frombuffer(raw, np.uint8)
        secs = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(3):
            for row in experts:
                dst[:] = row  # baseline: copying the uncompressed row
        copy_secs = time.perf_counter() - t
        out[label] = {
            "stored_over_raw": sum(map(len, frames)) / data.size,
            "decompress_GBps": 3 * data.size / secs / GB,
            "memcpy_GBps": 3 * data.size / copy_secs / GB,
            "decompress_over_memcpy": copy_secs / secs,
        }
    return out


def build_compressed(path: str, size: int, pool: Pool, level: int) -> int:
    """bf16 layers only, written with zstd (byte-plane split): every row a frame to prove."""
    E = E_BIG if size > (1 << 30) else E_SMALL
    n = max(1, size // layer_banks(Pool(np.random.default_rng(0), 1 << 20), 0, "bf16", E).nbytes)
    with FtwWriter(path, force=True, compress_level=level) as w:
        w.set_model(ModelShape("bench", H, I, E, 8, n, list(range(n))))
        for layer in range(n):
            w.add_layer(layer_banks(pool, layer, "bf16", E))
    return n


def bench_verify_compressed(path: str) -> dict:
    """verify of a compressed file (checksums, then every frame decoded on the same threads)
    against the floor under it: the same frames decoded by zstd alone on as many threads,
    into reused buffers, in the same run. Warm page cache, best of 2."""
    from concurrent.futures import ThreadPoolExecutor

    import zstandard

    cores = os.cpu_count() or 1
    with ftw.open(path) as f:
        f.verify()  # warm the page cache
        banks = [b for bs in f.layers.values() for b in bs.values() if b.row_table is not None]
        raw = sum(b.raw_nbytes for b in banks)
        stored = sum(b.blob.nbytes for b in banks)
        frames = [bytes(f.row_frame(b, e)) for b in banks for e in range(b.num_experts)]
        row = max(b.row_nbytes for b in banks)
    out = {"raw_bytes": raw, "stored_bytes": stored, "frames": len(frames)}
    for threads in sorted({1, cores}):
        def decode(part: list[bytes]) -> None:
            buf = memoryview(bytearray(row))
            for fr in part:
                with zstandard.ZstdDecompressor().stream_reader(fr) as r:
                    r.readinto(buf)

        parts = [frames[i::threads] for i in range(threads)]
        floor = verify = float("inf")
        for _ in range(2):
            with ThreadPoolExecutor(threads) as pool:
                t = time.perf_counter()
                list(pool.map(decode, parts))
                floor = min(floor, time.perf_counter() - t)
            with ftw.open(path) as f:
                t = time.perf_counter()
                f.verify(threads=threads)
                verify = min(verify, time.perf_counter() - t)
        out[f"verify_raw_GBps_{threads}t"] = raw / verify / GB
        out[f"decode_only_raw_GBps_{threads}t"] = raw / floor / GB
        out[f"verify_over_decode_only_{threads}t"] = floor / verify
    return out


def bench_inspect(counts=(4096, 16384, 65536), refused: int = 300_000) -> dict:
    """`ftw inspect` (open, summary, the printed tables) on indexes of N layers of two empty
    banks, each layer its own format (the worst case for grouping by format), against
    json.loads of the same index bytes; and the time to refuse a 300,000-layer index."""
    from contextlib import redirect_stdout

    from click.testing import CliRunner

    from ftw.cli import cli

    out: dict = {}

    def write(path: str, n: int, banks=("gate_up", "down")) -> bytes:
        layers = {str(i): {"banks": {b: {"dtype": "u8", "shape": [8, 0], "codec": "raw", "offset": 4096,
                                          "nbytes": 0, "xxh3": xxhash.xxh3_64_hexdigest(b"")}
                                      for b in banks}} for i in range(n)}
        index = json.dumps({"model": None, "layers": layers, "tensors": {}, "attachments": {},
                            "layer_quant_formats": {k: {"name": "bench", "options": {"i": int(k)}} for k in layers},
                            "provenance": {}}).encode()
        from ftw import spec

        body = spec.PREAMBLE.pack(spec.PREAMBLE_MAGIC, spec.MAJOR, spec.MINOR) + bytes(4096 - 64)
        foot = spec.FOOTER.pack(spec.FOOTER_MAGIC, spec.MAJOR, spec.MINOR, 0, 4096, len(index),
                                xxhash.xxh3_64_intdigest(index), 0)[:-8]
        with open(path, "wb") as fh:
            fh.write(body + index + foot + xxhash.xxh3_64_intdigest(foot).to_bytes(8, "little"))
        return index

    path = os.path.join(DATA, "wide.ftw")
    for n in counts:
        index = write(path, n)
        t = time.perf_counter()
        json.loads(index)
        parse = time.perf_counter() - t
        t = time.perf_counter()
        with open(os.devnull, "w") as null, redirect_stdout(null):
            res = CliRunner().invoke(cli, ["inspect", path])
        secs = time.perf_counter() - t
        assert res.exit_code == 0, res.output
        out[str(n)] = {"index_MiB": len(index) / 2**20, "inspect_s": secs, "json_loads_s": parse,
                       "us_per_layer": secs / n * 1e6, "inspect_over_json_loads": secs / parse}
    index = write(path, refused, banks=())  # ~40 MiB: under the index cap, over the layer limit
    t = time.perf_counter()
    res = CliRunner().invoke(cli, ["inspect", path])
    out["refused"] = {"layers": refused, "index_MiB": len(index) / 2**20, "seconds": time.perf_counter() - t,
                      "exit_code": res.exit_code}
    os.unlink(path)
    return out


def main_robust(args) -> None:
    """--only compressed-verify,inspect: the figures of issue 9 (sections 4 and 5)."""
    os.makedirs(DATA, exist_ok=True)
    results: dict = {"cores": os.cpu_count()}
    try:
        if "compressed-verify" in args.only:
            pool = Pool(np.random.default_rng(0))
            raw = os.path.join(DATA, "raw.ftw")
            build(raw, int(args.size_gib * (1 << 30)), pool)
            results["verify_raw"] = bench_verify(raw)
            os.unlink(raw)
            z = os.path.join(DATA, "zstd.ftw")
            build_compressed(z, int(args.size_gib * (1 << 30)), pool, args.level)
            results["verify_compressed"] = bench_verify_compressed(z)
        if "inspect" in args.only:
            results["inspect"] = bench_inspect()
    finally:
        if not args.keep:
            shutil.rmtree(DATA, ignore_errors=True)
    print(json.dumps(results, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gib", type=float, default=4.0)
    ap.add_argument("--keep", action="store_true", help="keep bench/_data/ files")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--level", type=int, default=3, help="zstd level for the codec figures")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved write/cp/plain rounds")
    ap.add_argument("--only", help="compressed-verify and/or inspect (comma-separated): just those figures, as JSON")
    args = ap.parse_args()
    if args.only:
        return main_robust(args)

    os.makedirs(DATA, exist_ok=True)
    big, small = os.path.join(DATA, "big.ftw"), os.path.join(DATA, "small.ftw")
    pool = Pool(np.random.default_rng(0))
    log = (lambda *a: None) if args.json else (lambda *a: print(*a, flush=True))
    results: dict = {"cores": os.cpu_count(), "size_gib": args.size_gib}
    try:
        log(f"writing {args.size_gib} GiB ...")
        results["write"] = bench_write(big, int(args.size_gib * (1 << 30)), pool, args.rounds)
        build(small, 100 << 20, pool)
        results["open_100MiB"] = bench_open(small)
        results["open_big"] = bench_open(big)
        many = os.path.join(DATA, "many_blobs.ftw")
        build_many_blobs(many)
        results["open_many_blobs"] = bench_open(many)
        log("verify ...")
        results["verify"] = bench_verify(big)
        log("reading banks ...")
        results["read"] = bench_read(big)
        log("zstd ...")
        results["zstd"] = bench_zstd(args.level)
    finally:
        if not args.keep:
            shutil.rmtree(DATA, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        report(results)


def report(r: dict) -> None:
    w = r["write"]
    print(f"\nfile {w['file_bytes'] / 2**30:.2f} GiB, {r['cores']} cores")
    print(f"write  best of {w['rounds']}: {w['write_GBps']:.3f} GB/s; cp+fsync {w['cp_GBps']:.3f} GB/s; "
          f"write time / cp time = {w['write_time_over_cp']:.2f}x (goal <= 1.25x); read+write "
          f"copy + fsync {w['disk_write_GBps']:.3f} GB/s, writer at {w['write_over_disk']:.2f}x of it")
    for key in ("open_100MiB", "open_big", "open_many_blobs"):
        o = r[key]
        print(f"open   {o['file_bytes'] / 2**20:8.0f} MiB, {o['blobs']} blobs: {o['open_ms']:.2f} ms "
              f"({o['read_syscalls_per_open']:.0f} read syscalls); open+pread baseline "
              f"{o['baseline_open_pread_ms']:.3f} ms; ratio {o['open_over_baseline']:.1f}x (goal < 20 ms)")
    v = r["verify"]
    print(f"verify xxh3 in memory {v['xxh3_in_memory_GBps_1core']:.2f} GB/s/core; " + "; ".join(
        f"{k.split('_')[-1]}: {v[k]:.2f} GB/s/core ({v[k.replace('GBps_per_core', 'over_xxh3_ceiling')]:.2f}x ceiling)"
        for k in v if k.startswith("verify_GBps_per_core")) + " (goal >= 2)")
    rd = r["read"]
    print(f"read   banks {rd['read_banks_GBps']:.2f} GB/s; read() {rd['read_file_GBps']:.2f} GB/s; "
          f"ratio {rd['banks_over_read']:.2f}x (goal >= 0.9x)")
    z = r["zstd"]
    for k in ("bf16_split", "bf16_plain", "fp4_packed"):
        print(f"zstd-{z['level']} {k:10s} stored/raw {z[k]['stored_over_raw']:.3f}; decompress "
              f"{z[k]['decompress_GBps']:.2f} GB/s per expert ({z[k]['decompress_over_memcpy']:.2f}x memcpy "
              f"{z[k]['memcpy_GBps']:.2f} GB/s)")


if __name__ == "__main__":
    main()
