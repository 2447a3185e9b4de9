"""Per-format GPU slot pools and their planner (csrc/pools/; docs/RUNTIME.md states the policy).

    plan_model(E, top_k, H, I, layer_formats, gpu_mem=... | slots=..., ...)   plan from a shape
    plan_file(path, ...)                  plan from an FTW file's header (no bank is read)
    SlotPools(banks, ...)                 pools over loaded ExpertBanks; backend "host" (the
                                          host twin) or "cuda"
      .request(layer, ids) -> slots       decode: one layer's routed experts, resident at once
      .decode_step({layer: ids})          a step's layers, all misses in one batch (chunked by
                                          layers only when a pool cannot hold them together)
      .prefill_layer(layer, ids)          yields (view, experts): the resident ones from the
                                          cache, then the missing ones group by group through
                                          the staging region (each copied once per chunk)
      .view(layer) -> LayerView           what a kernel reads (csrc/pools/pool_view.h)
      .stats()                            hits / misses / evictions / staged / copies per pool

A pool is one format (name + options); layers of the same name with other options are another
pool. Planning is arithmetic in C++ (csrc/pools/planner.cpp) shared by `ftw plan` and the
runtime, so what `ftw plan` prints is what SlotPools allocates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import prod
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from .. import spec
from ..errors import FormatError, FtwError
from ..formats import LayerFormat, get_format

DEFAULT_LRFU_LAMBDA = 0.01  # per step: a use counts half after 100 steps (docs/BENCHMARKS.md, "Slot pools")
EVICTIONS = ("lru", "lrfu")
BACKENDS = ("host", "cuda")


class CapacityError(FtwError):
    """The pools cannot hold what was asked: a budget below the planner's minimum, or one
    layer's step with more distinct experts than its pool has slots. Nothing was changed."""


def parse_size(text: str | int) -> int:
    """'80GiB', '80G' (GiB), '512MiB', '1.5e10' (bytes) -> bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([KMGT]?)(i?B)?\s*", text)
    if not m:
        raise FtwError(f"size {text!r}: expected a number with an optional unit (e.g. 80GiB, 512MiB)")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2)]
    return int(float(m.group(1)) * scale)


# -- planning -------------------------------------------------------------------------------


def format_row_bytes(fmt: LayerFormat, H: int, I: int, with_optional: bool = False) -> dict[str, int]:  # noqa: E741
    """Bytes of one expert's row in each bank of `fmt` at H, I (optional banks only if asked)."""
    out = {}
    for name, bs in get_format(fmt.name).banks(H, I, fmt.options).items():
        if bs.optional and not with_optional:
            continue
        out[name] = prod(bs.row_shape) * spec.DTYPES[bs.dtypes[0]].itemsize
    return out


def _request(
    E: int, top_k: int, groups: Sequence[tuple[LayerFormat, list[int], dict[str, int]]], *,
    gpu_mem: int | str | None, slots: int | None, decode_batch: int, prefill_chunk: int, staging_experts: int,
) -> dict:
    if (gpu_mem is None) == (slots is None):
        raise FtwError("plan: give exactly one budget: gpu_mem or slots")
    bank_names: list[str] = []
    for _, _, rows in groups:
        bank_names += [b for b in rows if b not in bank_names]
    return {
        "num_experts": E, "top_k": top_k, "bank_names": bank_names,
        "pools": [(fmt.key(), sorted(layers), [rows.get(b, 0) for b in bank_names])
                  for fmt, layers, rows in sorted(groups, key=lambda g: min(g[1]))],
        "gpu_mem": None if gpu_mem is None else parse_size(gpu_mem),
        "total_slots": slots, "decode_batch": decode_batch, "prefill_chunk": prefill_chunk,
        "staging_experts": staging_experts,
    }


def _run_plan(request: dict) -> dict:
    from .. import _runtime

    plan = _runtime.plan_pools(request)
    plan["pools"] = [dict(p, layers=list(p["layers"])) for p in plan["pools"]]
    return plan


def plan_model(
    E: int, top_k: int, H: int, I: int, layer_formats: Mapping[int, LayerFormat], *,  # noqa: E741
    gpu_mem: int | str | None = None, slots: int | None = None, decode_batch: int = 0,
    prefill_chunk: int = 0, staging_experts: int = 8,
) -> dict:
    """The pool plan of a model given by its shape; raises CapacityError naming the minimum."""
    by_fmt: dict[LayerFormat, list[int]] = {}
    for layer, fmt in layer_formats.items():
        by_fmt.setdefault(fmt, []).append(layer)
    groups = [(f, ls, format_row_bytes(f, H, I)) for f, ls in by_fmt.items()]
    plan = _run_plan(_request(E, top_k, groups, gpu_mem=gpu_mem, slots=slots, decode_batch=decode_batch,
                              prefill_chunk=prefill_chunk, staging_experts=staging_experts))
    plan.update(hidden_size=H, intermediate_size=I)
    return plan


