"""The whole MoE decode step through the slot pools at set cache hit rates: copy vs compute,
and the overlap achieved (issue 13, Performance, last item).

    python3 bench/bench_step.py [--cases deepseek-v3:nvfp4,qwen3-30b-a3b:bf16] [--hits 0.5,0.9,0.99]
                                [--layers 8] [--experts 64] [--slots-per-layer 32] [--steps 25] [--json PATH]
    python3 bench/bench_step.py --dry-run    # the host twin, small layers, no GPU: checks the
                                             # trace, the hit rates and the output, times nothing
    python3 bench/bench_step.py --report PATH   # the tables again from a run's --json

Model: `--layers` MoE layers of one format (one pool), E experts each as pinned host banks
(random bytes in the format's stored layout, from bench_kernels.random_layer), T = 1 token,
top_k = 8. The pool holds `--slots-per-layer` x layers slots (LRU).

Trace (exact hit rate): at every (step, layer) the token's 8 experts are n_hit experts drawn
from the layer's resident set and 8 - n_hit from its non-resident experts, with the misses
spread by error diffusion so that each phase's picks miss in exactly round((1 - h) * picks).
The resident sets come from a host twin of the pools (same slots, same policy: tiny rows) that
replays the trace as it is drawn; the CUDA pools replay the same trace and must end with the
twin's statistics. The hit rate printed is the CUDA pools' own (hits / (hits + misses)).

Per case and hit rate, each on fresh pools (warm fill, 3 untimed steps, then `--steps` timed):
- copy: the misses' batches alone, no kernel, issued as the step issues them (back to back,
  host planning included; CUDA events on the compute stream): the copy of the overlap, and GB/s
  against one 1 GiB pinned host-to-device copy timed in the same run (the peak). Also each
  batch's own device time summed (the copy stream's events, the pools' set_timing; the host
  waits for each batch, so each starts on an idle queue and adds its submission latency);
- compute: the same kernels with every routed expert resident, no request (CUDA events);
- step, three orders of the same work (CUDA events around all steps, per step):
    serial: request(layer) -> join -> one kernel over the 8 experts (ftw check's order);
    split:  request(layer) -> the hits' kernel (runs while the misses copy) -> join -> the
            misses' kernel;
    split+readback: split, but the host first reads the layer's routing back from the device
            (a synchronising D2H copy of topk_ids), as a server whose router runs on the GPU
            must before it can plan the layer: nothing of layer l is issued before l-1 ended.
  compute is also timed as one CUDA graph of the same kernels (no launch gaps: the kernels' own
  time, as bench_kernels.py measures them), and each run's host time per step is printed.
Overlap = (copy + compute - step) / min(copy, compute): 1 = the shorter one fully hidden,
0 = none, < 0 = the step costs more than both (host gaps).

What the pools allow: a decode batch (channel 0) starts only after everything already queued
on the compute stream, so layer l+1's copies never overlap layer l's kernels; without a
predicted routing nothing can be prefetched. The only copy/compute overlap is inside a layer:
the hits' kernel while the misses copy (split). The host plans layer l+1 while the GPU runs
layer l (asynchronous launches), except with readback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from ftw.formats import LayerFormat  # noqa: E402
from ftw.loader import ExpertBanks  # noqa: E402
from ftw.runtime.pools import SlotPools, format_row_bytes  # noqa: E402

SIZES = {"qwen3-30b-a3b": (2048, 768), "deepseek-v3": (7168, 2048)}
DRY_SIZE = (256, 128)
K = 8
WARM_STEPS = 3
MODES = ("serial", "split", "split+readback")
GiB = 1 << 30


# -- the trace ------------------------------------------------------------------------------


def miss_counts(n: int, miss_rate: float) -> list[int]:
    """Misses per layer-step for n layer-steps of K picks: error diffusion, so that the first i
    layer-steps miss round(i * K * miss_rate) picks for every i (spread, exact in total)."""
    cum = [math.floor(i * K * miss_rate + 0.5) for i in range(n + 1)]
    return [cum[i + 1] - cum[i] for i in range(n)]


def twin_pools(E: int, L: int, slots_per_layer: int, fmt: LayerFormat) -> SlotPools:
    """A host twin with the real pools' slot counts and policy (tiny rows: decisions only)."""
    banks = ExpertBanks({b: {l: np.zeros((E, 16), np.uint8) for l in range(L)} for b in ("gate_up", "down")},
                        {l: fmt for l in range(L)}, E)
    return SlotPools(banks, slots=L * slots_per_layer, top_k=K, decode_batch=1, backend="host")


