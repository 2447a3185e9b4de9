"""load_expert_banks: an FTW file's banks in (pinned) host memory, keyed by bank then layer.

The bank set is the union over the model's formats; a layer whose format lacks a bank gets
an [E, 0] placeholder of zero bytes, so a runtime can index every bank by every layer and
launch no copy for the empty ones. Each format loads its own layers, then the parts are
merged (merge_expert_banks), which callers loading formats separately can use too.
"""

from __future__ import annotations

import os
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from . import spec
from .container import BankInfo, FtwFile, thread_count
from .errors import FtwError, MergeError
from .formats import LayerFormat, ModelShape

Progress = Callable[[int], None]
COPY_CHUNK = 16 << 20  # per-task copy size: large enough to amortize, small enough to spread


@dataclass
class ExpertBanks:
    banks: dict[str, dict[int, Any]]  # bank -> layer -> [E, *row_shape] array or tensor
    layer_formats: dict[int, LayerFormat]
    num_experts: int
    dtypes: dict[str, str] = field(default_factory=dict)  # bank -> ftw dtype name
    model: ModelShape | None = None
    pinned: bool = False

    @property
    def layers(self) -> list[int]:
        return sorted(self.layer_formats)

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(a) for per_layer in self.banks.values() for a in per_layer.values())

    def formats(self) -> dict[LayerFormat, list[int]]:
        """Layers grouped by format (what a runtime builds one slot pool per)."""
        groups: dict[LayerFormat, list[int]] = defaultdict(list)
        for layer in self.layers:
            groups[self.layer_formats[layer]].append(layer)
        return dict(groups)


def _nbytes(a) -> int:
    return a.nbytes if isinstance(a, np.ndarray) else a.numel() * a.element_size()


def _placeholder(like, num_experts: int):
    if isinstance(like, np.ndarray):
        return np.empty((num_experts, 0), dtype=like.dtype)
    import torch

    return torch.empty((num_experts, 0), dtype=like.dtype)


def merge_expert_banks(parts: Iterable[ExpertBanks]) -> ExpertBanks:
    """Union of separately loaded parts; fills [E, 0] placeholders for banks a layer lacks.

    A placeholder takes the bank's dtype from the lowest layer that has the bank with bytes
    (or, when every layer's is empty, the lowest layer that has it at all)."""
    parts = list(parts)
    if not parts:
        raise MergeError("merge_expert_banks: nothing to merge")
    experts = {p.num_experts for p in parts}
    if len(experts) != 1:
        raise MergeError(f"merge_expert_banks: parts disagree on the expert count: {sorted(experts)}")
    num_experts = experts.pop()
    formats: dict[int, LayerFormat] = {}
    banks: dict[str, dict[int, Any]] = defaultdict(dict)
    dtypes: dict[str, str] = {}
    for p in parts:
        overlap = set(formats) & set(p.layer_formats)
        if overlap:
            raise MergeError(f"merge_expert_banks: layer {min(overlap)} is in more than one part")
        formats.update(p.layer_formats)
        for name, per_layer in p.banks.items():
            banks[name].update(per_layer)
        for name, dt in p.dtypes.items():
            dtypes.setdefault(name, dt)
    for name, per_layer in banks.items():
        real = [l for l in sorted(per_layer) if _nbytes(per_layer[l])] or sorted(per_layer)
        like = per_layer[real[0]]
        for layer in formats:
            if layer not in per_layer:
                per_layer[layer] = _placeholder(like, num_experts)
        banks[name] = dict(sorted(per_layer.items()))
    return ExpertBanks(
        banks=dict(sorted(banks.items())),
        layer_formats=dict(sorted(formats.items())),
        num_experts=num_experts,
        dtypes=dtypes,
        model=next((p.model for p in parts if p.model), None),
        pinned=all(p.pinned for p in parts),
    )


class _Allocator:
    """numpy arrays; with pin, page-aligned buffers that become torch tensors once filled,
    page-locked in place where CUDA exists (ftw/pinned.py says why not cudaHostAlloc)."""

    def __init__(self, pin: bool):
        self.pin = pin
        self.pinned = False
        if pin:
            import torch

            self.pinned = torch.cuda.is_available()

    def empty(self, info: BankInfo) -> np.ndarray:
        dt = spec.numpy_dtype(info.dtype)
        if not self.pin:
            return np.empty(info.shape, dtype=dt)
        from .pinned import host_buffer

        return host_buffer(info.raw_nbytes).view(dt).reshape(info.shape)

    def finish(self, a: np.ndarray, info: BankInfo):
        if not self.pin:
            return a
        import torch

        from .pinned import as_tensor

        return as_tensor(a, getattr(torch, spec.DTYPES[info.dtype].torch), info.shape, self.pinned)