def plan_file(path, *, top_k: int | None = None, **budget) -> dict:
    """The pool plan of an FTW file, from its header alone (no bank is read)."""
    from ..container import open as open_ftw

    f = open_ftw(path)
    try:
        E = {b.num_experts for banks in f.layers.values() for b in banks.values()}
        if len(E) != 1:
            raise FormatError(f"{f.path}: layers disagree on the expert count: {sorted(E)}")
        k = top_k or (f.model.top_k if f.model else 0)
        if not k:
            raise FtwError(f"{f.path}: the file names no top_k; give --top-k")
        by_fmt: dict[LayerFormat, tuple[list[int], dict[str, int]]] = {}
        for layer, banks in sorted(f.layers.items()):
            rows = {name: b.row_nbytes for name, b in banks.items()}
            fmt = f.layer_formats[layer]
            layers, known = by_fmt.setdefault(fmt, ([], rows))
            if known != rows:
                raise FormatError(f"{f.path}: layer {layer} ({fmt.key()}) has other row sizes than "
                                  f"layer {layers[0]} of the same format")
            layers.append(layer)
        groups = [(fmt, ls, rows) for fmt, (ls, rows) in by_fmt.items()]
        plan = _run_plan(_request(E.pop(), k, groups, **_budget(budget)))
        if f.model:
            plan.update(hidden_size=f.model.hidden_size, intermediate_size=f.model.moe_intermediate_size)
        return plan
    finally:
        f.close()


def _budget(b: dict) -> dict:
    return {"gpu_mem": b.get("gpu_mem"), "slots": b.get("slots"), "decode_batch": b.get("decode_batch", 0),
            "prefill_chunk": b.get("prefill_chunk", 0), "staging_experts": b.get("staging_experts", 8)}


# -- the pools ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerView:
    """PoolLayerView (csrc/pools/pool_view.h) as Python sees it: addresses as integers."""

    num_banks: int
    bank_base: tuple[int, ...]  # per bank of the format, in the format's order; 0 if absent
    row_bytes: tuple[int, ...]  # slot stride per bank; 0 if absent
    slot_of_expert: int  # address of [E] int32
    num_experts: int
    staging_half: int = -1  # Python only: the staging half a prefill pass reads, -1 = the cache

    @classmethod
    def of(cls, d: dict, staging_half: int = -1) -> "LayerView":
        return cls(d["num_banks"], tuple(d["bank_base"]), tuple(d["row_bytes"]), d["slot_of_expert"],
                   d["num_experts"], staging_half)


def _bytes_view(a):
    """A flat uint8 view (numpy or torch) of a contiguous bank, for nanobind."""
    if isinstance(a, np.ndarray):
        return np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    import torch

    return a.contiguous().reshape(-1).view(torch.uint8)


