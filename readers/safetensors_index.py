"""A lazy index over the safetensors shards of one checkpoint folder.

Each shard's header is parsed once, here, without the safetensors library or torch: the
readers need byte offsets and exact dtypes (E8M0 scales must stay raw bytes), and a header
from a stranger must be bounded and checked before anything trusts it. Data is memory-mapped
on first use, and a tensor is handed out as a zero-copy numpy view of the map.

``bytes_read`` and ``touched`` count what was handed out, so a test (or a benchmark) can show
that reading one layer never maps another layer's bytes; ``on_read`` hooks see each tensor.
"""

from __future__ import annotations

import glob
import json
import mmap
import os
import struct
import threading
from dataclasses import dataclass
from math import prod
from typing import Callable, Iterable

import numpy as np

from ftw import mapped, spec
from ftw.errors import SourceError, UnsupportedError

from .base import load_json_object, open_regular

MAX_HEADER_NBYTES = 100 << 20
MAX_NDIM = 64  # numpy's limit
INDEX_FILE = "model.safetensors.index.json"

# safetensors dtype -> ftw dtype name; exotic types (F4, F6_*, C64...) are refused on use
ST_DTYPES = {
    "BF16": "bf16",
    "F16": "f16",
    "F32": "f32",
    "F64": "f64",
    "F8_E4M3": "f8_e4m3",
    "F8_E5M2": "f8_e5m2",
    "F8_E8M0": "e8m0",
    "I8": "i8",
    "U8": "u8",
    "I16": "i16",
    "U16": "u16",
    "I32": "i32",
    "U32": "u32",
    "I64": "i64",
    "U64": "u64",
    "BOOL": "bool",
}

# looked up per tensor: resolved once here rather than through spec.dtype() each time
_ITEMSIZE = {d: spec.DTYPES[d].itemsize for d in ST_DTYPES.values()}
_NUMPY = {d: np.dtype(spec.DTYPES[d].numpy) for d in ST_DTYPES.values()}


@dataclass(frozen=True)
class SafetensorsTensor:
    name: str
    shard: str  # path of the shard file
    st_dtype: str  # the header's spelling, kept for error messages
    dtype: str | None  # ftw dtype name; None when ftw does not know the type
    shape: tuple[int, ...]
    offset: int  # absolute offset of the first data byte in the shard
    nbytes: int