def _load_format(
    f: FtwFile, fmt: LayerFormat, layers: list[int], alloc: _Allocator, pool: ThreadPoolExecutor,
    progress: Progress,
) -> ExpertBanks:
    banks: dict[str, dict[int, Any]] = defaultdict(dict)
    dtypes: dict[str, str] = {}
    tasks = []
    filled: list[tuple[str, int, np.ndarray, BankInfo]] = []
    for layer in layers:
        for name, info in f.layers[layer].items():
            dst = alloc.empty(info)
            filled.append((name, layer, dst, info))
            dtypes.setdefault(name, info.dtype)
            tasks.extend(_copy_tasks(f, info, dst.reshape(-1).view(np.uint8)))
    for n in pool.map(lambda t: t(), tasks):
        progress(n)
    # page-locking is per bank and can overlap across threads too
    done = pool.map(lambda item: alloc.finish(item[2], item[3]), filled)
    for (name, layer, _, _), bank in zip(filled, done):
        banks[name][layer] = bank
    experts = {f.layers[l][b].num_experts for l in layers for b in f.layers[l]}
    return ExpertBanks(dict(banks), {l: fmt for l in layers}, experts.pop() if experts else 0,
                       dtypes, f.model, alloc.pinned)


def _copy_tasks(f: FtwFile, info: BankInfo, dst: np.ndarray) -> list[Callable[[], int]]:
    if info.codec != spec.RAW:
        row = info.row_nbytes

        def decode(e: int) -> int:
            f.read_row_into(info, e, dst[e * row : (e + 1) * row])
            return row

        return [lambda e=e: decode(e) for e in range(info.num_experts)]
    def copy(lo: int, hi: int) -> int:
        f.read_into(info.blob.offset + lo, dst[lo:hi])  # preadv releases the GIL
        return hi - lo

    return [lambda lo=lo: copy(lo, min(lo + COPY_CHUNK, info.blob.nbytes))
            for lo in range(0, info.blob.nbytes, COPY_CHUNK)]


def _check_fits(f: FtwFile, layers: list[int]) -> None:
    """Fail fast, naming the file, when the banks cannot fit in this machine's memory: a
    compressed bank may legally claim up to 32768 times its stored size (all-zero rows), so
    a 520 KiB file can ask for 16 GiB; better one clear error than an out-of-memory kill."""
    need = sum(b.raw_nbytes for layer in layers for b in f.layers[layer].values())
    try:
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return
    if need > have:
        raise FtwError(f"{f.path}: the banks of {len(layers)} layer(s) take {need} bytes decoded, more than "
                       f"this machine's {have} bytes of memory")


def load_expert_banks(
    path: str | os.PathLike | FtwFile,
    layers: Iterable[int] | None = None,
    pin: bool = False,
    threads: int | None = None,
    progress: Progress | None = None,
) -> ExpertBanks:
    """Load the expert banks of the given MoE layers (all when None).

    pin=True returns torch tensors in pinned host memory (plain torch tensors where CUDA is
    absent: ``ExpertBanks.pinned`` says which); otherwise numpy arrays. bf16 banks are
    uint16 in numpy and bfloat16 in torch."""
    from .container import open as open_ftw

    f = path if isinstance(path, FtwFile) else open_ftw(path)
    try:
        wanted = sorted(f.layers) if layers is None else sorted(set(layers))
        missing = [l for l in wanted if l not in f.layers]
        if missing:
            raise FtwError(f"{f.path}: no MoE layer {missing[0]} (has {sorted(f.layers)})")
        if not wanted:
            raise FtwError(f"{f.path}: no MoE layers to load")
        by_format: dict[LayerFormat, list[int]] = defaultdict(list)
        for layer in wanted:
            if f.layer_formats[layer].known:  # a runtime sizes buffers by the format: refuse a
                f.check_layer(layer)  # layer whose banks contradict it before anything is allocated
            by_format[f.layer_formats[layer]].append(layer)
        _check_fits(f, wanted)
        alloc = _Allocator(pin)
        f.mm  # map before the threads start: each would otherwise race to map the file
        with ThreadPoolExecutor(thread_count(threads, 8)) as pool:
            try:
                parts = [_load_format(f, fmt, ls, alloc, pool, progress or (lambda n: None))
                         for fmt, ls in by_format.items()]
            except BaseException:
                pool.shutdown(cancel_futures=True)  # don't finish copying a load that failed
                raise
        return merge_expert_banks(parts)
    finally:
        if f is not path:
            f.close()