class SlotPools:
    """Slot pools over loaded expert banks (``ftw.load_expert_banks``; pin=True for CUDA).

    Budget: gpu_mem (bytes or '40GiB') or slots (cache slots over all pools). decode_batch=0
    plans the largest batch the budget allows in every pool; prefill_chunk > 0 plans staging.
    One caller at a time: the pools are not thread-safe.
    """

    def __init__(
        self, banks, *, gpu_mem: int | str | None = None, slots: int | None = None, top_k: int | None = None,
        decode_batch: int = 0, prefill_chunk: int = 0, staging_experts: int = 8, eviction: str = "lru",
        lam: float = DEFAULT_LRFU_LAMBDA, backend: str = "host", device: int = 0, stream: int | None = None,
    ):
        from .. import _runtime

        if eviction not in EVICTIONS:
            raise FtwError(f"eviction {eviction!r}: expected one of {', '.join(EVICTIONS)}")
        if backend not in BACKENDS:
            raise FtwError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
        k = top_k or (banks.model.top_k if banks.model else 0)
        if not k:
            raise FtwError("SlotPools: the banks name no top_k; pass top_k=")
        E = banks.num_experts
        groups = []
        for fmt, layers in banks.formats().items():
            rows = {}
            for name, per_layer in banks.banks.items():
                a = per_layer[layers[0]]
                n = _bytes_view(a).shape[0] // E if E else 0
                for layer in layers[1:]:
                    if _bytes_view(per_layer[layer]).shape[0] // E != n:
                        raise FormatError(f"bank {name} of layer {layer} ({fmt.key()}) has other rows than "
                                          f"layer {layers[0]} of the same format")
                if n:
                    rows[name] = n
            groups.append((fmt, layers, rows))
        req = _request(E, k, groups, gpu_mem=gpu_mem, slots=slots, decode_batch=decode_batch,
                       prefill_chunk=prefill_chunk, staging_experts=staging_experts)
        names = req["bank_names"]
        pools_by_key = {fmt.key(): fmt for fmt, _, _ in groups}
        self.formats = [pools_by_key[key] for key, _, _ in req["pools"]]
        format_banks = [[names.index(b) if b in names else -1 for b in get_format(f.name).bank_names]
                        for f in self.formats]
        self._p = _runtime.SlotPools(req, format_banks, eviction, lam, backend, device)
        self.plan = self._p.plan
        self.bank_names = names
        self.num_experts = E
        self.top_k = k
        self.eviction = eviction
        self._host = []  # keeps the host rows alive for as long as the pools read them
        for b, name in enumerate(names):
            for layer, a in banks.banks[name].items():
                flat = _bytes_view(a)
                if flat.shape[0]:
                    self._host.append(flat)
                    self._p.set_host_bank(b, layer, flat)
        if stream is not None:
            self._p.set_compute_stream(int(stream))

    @property
    def backend(self) -> str:
        return self._p.backend

    def pool_of(self, layer: int) -> int:
        return self._p.pool_of(layer)

    def set_compute_stream(self, stream: int) -> None:
        """The stream kernels run on (torch.cuda.current_stream().cuda_stream), as an integer."""
        self._p.set_compute_stream(int(stream))

    def request(self, layer: int, expert_ids) -> np.ndarray:
        """Makes the experts resident at once (one batch for the misses); their slots, in order."""
        ids = np.ascontiguousarray(np.asarray(expert_ids, dtype=np.int32).reshape(1, -1))
        return self._p.request(np.array([layer], dtype=np.int32), ids)[0]

    def decode_step(self, routed: Mapping[int, Any], join: bool = True) -> dict[int, np.ndarray]:
        """One decode step over several layers: their misses go out as one batch, or, where a
        pool cannot hold all its layers' experts at once, in consecutive groups of layers that
        it can hold (a single layer that does not fit is refused: CapacityError)."""
        self._p.begin_step()
        ids = {l: np.asarray(routed[l], dtype=np.int32).reshape(-1) for l in routed}
        out: dict[int, np.ndarray] = {l: np.empty(0, np.int32) for l, v in ids.items() if not v.size}
        layers = [l for l in ids if ids[l].size]
        for chunk in self._chunks(layers, ids):
            width = max(ids[l].size for l in chunk)
            arr = np.zeros((len(chunk), width), dtype=np.int32)
            for i, l in enumerate(chunk):  # pad with the row's first id: a repeat, never a new expert
                arr[i, : ids[l].size] = ids[l]
                arr[i, ids[l].size:] = ids[l][0]
            slots = self._p.request(np.array(chunk, dtype=np.int32), arr)
            for i, l in enumerate(chunk):
                out[l] = slots[i, : ids[l].size]
        if join:
            self._p.join(0)
        return out

    def _chunks(self, layers: list[int], ids: dict[int, np.ndarray]) -> list[list[int]]:
        cap = [p["slots"] for p in self.plan["pools"]]
        chunks, cur, used = [], [], [0] * len(cap)
        for l in layers:
            p = self._p.pool_of(l)
            n = len(set(ids[l].tolist()))
            if cur and used[p] + n > cap[p]:
                chunks.append(cur)
                cur, used = [], [0] * len(cap)
            cur.append(l)
            used[p] += n
        if cur:
            chunks.append(cur)
        return chunks

    def prefill_layer(self, layer: int, expert_ids) -> Iterator[tuple[LayerView, list[int]]]:
        """One layer of a prefill chunk, tokens grouped by expert: yields (view, experts) for
        the resident experts (the cache), then for each staged group. Each missing expert is
        copied once; the next group is copied while the caller computes the current one (the
        caller queues its kernel before asking for the next item). Evicts nothing."""
        ids = np.asarray(expert_ids, dtype=np.int32).reshape(-1).tolist()
        hits, groups = self._p.prefill(layer, ids)
        staged: list[tuple[int, dict]] = []  # (half, view) per group, staged two ahead
        for g in range(min(2, len(groups))):
            staged.append(self._stage(layer, groups[g]))
        if hits:
            self._p.join(0)
            yield self.view(layer), list(hits)
        for g, group in enumerate(groups):
            half, view = staged[g]
            self._p.join(1 + half)
            yield LayerView.of(view, half), list(group)
            self._p.release(1 + half)  # the kernel just queued is this half's last reader
            if g + 2 < len(groups):
                staged.append(self._stage(layer, groups[g + 2]))

    def _stage(self, layer: int, group: list[int]) -> tuple[int, dict]:
        view = self._p.stage(layer, group)
        return self._p.last_half(), view

    def prefill_step(self, routed: Mapping[int, Any], compute=None) -> None:
        """A prefill chunk over its layers; compute(layer, view, experts) runs each pass."""
        self._p.begin_step()
        for layer, ids in routed.items():
            for view, experts in self.prefill_layer(layer, ids):
                if compute is not None:
                    compute(layer, view, experts)

    def view(self, layer: int) -> LayerView:
        return LayerView.of(self._p.view(layer))

    def slot_of(self, layer: int, expert: int) -> int:
        return self._p.slot_of(layer, expert)

    def stats(self) -> dict[str, dict[str, int]]:
        return {p["format"]: dict(self._p.stats(i)) for i, p in enumerate(self.plan["pools"])}

    def reset_stats(self) -> None:
        self._p.reset_stats()

    def sync(self) -> None:
        self._p.sync()

    # device bytes, for tests and checks
    def read_slot(self, pool: int, bank: str, slot: int) -> bytes:
        return self._p.read_slot(pool, self.bank_names.index(bank), slot)

    def read_staging(self, half: int, pool: int, bank: str, index: int) -> bytes:
        return self._p.read_staging(half, pool, self.bank_names.index(bank), index)

    def read_table(self) -> np.ndarray:
        return np.asarray(self._p.read_table(), dtype=np.int32)

    @property
    def last_batch_calls(self) -> int:
        return self._p.last_batch_calls

    @property
    def last_kernel_calls(self) -> int:
        return self._p.last_kernel_calls