def warm_fill(pools: SlotPools, L: int, slots_per_layer: int) -> None:
    """Experts 0..S-1 of every layer resident (one request per layer)."""
    pools._p.begin_step()  # noqa: SLF001
    for l in range(L):
        pools.request(l, np.arange(slots_per_layer))


def make_trace(E: int, L: int, slots_per_layer: int, hit: float, steps: int, fmt: LayerFormat, seed: int):
    """[(hits, misses) per layer] per step, WARM_STEPS untimed ones first; the twin's statistics
    over the timed steps; and each layer's resident set at the end."""
    rng = np.random.default_rng(seed)
    twin = twin_pools(E, L, slots_per_layer, fmt)
    warm_fill(twin, L, slots_per_layer)
    trace = []
    stats = None
    for phase, n in (("warm", WARM_STEPS), ("timed", steps)):
        if phase == "timed":
            twin.reset_stats()
        counts = miss_counts(n * L, 1.0 - hit)
        for s in range(n):
            twin._p.begin_step()  # noqa: SLF001
            step = []
            for l in range(L):
                m = counts[s * L + l]
                resident = np.array([e for e in range(E) if twin.slot_of(l, e) >= 0], np.int32)
                absent = np.setdiff1d(np.arange(E, dtype=np.int32), resident)
                if len(resident) < K - m or len(absent) < m:
                    raise SystemExit(f"trace: layer {l} has {len(resident)} resident and {len(absent)} absent "
                                     f"experts, needs {K - m} and {m}: change --experts/--slots-per-layer")
                hits = rng.choice(resident, K - m, replace=False).astype(np.int32)
                misses = rng.choice(absent, m, replace=False).astype(np.int32)
                twin.request(l, np.concatenate([hits, misses]))
                step.append((hits, misses))
            trace.append(step)
        stats = twin.stats()
    final = [np.array([e for e in range(E) if twin.slot_of(l, e) >= 0], np.int32) for l in range(L)]
    return trace, next(iter(stats.values())), final


def compute_ids(trace, final, seed: int):
    """The compute-alone routing: per (step, layer) as many hit and miss picks as the trace, all
    drawn from the layer's final resident set (resident, so no request is needed)."""
    rng = np.random.default_rng(seed + 1)
    out = []
    for step in trace:
        row = []
        for l, (h, m) in enumerate(step):
            pick = rng.choice(final[l], len(h) + len(m), replace=False).astype(np.int32)
            row.append((pick[: len(h)], pick[len(h):]))
        out.append(row)
    return out


# -- the machine: CUDA, or the host twin for --dry-run --------------------------------------


