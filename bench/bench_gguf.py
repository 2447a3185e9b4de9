"""GGUF reader throughput: convert a >= 2 GiB GGUF of experts vs a raw copy of the file.

    .venv/bin/python bench/bench_gguf.py [--size-gib 2.2] [--rounds 2] [--keep] [--json]

Builds a Qwen3-30B-A3B-shaped Q4_K_M-style GGUF (H=2048, I=768, E=128; gate/up Q4_K, down
Q6_K) of random bytes under bench/_data (valid block sizes, so fine for throughput), then in
one run measures:
- `ftw convert` (writers.convert.convert: reader -> FtwWriter, fsync, rename) against
  `cp` + fsync of the same file to the same disk, alternating, best of --rounds each;
- the reader alone: every row written with os.write to one file + fsync (no container);
- bytes the OS brings in when one layer is read through the reader, after evicting the file
  from the page cache (mincore over the map), against that layer's size.
The data is deleted afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import struct
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import DATA, GiB, cp_baseline  # noqa: E402

H, I, E = 2048, 768, 128
Q4_K, Q6_K, F32 = 12, 14, 0
ALIGN = 32


def _s(x: str) -> bytes:
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def tensor_plan(n_layers: int) -> list[tuple[str, tuple[int, ...], int, int]]:
    """(name, ne, type, nbytes) in file order, Q4_K = 144 B / 256 values, Q6_K = 210 B / 256."""
    out = [("token_embd.weight", (H, 1024), Q4_K, 1024 * H // 256 * 144)]
    for L in range(n_layers):
        p = f"blk.{L}."
        out += [(p + "attn_norm.weight", (H,), F32, 4 * H),
                (p + "ffn_gate_inp.weight", (H, E), F32, 4 * H * E),
                (p + "ffn_gate_exps.weight", (H, I, E), Q4_K, E * I * H // 256 * 144),
                (p + "ffn_up_exps.weight", (H, I, E), Q4_K, E * I * H // 256 * 144),
                (p + "ffn_down_exps.weight", (I, H, E), Q6_K, E * H * I // 256 * 210)]
    return out


def make_gguf(path: str, n_layers: int) -> None:
    tensors = tensor_plan(n_layers)
    a = "qwen3moe"
    kvs = [("general.architecture", 8, _s(a)), (f"{a}.block_count", 4, struct.pack("<I", n_layers)),
           (f"{a}.embedding_length", 4, struct.pack("<I", H)), (f"{a}.expert_count", 4, struct.pack("<I", E)),
           (f"{a}.expert_used_count", 4, struct.pack("<I", 8)),
           (f"{a}.expert_feed_forward_length", 4, struct.pack("<I", I))]
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    head += b"".join(_s(k) + struct.pack("<I", t) + v for k, t, v in kvs)
    rel = 0
    for name, ne, t, n in tensors:
        head += _s(name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, t, rel)
        rel += -(-n // ALIGN) * ALIGN
    head += bytes(-len(head) % ALIGN)
    noise = np.random.default_rng(0).integers(0, 256, 64 << 20, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(head)
        for i, (_, _, _, n) in enumerate(tensors):
            left = n
            while left:
                k = min(left, noise.size)
                noise[:8] = i  # tensors differ, and no two writes are the same page run
                f.write(memoryview(noise)[:k])
                left -= k
            f.write(bytes(-n % ALIGN))
        f.flush()
        os.fsync(f.fileno())


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def warm(path: str) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(64 << 20):
            pass


def convert_once(src: str, dst: str) -> float:
    from ftw.writers.convert import convert

    t = time.perf_counter()
    convert(src, dst, force=True)
    return time.perf_counter() - t


def standin_once(src: str, dst: str) -> float:
    """The reader alone: every bank row and tensor written sequentially with os.write, fsync
    (no index, no checksums): what the reader costs, apart from the container writer."""
    from ftw.readers.gguf_reader import GgufReader

    t = time.perf_counter()
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with GgufReader(src) as r:
            for lb in r.plan():
                for b in lb.banks.values():
                    for e in range(b.num_experts):
                        for p in b.row(e):
                            view = memoryview(p).cast("B")
                            while view:
                                view = view[os.write(fd, view):]
            for st in r.tensors():
                os.write(fd, memoryview(st.data()).cast("B"))
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t


def one_layer_touch(src: str, layer: int) -> tuple[int, int, int]:
    """(bytes resident after reading layer's rows, of which inside the layer, the layer's bytes)."""
    from ftw.readers.gguf_reader import GgufReader

    evict(src)
    r = GgufReader(src)
    data = r._files[0].data
    page = mmap.PAGESIZE
    vec = (ctypes.c_ubyte * (-(-data.size // page)))()
    libc = ctypes.CDLL(None)
    lb = r.plan([layer])[0]
    sink = 0
    for b in lb.banks.values():
        for e in range(b.num_experts):
            for p in b.row(e):
                sink ^= int(np.asarray(p).view(np.uint8)[:: page].sum())  # touch every page of the row
    libc.mincore(ctypes.c_void_p(data.ctypes.data), ctypes.c_size_t(data.size), vec)
    res = np.flatnonzero(np.frombuffer(vec, dtype=np.uint8) & 1) * page
    lay = r._layers[layer]
    lo = min(t.offset for t in lay.tensors())
    hi = max(t.offset + t.nbytes for t in lay.tensors())
    inside = int(((res >= lo) & (res < hi)).sum()) * page
    r.close()
    return len(res) * page, inside, hi - lo


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gib", type=float, default=2.2, help="expert bytes to generate (>= 2)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    per_layer = sum(n for name, _, _, n in tensor_plan(1) if "_exps" in name)
    n_layers = max(1, int(np.ceil(args.size_gib * GiB / per_layer)))
    os.makedirs(DATA, exist_ok=True)
    src = os.path.join(DATA, f"qwen3moe-synthetic-{n_layers}L.gguf")
    cp_dst, ftw_dst = src + ".cp", src + ".ftw"
    try:
        t = time.perf_counter()
        make_gguf(src, n_layers)
        size = os.path.getsize(src)
        experts = per_layer * n_layers
        print(f"made {src}: {size / GiB:.2f} GiB, experts {experts / GiB:.2f} GiB, {n_layers} layers "
              f"({time.perf_counter() - t:.1f} s)", file=sys.stderr)
        warm(src)  # both sides start from a warm source: the comparison is of the write paths
        cps, convs, stands = [], [], []
        for _ in range(args.rounds):  # interleaved, so disk noise from other work hits all three
            cps.append(cp_baseline(src, cp_dst))
            os.remove(cp_dst)
            convs.append(convert_once(src, ftw_dst))
            os.remove(ftw_dst)
            stands.append(standin_once(src, ftw_dst))
            os.remove(ftw_dst)
        cp_s, conv_s, stand_s = min(cps), min(convs), min(stands)
        touched, inside, layer_nbytes = one_layer_touch(src, n_layers // 2)
        figs = {
            "file_gib": size / GiB, "expert_gib": experts / GiB, "layers": n_layers,
            "cp_s": cps, "convert_s": convs, "reader_write_s": stands,
            "ratio_reader_write_vs_cp": cp_s / stand_s,
            "cp_gbps": size / cp_s / 1e9, "convert_gbps": size / conv_s / 1e9,
            "ratio_convert_vs_cp": cp_s / conv_s,
            "one_layer_bytes": layer_nbytes, "one_layer_touched": touched, "one_layer_touched_inside": inside,
        }
        if args.json:
            import json

            print(json.dumps(figs, indent=1))
        else:
            print(f"cp + fsync      {cp_s:7.2f} s  {figs['cp_gbps']:.2f} GB/s   (rounds: {', '.join(f'{x:.2f}' for x in cps)})")
            print(f"ftw convert     {conv_s:7.2f} s  {figs['convert_gbps']:.2f} GB/s   (rounds: {', '.join(f'{x:.2f}' for x in convs)})")
            print(f"reader + write  {stand_s:7.2f} s  {size / stand_s / 1e9:.2f} GB/s   (rounds: {', '.join(f'{x:.2f}' for x in stands)})")
            print(f"convert speed / cp speed: {figs['ratio_convert_vs_cp']:.2f}x (goal >= 0.8x); "
                  f"reader + plain write / cp: {figs['ratio_reader_write_vs_cp']:.2f}x")
            print(f"one layer: {layer_nbytes / 2**20:.1f} MiB; the OS brought in {touched / 2**20:.1f} MiB "
                  f"({inside / 2**20:.1f} MiB inside the layer, {(touched - inside) / 2**20:.1f} MiB read-around "
                  f"and header) of the {size / 2**20:.0f} MiB file")
    finally:
        if not args.keep:
            for p in (src, cp_dst, ftw_dst):
                if os.path.exists(p):
                    os.remove(p)


if __name__ == "__main__":
    main()