def _parse_header(path: str) -> tuple[dict[str, SafetensorsTensor], int]:
    """One shard's tensors, every offset checked against the file size. Returns (tensors, file size)."""
    fd = open_regular(path, "shard")
    try:
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise SourceError(f"{path}: truncated shard ({size} bytes, no header length)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_NBYTES:
                raise SourceError(f"{path}: header claims {n} bytes (limit {MAX_HEADER_NBYTES})")
            if 8 + n > size:
                raise SourceError(f"{path}: truncated shard: header claims {n} bytes, file has {size}")
            raw = f.read(n)
    except OSError as e:
        raise SourceError(f"{path}: cannot read shard: {e}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise SourceError(f"{path}: header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise SourceError(f"{path}: header must be a JSON object")
    base = 8 + n
    out: dict[str, SafetensorsTensor] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor {name!r}"
        if not isinstance(entry, dict):
            raise SourceError(f"{where}: header entry must be an object")
        st, shape, offs = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(st, str):
            raise SourceError(f"{where}: dtype must be a string, got {st!r:.40}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise SourceError(f"{where}: shape must be a list of non-negative integers")
        if len(shape) > MAX_NDIM:
            raise SourceError(f"{where}: {len(shape)} dimensions (numpy, and so ftw, handles at most {MAX_NDIM})")
        # [0, 2**64] holds no bytes, yet no array can have that shape: refuse it here
        if prod(max(d, 1) for d in shape) >= 1 << 63:
            raise SourceError(f"{where}: shape {shape} is too large for any array")
        if (
            not isinstance(offs, list)
            or len(offs) != 2
            or not all(type(o) is int for o in offs)
            or not 0 <= offs[0] <= offs[1]
        ):
            raise SourceError(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end")
        if base + offs[1] > size:
            raise SourceError(
                f"{where}: truncated shard: data ends at byte {base + offs[1]}, file has {size}"
            )
        dtype = ST_DTYPES.get(st)
        nbytes = offs[1] - offs[0]
        if dtype is not None and prod(shape) * _ITEMSIZE[dtype] != nbytes:
            raise SourceError(
                f"{where}: {st} x {shape} needs {prod(shape) * _ITEMSIZE[dtype]} bytes, "
                f"data_offsets give {nbytes}"
            )
        out[name] = SafetensorsTensor(name, path, st, dtype, tuple(shape), base + offs[0], nbytes)
    return out, size


def _shard_paths(folder: str) -> tuple[list[str], dict[str, str] | None]:
    """The shards to read, and the index's weight_map when the folder has an index."""
    index_path = os.path.join(folder, INDEX_FILE)
    if not os.path.exists(index_path):
        return sorted(glob.glob(os.path.join(glob.escape(folder), "*.safetensors"))), None
    weight_map = load_json_object(index_path, "index", MAX_HEADER_NBYTES).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise SourceError(f"{index_path}: weight_map must map tensor names to shard file names")
    first: dict[str, str] = {}
    for name, shard in weight_map.items():
        first.setdefault(shard, name)
    paths = []
    for shard, name in first.items():
        # a stranger's index must not point outside the folder
        if os.path.basename(shard) != shard or shard in ("", ".", ".."):
            raise SourceError(f"{index_path}: shard {shard!r} (for tensor {name!r}) is not a plain file name")
        p = os.path.join(folder, shard)
        if not os.path.lexists(p):
            raise SourceError(f"{index_path}: names shard {shard!r} (for tensor {name!r}), which does not exist")
        paths.append(p)
    return sorted(paths), weight_map




class SafetensorsIndex:
    def __init__(self, folder: str | os.PathLike, shards: Iterable[str] | None = None):
        self.folder = os.fspath(folder)
        weight_map = None
        if shards is None:
            shards, weight_map = _shard_paths(self.folder)
        self.shards = list(shards)
        if not self.shards:
            raise SourceError(f"{self.folder}: no *.safetensors shards")
        self._tensors: dict[str, SafetensorsTensor] = {}
        self._sizes: dict[str, int] = {}
        for path in self.shards:
            tensors, self._sizes[path] = _parse_header(path)
            for name, info in tensors.items():
                if name in self._tensors:
                    raise SourceError(
                        f"tensor {name!r} appears in two shards: {self._tensors[name].shard} and {path}"
                    )
                self._tensors[name] = info
        if weight_map is not None:
            self._check_index_names(weight_map)
        self._maps: dict[str, mmap.mmap] = {}
        self._views: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.touched: set[str] = set()
        self.on_read: list[Callable[[SafetensorsTensor], None]] = []

    def _check_index_names(self, weight_map: dict[str, str]) -> None:
        index_path = os.path.join(self.folder, INDEX_FILE)
        for name, shard in weight_map.items():
            info = self._tensors.get(name)
            if info is None or os.path.basename(info.shard) != shard:
                raise SourceError(f"{index_path}: tensor {name!r} is not in shard {shard!r}")

    def names(self) -> list[str]:
        return list(self._tensors)

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def __len__(self) -> int:
        return len(self._tensors)

    def info(self, name: str) -> SafetensorsTensor:
        """The tensor's header entry; raises when the tensor is absent or its dtype unknown."""
        try:
            info = self._tensors[name]
        except KeyError:
            raise SourceError(f"{self.folder}: no tensor {name!r} in any shard") from None
        if info.dtype is None:
            raise UnsupportedError(
                f"{info.shard}: tensor {name!r} has dtype {info.st_dtype!r}, which ftw does not "
                f"handle (known: {', '.join(ST_DTYPES)})"
            )
        return info

    def _map(self, path: str) -> mmap.mmap:
        mm = self._maps.get(path)
        if mm is None:
            with os.fdopen(open_regular(path, "shard"), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size != self._sizes[path]:
                    raise SourceError(f"{path}: shard changed size since it was opened ({self._sizes[path]} -> {size})")
                mm = mapped.FileMap(f.fileno(), path)  # the writer finds the file and offset behind a row view
            self._maps[path] = mm
        return mm

    def array(self, name: str) -> np.ndarray:
        """A read-only zero-copy view of the tensor's bytes, in the ftw dtype's numpy type."""
        view = self._views.get(name)
        if view is not None:
            # a reader that computes rows (gpt-oss) reads the map: a shard cut short since
            # must be an error here, not a SIGBUS there (the writer itself only preads)
            view_map = self._maps.get(self._tensors[name].shard)
            if view_map is not None:
                view_map.check_size()
            return view
        info = self.info(name)
        with self._lock:
            view = self._views.get(name)
            if view is not None:
                return view
            npd = _NUMPY[info.dtype]
            if info.nbytes == 0:
                view = np.empty(info.shape, dtype=npd)
            else:
                mm = self._map(info.shard)
                mm.check_size()
                # no populate: the writer copies the bytes behind a view without reading it
                flat = np.frombuffer(mm, dtype=np.uint8, count=info.nbytes, offset=info.offset)
                view = flat.view(npd).reshape(info.shape)
            self._views[name] = view
            self.bytes_read += info.nbytes
            self.touched.add(name)
        for hook in self.on_read:
            hook(info)
        return view

    def slab(self, name: str, e: int) -> np.ndarray:
        """Entry e of a stacked tensor ([E, ...] -> [...]) read with pread into fresh memory:
        for readers that compute a row from every byte of it (a transpose), so that a shard cut
        short is a SourceError naming it rather than a SIGBUS inside the map."""
        info = self.info(name)
        if not info.shape or not 0 <= e < info.shape[0]:
            raise SourceError(f"{info.shard}: tensor {name!r} {list(info.shape)} has no entry {e}")
        step = info.nbytes // info.shape[0]
        out = np.empty(info.shape[1:], dtype=_NUMPY[info.dtype])
        if step:
            with self._lock:
                mm = self._map(info.shard)
            mapped.read_exact(mm.source_fd, out.reshape(-1).view(np.uint8), info.offset + e * step, info.shard)
        with self._lock:
            self.bytes_read += step
            self.touched.add(name)
        for hook in self.on_read:
            hook(info)
        return out

    def release_pages(self) -> None:
        with self._lock:
            for mm in self._maps.values():
                mapped.release_pages(mm)

    def close(self) -> None:
        with self._lock:
            self._views.clear()
            for mm in self._maps.values():
                try:
                    mm.close()
                except BufferError:
                    pass  # a caller still holds a view; the map closes when the view dies
            self._maps.clear()