class Gpu:
    """CUDA events, pinned banks, the kernels; one compute stream for everything."""

    dry = False

    def __init__(self):
        import torch

        self.torch = torch
        self.dev = torch.device("cuda")
        self.stream = torch.cuda.Stream()
        torch.cuda.set_stream(self.stream)

    def event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def elapsed_ms(self, a, b) -> float:
        return a.elapsed_time(b)

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def peak_GBps(self, nbytes: int = GiB, reps: int = 5) -> float:
        """One pinned host-to-device copy of 1 GiB, median of reps, CUDA events."""
        torch = self.torch
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        src.fill_(7)
        dst = torch.empty(nbytes, dtype=torch.uint8, device=self.dev)
        times = []
        for i in range(reps + 1):
            a, b = self.event(), self.event()
            a.record()
            dst.copy_(src, non_blocking=True)
            b.record()
            b.synchronize()
            if i:
                times.append(a.elapsed_time(b) / 1e3)
        del src, dst
        return nbytes / statistics.median(times) / 1e9

    def banks(self, name: str, H: int, I: int, E: int, L: int) -> ExpertBanks:  # noqa: E741
        """Pinned [E, row bytes] banks per layer: 16 random experts of bench_kernels.random_layer
        (valid scales), permuted per layer and repeated over E."""
        import bench_kernels as bk

        torch = self.torch
        rows = format_row_bytes(LayerFormat.of(name), H, I)
        tmpl = bk.random_layer(name, H, I, 16, self.dev)
        flat = {b: t.reshape(16, -1).view(torch.uint8) for b, t in tmpl.banks.items()}
        assert {b: f.shape[1] for b, f in flat.items()} == rows, (name, rows)
        out: dict = {b: {} for b in rows}
        g = torch.Generator(device="cpu").manual_seed(L)
        for l in range(L):
            order = torch.randint(0, 16, (E,), generator=g).to(self.dev)
            for b in rows:
                host = torch.empty((E, rows[b]), dtype=torch.uint8, pin_memory=True)
                host.copy_(flat[b].index_select(0, order))
                out[b][l] = host
        self.sync()
        return ExpertBanks(out, {l: tmpl.format for l in range(L)}, E)

    def pools(self, banks: ExpertBanks, L: int, slots_per_layer: int) -> SlotPools:
        return SlotPools(banks, slots=L * slots_per_layer, top_k=K, decode_batch=1, backend="cuda",
                         stream=self.stream.cuda_stream)

    def kernels(self, pools: SlotPools, fmt: LayerFormat, H: int, I: int, E: int, L: int):  # noqa: E741
        """launch(layer, ids_device_tensor, out) on the compute stream: one experts kernel (T=1)
        reading the layer's pool view."""
        torch = self.torch
        from ftw import _runtime as rt
        from ftw.runtime.cuda_experts import ggml_type_ids

        views = [pools.view(l) for l in range(L)]
        S = pools.plan["pools"][0]["slots"]
        ws = torch.empty(int(rt.cuda_experts_workspace_bytes(1, K, I, E, H)), dtype=torch.uint8, device=self.dev)
        x = torch.randn((1, H), device=self.dev).to(torch.bfloat16)
        w = torch.rand((1, K), device=self.dev)
        gg = ggml_type_ids(fmt)
        stream = self.stream.cuda_stream

        def launch(l, ids, out):
            v = views[l]
            rt.cuda_experts_forward(fmt.name, list(v.bank_base), list(v.row_bytes), v.slot_of_expert, E, S, H, I,
                                    1, ids.shape[1], x.data_ptr(), ids.data_ptr(), w.data_ptr(), out.data_ptr(),
                                    ws.data_ptr(), ws.numel(), "silu", 1.0, math.inf, 128, 128, "f32", "bf16",
                                    stream, gg)
        return launch, ws

    def graph_ms(self, fn, replays: int = 5) -> float:
        """fn's launches captured in one CUDA graph on the compute stream; ms per replay (no
        launch gaps: the kernels' own time, as bench_kernels.py measures them)."""
        torch = self.torch
        g = torch.cuda.CUDAGraph()
        self.sync()
        with torch.cuda.graph(g, stream=self.stream):
            fn()
        g.replay()
        a, b = self.event(), self.event()
        a.record()
        for _ in range(replays):
            g.replay()
        b.record()
        self.sync()
        return a.elapsed_time(b) / replays

    def upload(self, ids: np.ndarray):
        return self.torch.from_numpy(ids.reshape(1, -1).astype(np.int32)).to(self.dev)

    def out(self, H: int):
        return self.torch.empty((1, H), dtype=self.torch.float32, device=self.dev)

    def readback(self, ids) -> np.ndarray:
        return ids.cpu().numpy()  # synchronises with the compute stream, as a router's D2H does

    def kernel_error(self, ws) -> int:
        return int(ws[:4].view(self.torch.int32)[0].item())


class Dry:
    """--dry-run: the host twin with real bytes, host clocks, no kernels. Times mean nothing."""

    dry = True

    class _Ev:
        def record(self):
            self.t = time.perf_counter()

    def event(self):
        return Dry._Ev()

    def elapsed_ms(self, a, b) -> float:
        return (b.t - a.t) * 1e3

    def sync(self) -> None:
        pass

    def peak_GBps(self, nbytes: int = 64 << 20, reps: int = 3) -> float:
        src, dst = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            np.copyto(dst, src)
            times.append(time.perf_counter() - t)
        return nbytes / statistics.median(times) / 1e9

    def banks(self, name, H, I, E, L) -> ExpertBanks:  # noqa: E741
        rng = np.random.default_rng(L)
        rows = format_row_bytes(LayerFormat.of(name), H, I)
        return ExpertBanks({b: {l: rng.integers(0, 256, (E, n), dtype=np.uint8) for l in range(L)}
                            for b, n in rows.items()}, {l: LayerFormat.of(name) for l in range(L)}, E)

    def pools(self, banks, L, slots_per_layer) -> SlotPools:
        return SlotPools(banks, slots=L * slots_per_layer, top_k=K, decode_batch=1, backend="host")

    def kernels(self, pools, fmt, H, I, E, L):  # noqa: E741
        def launch(l, ids, out):  # what a kernel may assume: every routed expert resident
            for e in ids.reshape(-1).tolist():
                assert pools.slot_of(l, e) >= 0, (l, e)
        return launch, None

    def graph_ms(self, fn, replays: int = 1) -> float:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    def upload(self, ids):
        return ids.reshape(1, -1).astype(np.int32)

    def out(self, H):
        return None

    def readback(self, ids):
        return np.array(ids)

    def kernel_error(self, ws) -> int:
        return 0