__all__ = ["CapacityError", "SlotPools", "LayerView", "plan_model", "plan_file", "parse_size", "format_row_bytes"]


def parse_format_specs(specs: Sequence[str], num_layers: int) -> dict[int, LayerFormat]:
    """`ftw plan` model flags: 'nvfp4' (every layer not named elsewhere), 'bf16:0,59',
    'gguf{"gate_up_type":"Q4_K","down_type":"Q6_K"}:3-5' -> {layer: LayerFormat}."""
    import json

    from ..layer_ranges import parse_layers

    out: dict[int, LayerFormat] = {}
    default: LayerFormat | None = None
    for text in specs:
        m = re.fullmatch(r"\s*([A-Za-z0-9_]+)\s*(\{.*\})?\s*(?::\s*(.+))?", text)
        if not m:
            raise FtwError(f"--format {text!r}: expected NAME, NAME:LAYERS or NAME{{json options}}:LAYERS")
        try:
            options = json.loads(m.group(2)) if m.group(2) else {}
        except json.JSONDecodeError as e:
            raise FtwError(f"--format {text!r}: options are not JSON ({e.msg})") from None
        fmt = LayerFormat.of(m.group(1), options, where=f"--format {text!r}")
        if m.group(3) is None:
            if default is not None:
                raise FtwError(f"--format {text!r}: only one format may go without layers (the default)")
            default = fmt
            continue
        for layer in parse_layers(m.group(3), num_layers) or []:
            if layer in out:
                raise FtwError(f"--format {text!r}: layer {layer} already has format {out[layer].key()}")
            out[layer] = fmt
    for layer in range(num_layers):
        if layer not in out:
            if default is None:
                raise FtwError(f"--format: layer {layer} has no format (give one without layers as the default)")
            out[layer] = default
    return out


def parse_slots(text: str, total_experts: int) -> int:
    """'768' or '10%' (of all experts, by count) -> slots."""
    t = text.strip()
    try:
        if t.endswith("%"):
            return int(float(t[:-1]) / 100 * total_experts)
        return int(t)
    except ValueError:
        raise FtwError(f"--slots {text!r}: expected a count or a share like 10%") from None