# -- the runs -------------------------------------------------------------------------------


def same_choices(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("hits", "misses", "evictions"))


def fresh_pools(m, banks, L, S):
    p = m.pools(banks, L, S)
    warm_fill(p, L, S)
    m.sync()
    return p


def play(m, pools: SlotPools, trace, L: int, *, mode: str | None, launch=None, dev_ids=None, outs=None, ws=None,
         device_copy: bool = False) -> dict:
    """Runs the warm steps untimed (each kernel checked: no pair skipped as not resident), then
    the timed ones. mode None: requests only (copies); "compute": kernels only (no request);
    else a step order of MODES. dev_ids[step][layer] = (hits, misses, all) on the device."""
    pj = pools._p  # noqa: SLF001
    res: dict = {}

    def run(steps, ids, timed):
        copy_ms = 0.0

        def kernel(s, l, which):
            launch(l, ids[s][l][which], outs[which])
            if not timed and ws is not None:
                m.sync()
                err = m.kernel_error(ws)
                if err:
                    raise RuntimeError(f"{mode}: step {s} layer {l}: the kernel skipped pair {err - 1} as not resident")

        start, end = m.event(), m.event()
        m.sync()
        t0 = time.perf_counter()
        start.record()
        for s, step in enumerate(steps):
            if mode != "compute":
                pj.begin_step()
            for l, (h, mi) in enumerate(step):
                if mode == "compute":
                    for which, part in ((0, h), (1, mi)):
                        if len(part):
                            kernel(s, l, which)
                    continue
                if mode == "split+readback":
                    m.readback(ids[s][l][2])  # the router's output reaches the host: a sync
                pools.request(l, np.concatenate([h, mi]))
                if device_copy and pools.last_batch_calls + pools.last_kernel_calls:
                    copy_ms += pj.last_copy_ms  # synchronises: this run gives the copies' device time only
                if mode is None:
                    continue
                if mode == "serial":
                    pj.join(0)
                    kernel(s, l, 2)
                    continue
                if len(h):  # split: the hits' kernel runs while the misses copy
                    kernel(s, l, 0)
                pj.join(0)
                if len(mi):
                    kernel(s, l, 1)
            if mode is None:
                pj.join(0)
        end.record()
        host_s = time.perf_counter() - t0
        m.sync()
        if timed:
            n = len(steps)
            res["ms"] = m.elapsed_ms(start, end) / n
            res["host_ms"] = host_s * 1e3 / n
            if device_copy:
                res["copy_device_ms"] = copy_ms / n

    if device_copy:
        pj.set_timing(True)
    run(trace[:WARM_STEPS], dev_ids[:WARM_STEPS] if dev_ids else None, False)
    pools.reset_stats()
    run(trace[WARM_STEPS:], dev_ids[WARM_STEPS:] if dev_ids else None, True)
    if device_copy:
        pj.set_timing(False)
    st = next(iter(pools.stats().values()))
    res["stats"] = st
    res["hit_rate"] = st["hits"] / max(1, st["hits"] + st["misses"])
    return res


def bench_case(m, case: str, hits: list[float], L: int, E: int, S: int, steps: int, peak: float, seed: int,
               rows: list) -> None:
    """Appends one row per hit rate to rows (as each is measured)."""
    size, name = case.split(":")
    H, I = DRY_SIZE if m.dry else SIZES[size]  # noqa: E741
    fmt = LayerFormat.of(name)
    per_expert = sum(format_row_bytes(fmt, H, I).values())
    t = time.perf_counter()
    banks = m.banks(name, H, I, E, L)
    print(f"{case}: H={H} I={I} E={E} layers={L} top_k={K}, {per_expert / 2**20:.2f} MiB per expert, "
          f"{S} slots per layer, pinned banks {banks.nbytes / GiB:.1f} GiB ({time.perf_counter() - t:.1f} s)", flush=True)
    for h in hits:
        trace, twin_stats, final = make_trace(E, L, S, h, steps, fmt, seed)
        cids = compute_ids(trace, final, seed)
        row = {"case": case, "format": name, "H": H, "I": I, "E": E, "layers": L, "slots_per_layer": S,
               "steps": steps, "hit_target": h, "twin_stats": twin_stats, "peak_GBps": peak,
               "expert_bytes": per_expert}
        # the trace's own ids for the steps ([hits], [misses], [all]) and the compute-alone ids
        up = m.upload
        step_ids = [[(up(a), up(b), up(np.concatenate([a, b]))) for a, b in st] for st in trace]
        alone_ids = [[(up(a), up(b), up(np.concatenate([a, b]))) for a, b in st] for st in cids]

        pools = fresh_pools(m, banks, L, S)
        c = play(m, pools, trace, L, mode=None, device_copy=not m.dry)
        assert same_choices(c["stats"], twin_stats), (c["stats"], twin_stats)  # the twin's choices
        row["hit_rate"] = c["hit_rate"]
        row["copy_bytes_per_step"] = c["stats"]["copy_bytes"] / steps
        row["copy_ms"] = c.get("copy_device_ms", c["ms"])
        del pools
        pools = fresh_pools(m, banks, L, S)
        row["copy_wall_ms"] = play(m, pools, trace, L, mode=None)["ms"]
        del pools
        for mode in MODES:
            pools = fresh_pools(m, banks, L, S)
            launch, ws = m.kernels(pools, fmt, H, I, E, L)
            outs = [m.out(H) for _ in range(3)]
            launch(0, m.upload(np.arange(K)), outs[2])  # module load and first launch untimed (0..S-1 resident)
            r = play(m, pools, trace, L, mode=mode, launch=launch, dev_ids=step_ids, outs=outs, ws=ws)
            assert same_choices(r["stats"], twin_stats), (mode, r["stats"], twin_stats)
            if mode != "split+readback":  # (which has the split's kernels, so its compute alone)
                if mode == "serial":  # one kernel of 8 resident experts per layer
                    ctrace = [[(np.concatenate([a, b]), b[:0]) for a, b in st] for st in cids]
                    cids_dev = [[(x[2], x[1], x[2]) for x in st] for st in alone_ids]
                else:  # the same two kernels per layer (hits, misses), all resident
                    ctrace, cids_dev = cids, alone_ids
                alone = play(m, pools, ctrace, L, mode="compute", launch=launch, dev_ids=cids_dev, outs=outs, ws=ws)

                def kernels_only(ctrace=ctrace, cids_dev=cids_dev, outs=outs, launch=launch):
                    for st, ids in zip(ctrace[WARM_STEPS:], cids_dev[WARM_STEPS:]):
                        for l, (a, b) in enumerate(st):
                            for which, part in ((0, a), (1, b)):
                                if len(part):
                                    launch(l, ids[l][which], outs[which])

                alone["graph_ms"] = m.graph_ms(kernels_only) / steps
            err = m.kernel_error(ws) if ws is not None else 0
            if err:
                raise RuntimeError(f"{case} h={h} {mode}: a kernel found pair {err - 1} not resident")
            row[mode] = {"compute_ms": alone["ms"], "compute_graph_ms": alone["graph_ms"],
                         "compute_host_ms": alone["host_ms"], "step_ms": r["ms"], "step_host_ms": r["host_ms"]}
            row[mode]["overlap"] = overlap(row, mode)
            del pools
        rows.append(row)
        print_row(row, flush=True)
    del banks


def overlap(r: dict, mode: str) -> float:
    """(copy + compute - step) / min(copy, compute), copy = the copies issued as the step issues
    them (back-to-back, no kernel), compute = the same kernels alone, eager."""
    copy, compute, step = r["copy_wall_ms"], r[mode]["compute_ms"], r[mode]["step_ms"]
    return (copy + compute - step) / min(copy, compute) if min(copy, compute) > 0 else float("nan")


def copy_GBps(r: dict) -> float:
    return r["copy_bytes_per_step"] / (r["copy_wall_ms"] / 1e3) / 1e9 if r["copy_wall_ms"] > 0 else float("nan")


def print_row(r: dict, flush: bool = False) -> None:
    gbps = copy_GBps(r)
    print(f"{r['case']:22s} hit {100 * r['hit_target']:4.0f}% (measured {100 * r['hit_rate']:6.2f}%)  "
          f"copy {r['copy_wall_ms']:7.3f} ms/step ({r['copy_bytes_per_step'] / 2**20:7.1f} MiB, {gbps:5.1f} GB/s = "
          f"{gbps / r['peak_GBps']:.2f}x peak; batch by batch on the device {r['copy_ms']:7.3f} ms)", flush=flush)
    for mode in MODES:
        x = r[mode]
        print(f"    {mode:15s} compute {x['compute_ms']:7.3f} ms (kernels alone in a graph {x['compute_graph_ms']:7.3f}, "
              f"x{x['compute_ms'] / x['compute_graph_ms']:.2f}; host {x['compute_host_ms']:7.3f})  "
              f"step {x['step_ms']:7.3f} ms (host {x['step_host_ms']:7.3f})  overlap {x['overlap']:5.2f}", flush=flush)


def summary(rows: list[dict]) -> None:
    print("\ncase                   hit  measured | copy ms   GB/s x peak | mode            compute ms (graph)  step ms  overlap")
    for r in rows:
        gbps = copy_GBps(r)
        lead = (f"{r['case']:22s} {100 * r['hit_target']:3.0f}% {100 * r['hit_rate']:8.2f}% | "
                f"{r['copy_wall_ms']:7.3f} {gbps:6.1f} {gbps / r['peak_GBps']:6.2f} | ")
        for i, mode in enumerate(MODES):
            x = r[mode]
            print(f"{lead if i == 0 else ' ' * (len(lead) - 2) + '| '}{mode:15s} {x['compute_ms']:10.3f} "
                  f"({x['compute_graph_ms']:5.3f}) {x['step_ms']:8.3f} {x['overlap']:8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="deepseek-v3:nvfp4,qwen3-30b-a3b:bf16", help="size:format,...")
    ap.add_argument("--hits", default="0.5,0.9,0.99")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=64, help="experts per layer (E)")
    ap.add_argument("--slots-per-layer", type=int, default=32)
    ap.add_argument("--steps", type=int, default=25, help="timed decode steps (after 3 untimed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true", help="host twin, small layers, no GPU, no timing")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--report", metavar="PATH", help="print the tables of a run's --json output (overlap recomputed)")
    a = ap.parse_args()
    if a.report:
        with open(a.report) as f:
            res = json.load(f)
        print(f"{res.get('device', 'dry run')}: peak one pinned host-to-device copy {res['peak_GBps']:.1f} GB/s")
        for r in res["rows"]:
            for mode in MODES:
                r[mode]["overlap"] = overlap(r, mode)
            print_row(r)
        summary(res["rows"])
        return
    hits = [float(x) for x in a.hits.split(",") if x]
    if any(not 0.0 <= h <= 1.0 for h in hits):
        ap.error("--hits: rates between 0 and 1")
    for case in a.cases.split(","):
        size, _, name = case.partition(":")
        if size not in SIZES or not name:
            ap.error(f"--cases {case!r}: expected SIZE:FORMAT with SIZE one of {', '.join(SIZES)}")
    if a.slots_per_layer < K or a.experts - a.slots_per_layer < K:
        ap.error(f"--slots-per-layer must be >= {K} and leave >= {K} experts of --experts outside the pool")
    m = Dry() if a.dry_run else Gpu()
    peak = m.peak_GBps()
    res = {"peak_GBps": peak, "dry_run": a.dry_run, "rows": []}
    if not a.dry_run:
        import torch

        res["device"] = torch.cuda.get_device_name()
    print(f"peak: one {'64 MiB' if a.dry_run else '1 GiB'} pinned host-to-device copy {peak:.1f} GB/s"
          + (" (dry run: host memcpy; no figure here is a GPU's)" if a.dry_run else ""), flush=True)
    failed = []
    for case in a.cases.split(","):
        try:  # one case's failure leaves the others' figures
            bench_case(m, case, hits, a.layers, a.experts, a.slots_per_layer, a.steps, peak, a.seed, res["rows"])
        except Exception:
            traceback.print_exc()
            failed.append(case)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    summary(res["rows"])
    if failed:
        raise SystemExit(f"bench_step: failed: {', '.join(failed)}")


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"bench_step: {time.time() - t0:.0f} s", file=sys.stderr)
