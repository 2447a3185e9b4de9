"""Reading FTW v1 containers: open from the footer and index alone, data through a memory map.

Opening reads three small ranges (preamble, footer, index) whatever the file size, and checks
every offset, size, dtype and shape in the index before any of it is used: a file from a
stranger can make ``open`` or ``verify`` raise a FormatError, never read outside the file.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import re
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from math import prod
from typing import Any, Callable, Iterator

import numpy as np
import xxhash

from . import spec
from .errors import ChecksumError, FormatError, FtwError
from .mapped import read_exact
from .formats import LayerFormat, ModelShape


@dataclass(frozen=True)
class Blob:
    offset: int
    nbytes: int
    xxh3: str


@dataclass(frozen=True)
class BankInfo:
    layer: int
    name: str
    dtype: str
    shape: tuple[int, ...]  # [E, *row_shape]
    codec: str
    blob: Blob
    row_table: Blob | None  # compressed banks only

    @property
    def num_experts(self) -> int:
        return self.shape[0]

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    @property
    def row_nbytes(self) -> int:
        return prod(self.row_shape) * spec.DTYPES[self.dtype].itemsize

    @property
    def raw_nbytes(self) -> int:
        return self.row_nbytes * self.num_experts


@dataclass(frozen=True)
class StoredTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    blob: Blob
    meta: dict


class _Index:
    """Validates the index JSON, naming the offending path, before anything uses it."""

    def __init__(self, path: str, data_end: int):
        self.path = path
        self.data_end = data_end
        self.extents: list[tuple[int, int, str]] = []

    def fail(self, where: str, msg: str) -> FormatError:
        return FormatError(f"{self.path}: index {where}: {msg}")

    def obj(self, v: Any, where: str) -> dict:
        if not isinstance(v, dict):
            raise self.fail(where, "expected an object")
        return v

    def int(self, v: Any, where: str) -> int:
        if type(v) is not int or v < 0:
            raise self.fail(where, f"expected a non-negative integer, got {v!r:.40}")
        return v

    def blob(self, v: Any, where: str) -> Blob:
        d = self.obj(v, where)
        offset = self.int(d.get("offset"), where + ".offset")
        nbytes = self.int(d.get("nbytes"), where + ".nbytes")
        digest = d.get("xxh3")
        # int(x, 16) would also take "0x..", "_", signs and upper case, none of which can
        # ever equal a hexdigest(): refuse them here rather than as a checksum mismatch later
        if not isinstance(digest, str) or not _HEX16.fullmatch(digest):
            raise self.fail(where, "xxh3 must be 16 lower-case hex digits")
        if offset % spec.ALIGNMENT:
            raise self.fail(where, f"offset {offset} is not {spec.ALIGNMENT}-aligned")
        if offset < spec.ALIGNMENT or offset + nbytes > self.data_end:
            raise self.fail(
                where, f"bytes [{offset}, {offset + nbytes}) outside the data area "
                f"[{spec.ALIGNMENT}, {self.data_end})"
            )
        if nbytes:
            self.extents.append((offset, offset + nbytes, where))
        return Blob(offset, nbytes, digest)

    def dtype_shape(self, d: dict, where: str) -> tuple[str, tuple[int, ...]]:
        dt = d.get("dtype")
        if not isinstance(dt, str) or dt not in spec.DTYPES:  # a list or object is unhashable
            raise self.fail(where, f"unknown dtype {dt!r}")
        shape = d.get("shape")
        if not isinstance(shape, list) or len(shape) > spec.MAX_DIMS:
            raise self.fail(where, f"shape must be a list of at most {spec.MAX_DIMS} dimensions")
        dims = tuple(self.int(x, where + ".shape") for x in shape)
        problem = spec.shape_problem(dims, spec.DTYPES[dt].itemsize)
        if problem:
            raise self.fail(where, problem)
        return dt, dims

    def check_overlaps(self) -> None:
        self.extents.sort()
        for (s0, e0, w0), (s1, e1, w1) in zip(self.extents, self.extents[1:]):
            if s1 < e0:
                raise FormatError(f"{self.path}: index: {w1} overlaps {w0}")


class FtwFile:
    """An open FTW container. Use as a context manager or call close()."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            # O_NONBLOCK: a FIFO given as the path must be refused, not waited on
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            raise FtwError(f"{self.path}: cannot open: {e.strerror}") from None
        self._mm: mmap.mmap | None = None
        self._tables: dict[tuple[int, str], np.ndarray] = {}
        # rows, tensors and attachments read with pread into fresh memory instead of handed
        # out as views of the map: a file cut short while it is read is then a FormatError
        # naming it, never a SIGBUS. `ftw check` turns it on; zero-copy views stay the default.
        self.pread_only = False
        try:
            self._read_index()
        except BaseException:
            os.close(self._fd)
            raise

    # -- opening ------------------------------------------------------------------------
    def _pread(self, n: int, offset: int) -> bytes:
        try:
            data = os.pread(self._fd, n, offset)
        except OSError as e:
            raise FtwError(f"{self.path}: cannot read at offset {offset}: {e.strerror}") from None
        if len(data) != n:
            raise FormatError(f"{self.path}: short read at offset {offset}")
        return data

    def _read_index(self) -> None:
        st = os.fstat(self._fd)
        if not stat.S_ISREG(st.st_mode):
            raise FormatError(f"{self.path}: not a regular file")
        self.size = st.st_size
        if self.size < spec.MIN_FILE_NBYTES:
            raise FormatError(
                f"{self.path}: {self.size} bytes is too small for an FTW file "
                f"(at least {spec.MIN_FILE_NBYTES}); truncated?"
            )
        magic, pmajor, pminor = spec.PREAMBLE.unpack(self._pread(spec.PREAMBLE.size, 0))
        if magic != spec.PREAMBLE_MAGIC:
            raise FormatError(f"{self.path}: not an FTW file (bad magic {magic!r})")
        # a later major may move or reshape the footer: refuse it before reading the footer
        if pmajor != spec.MAJOR:
            raise FormatError(
                f"{self.path}: FTW major version {pmajor}; this ftw reads version {spec.MAJOR}"
            )
        footer = self._pread(spec.FOOTER.size, self.size - spec.FOOTER.size)
        fmagic, major, minor, _flags, offset, nbytes, index_hash, footer_hash = spec.FOOTER.unpack(footer)
        if fmagic != spec.FOOTER_MAGIC:
            raise FormatError(f"{self.path}: no FTW footer at the end of the file (truncated?)")
        if xxhash.xxh3_64_intdigest(footer[:-8]) != footer_hash:
            raise ChecksumError(f"{self.path}: footer checksum mismatch")
        if major != spec.MAJOR:
            raise FormatError(
                f"{self.path}: FTW major version {major}; this ftw reads version {spec.MAJOR}"
            )
        if (pmajor, pminor) != (major, minor):
            # the preamble is outside every checksum: this is how a flip in it is caught
            raise FormatError(
                f"{self.path}: preamble says version {pmajor}.{pminor}, footer {major}.{minor}"
            )
        self.version = (major, minor)
        if nbytes > spec.MAX_INDEX_NBYTES:
            raise FormatError(
                f"{self.path}: index of {nbytes} bytes exceeds the cap of {spec.MAX_INDEX_NBYTES}"
            )
        if offset < spec.ALIGNMENT or offset + nbytes != self.size - spec.FOOTER.size:
            raise FormatError(
                f"{self.path}: index [{offset}, {offset + nbytes}) must end where the footer "
                f"starts ({self.size - spec.FOOTER.size}); truncated or appended to?"
            )
        raw = self._pread(nbytes, offset)
        if xxhash.xxh3_64_intdigest(raw) != index_hash:
            raise ChecksumError(f"{self.path}: index checksum mismatch")
        try:
            index = json.loads(raw.decode("utf-8"), parse_constant=_not_json)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise FormatError(f"{self.path}: index is not valid JSON: {e}") from None
        self._parse(index, _Index(self.path, offset))

    def _parse(self, index: Any, v: _Index) -> None:
        index = v.obj(index, "root")
        self.model = None
        if index.get("model") is not None:
            self.model = ModelShape.from_json(index["model"], f"{self.path}: index model")
        self.provenance = index.get("provenance") if isinstance(index.get("provenance"), dict) else {}
        self.selection = Selection.from_json(index.get("selection"), f"{self.path}: index selection")

        formats = v.obj(index.get("layer_quant_formats", {}), "layer_quant_formats")
        layers = v.obj(index.get("layers", {}), "layers")
        self.layer_formats: dict[int, LayerFormat] = {}
        self.layers: dict[int, dict[str, BankInfo]] = {}
        if len(layers) > spec.MAX_LAYERS:  # fail fast: 300,000 layers would take minutes to parse
            raise v.fail("layers", f"{len(layers)} layers, past the format's limit of {spec.MAX_LAYERS} (FORMAT.md 1.1)")
        for key, entry in layers.items():
            where = f"layers.{key}"
            layer = _layer_id(key, v, where)
            if key not in formats:
                raise v.fail(where, "has no entry in layer_quant_formats")
            self.layer_formats[layer] = LayerFormat.from_json(formats[key], f"{self.path}: {where}")
            banks = v.obj(v.obj(entry, where).get("banks"), where + ".banks")
            self.layers[layer] = {
                name: self._bank(layer, name, d, v, f"{where}.banks.{name}") for name, d in banks.items()
            }
            experts = {b.num_experts for b in self.layers[layer].values()}
            if len(experts) > 1:
                raise v.fail(where, f"banks disagree on the expert count: {sorted(experts)}")
        extra = set(formats) - set(layers)
        if extra:
            raise v.fail("layer_quant_formats", f"layer {sorted(extra)[0]} has a format but no banks")

        self.tensors: dict[str, StoredTensor] = {}
        for name, d in v.obj(index.get("tensors", {}), "tensors").items():
            where = f"tensors.{name}"
            d = v.obj(d, where)
            dt, shape = v.dtype_shape(d, where)
            blob = v.blob(d, where)
            if blob.nbytes != prod(shape) * spec.DTYPES[dt].itemsize:
                raise v.fail(where, f"{blob.nbytes} bytes do not hold {dt} {list(shape)}")
            meta = d.get("meta") if isinstance(d.get("meta"), dict) else {}
            self.tensors[name] = StoredTensor(name, dt, shape, blob, meta)

        self.attachments: dict[str, Blob] = {
            name: v.blob(d, f"attachments.{name}")
            for name, d in v.obj(index.get("attachments", {}), "attachments").items()
        }
        v.check_overlaps()

    def _bank(self, layer: int, name: str, d: Any, v: _Index, where: str) -> BankInfo:
        d = v.obj(d, where)
        dt, shape = v.dtype_shape(d, where)
        if not shape:
            raise v.fail(where, "a bank's shape starts with the expert count")
        if shape[0] > spec.MAX_EXPERTS:
            raise v.fail(where, f"{shape[0]} experts, past the format's limit of {spec.MAX_EXPERTS} (FORMAT.md 1.1)")
        codec = d.get("codec")
        if not isinstance(codec, str) or codec not in spec.CODECS:
            raise v.fail(where, f"unknown codec {codec!r}")
        blob = v.blob(d, where)
        info = BankInfo(layer, name, dt, shape, codec, blob, None)
        if codec == spec.RAW:
            if blob.nbytes != info.raw_nbytes:
                raise v.fail(where, f"{blob.nbytes} bytes do not hold {dt} {list(shape)}")
            return info
        table = v.blob(d.get("row_table"), where + ".row_table")
        if table.nbytes != 8 * (info.num_experts + 1):
            raise v.fail(where, f"row table of {table.nbytes} bytes for {info.num_experts} experts")
        if info.raw_nbytes > spec.ZSTD_MAX_RATIO * blob.nbytes:
            # no zstd frame expands further: the shape lies, and trusting it would allocate it
            raise v.fail(where, f"{blob.nbytes} compressed bytes cannot hold {dt} {list(shape)}")
        return dataclasses.replace(info, row_table=table)

    # -- data ---------------------------------------------------------------------------
    def _fd_open(self) -> int:
        if self._fd < 0:
            raise FtwError(f"{self.path}: the file is closed")
        return self._fd

    @property
    def mm(self) -> mmap.mmap:
        self._fd_open()
        size = os.fstat(self._fd).st_size
        if size < self.size:  # a page of the map past the new end would be a SIGBUS in its reader
            raise FormatError(f"{self.path}: file shrank from {self.size} to {size} bytes while open")
        if self._mm is None:
            try:
                self._mm = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
            except OSError as e:
                raise FtwError(f"{self.path}: cannot map the file: {e.strerror or e}") from None
        return self._mm

    def _bytes_at(self, offset: int, n: int) -> np.ndarray:
        """File bytes [offset, offset + n) as uint8: a view of the map, or a pread copy."""
        if self.pread_only:
            out = np.empty(n, np.uint8)
            self.read_into(offset, out)
            return out
        return np.frombuffer(self.mm, np.uint8, n, offset)

    def blob_bytes(self, blob: Blob) -> memoryview:
        return memoryview(self.mm)[blob.offset : blob.offset + blob.nbytes]

    def read_into(self, offset: int, dst: np.ndarray) -> None:
        """pread file bytes [offset, offset + dst.nbytes) into dst (contiguous). Loading
        through read() skips the page faults a copy out of the map takes on every 4 KiB."""
        view = memoryview(dst.reshape(-1).view(np.uint8))
        end = offset + len(view)
        if offset < 0 or end > self.size:
            raise FormatError(f"{self.path}: read of [{offset}, {end}) past the end of the file")
        fd = self._fd_open()
        while view:
            n = os.preadv(fd, [view], offset)
            if n <= 0:
                raise FormatError(f"{self.path}: file shrank while reading at offset {offset}")
            view, offset = view[n:], offset + n

    def bank_info(self, layer: int, name: str) -> BankInfo:
        try:
            return self.layers[layer][name]
        except KeyError:
            if layer not in self.layers:
                raise FtwError(f"{self.path}: no MoE layer {layer} (has {sorted(self.layers)})") from None
            raise FtwError(
                f"{self.path}: layer {layer} ({self.layer_formats[layer]}) has no bank {name!r} "
                f"(has {sorted(self.layers[layer])})"
            ) from None

    def layer_dims(self, layer: int) -> tuple[int, int]:
        """(H, I) of a layer: from the model, or, in a file whose index has no model, from the
        layer's own bank shapes as its format lays them out (docs/FORMAT.md)."""
        if self.model is not None:
            return self.model.hidden_size, self.model.intermediate_size(layer)
        fmt = self.layer_formats[layer]
        shapes = {n: b.row_shape for n, b in self.bank_info_of(layer).items()}
        try:
            return fmt.format.infer_dims(shapes, fmt.options)
        except (KeyError, IndexError, ZeroDivisionError):
            raise FormatError(f"{self.path}: layer {layer} ({fmt}): banks {sorted(shapes)} do not give H and I") from None

    def bank_info_of(self, layer: int) -> dict[str, BankInfo]:
        if layer not in self.layers:
            raise FtwError(f"{self.path}: no MoE layer {layer} (has {sorted(self.layers)})")
        return self.layers[layer]

    def check_layer(self, layer: int) -> None:
        """The layer's banks against its format (names, dtypes, row shapes): FormatError naming
        the layer and bank; UnsupportedError for a format this ftw does not know. A file opens
        without this; decoding, loading for a runtime, checking and verifying run it."""
        fmt = self.layer_formats[layer]
        H, I = self.layer_dims(layer)
        shapes = {n: (b.dtype, b.row_shape) for n, b in self.bank_info_of(layer).items()}
        fmt.format.check_banks(shapes, H, I, fmt.options, f"{self.path}: layer {layer} ({fmt})", reading=True)

    def decode_expert(self, layer: int, expert: int) -> dict[str, np.ndarray]:
        """One expert's float64 weights through its format's reference decoder."""
        self.check_layer(layer)
        H, I = self.layer_dims(layer)
        rows = {n: self.expert_row(layer, n, expert) for n in self.layers[layer]}
        return self.layer_formats[layer].decode(rows, H, I)

    def bank(self, layer: int, name: str) -> np.ndarray:
        """[E, *row_shape]: a zero-copy view of the map for raw banks, decompressed otherwise."""
        info = self.bank_info(layer, name)
        dt = spec.numpy_dtype(info.dtype)
        if info.codec == spec.RAW:
            return np.frombuffer(self.mm, dtype=dt, count=prod(info.shape), offset=info.blob.offset).reshape(info.shape)
        out = np.empty(info.shape, dtype=dt)
        for e in range(info.num_experts):
            self.read_row_into(info, e, out[e])
        return out

    def expert_row(self, layer: int, name: str, expert: int) -> np.ndarray:
        info = self.bank_info(layer, name)
        if not 0 <= expert < info.num_experts:
            raise FtwError(f"{self.path}: layer {layer} bank {name}: no expert {expert} (E={info.num_experts})")
        if info.codec == spec.RAW:
            offset = info.blob.offset + expert * info.row_nbytes
            return self._bytes_at(offset, info.row_nbytes).view(spec.numpy_dtype(info.dtype)).reshape(info.row_shape)
        out = np.empty(info.row_shape, dtype=spec.numpy_dtype(info.dtype))
        self.read_row_into(info, expert, out)
        return out

    def row_frame(self, info: BankInfo, expert: int) -> memoryview:
        """The stored (compressed) bytes of one expert row."""
        table = self._row_table(info)
        start, end = int(table[expert]), int(table[expert + 1])
        return memoryview(self._bytes_at(info.blob.offset + start, end - start))

    def read_row_into(self, info: BankInfo, expert: int, out: np.ndarray) -> None:
        """Decode expert's row into out (any array of row_nbytes bytes, contiguous)."""
        dst = out.reshape(-1).view(np.uint8)
        if info.codec == spec.RAW:
            start = info.blob.offset + expert * info.row_nbytes
            if self.pread_only:
                self.read_into(start, dst)
            else:
                dst[:] = np.frombuffer(self.mm, np.uint8, info.row_nbytes, start)
            return
        if info.codec == spec.ZSTD_BYTESPLIT:
            planes = np.empty(info.row_nbytes, np.uint8)  # the planes must be interleaved anyway
            self.decode_frame(info, expert, planes)
            _join_planes(planes, spec.DTYPES[info.dtype].itemsize, dst)
        else:
            self.decode_frame(info, expert, dst)  # straight into the destination: no extra copy

    def decode_frame(self, info: BankInfo, expert: int, dst: np.ndarray, frame: memoryview | None = None) -> None:
        """Prove expert's slot is exactly one zstd frame declaring row_nbytes (checked before
        anything is decoded) and decode it into dst (u8, row_nbytes, contiguous); FormatError
        naming the row otherwise (docs/FORMAT.md, rule 14). frame: the slot's stored bytes
        where the caller has read them already (verify); else they come from the map."""
        import zstandard

        where = f"{self.path}: layer {info.layer} bank {info.name} expert {expert}"
        if frame is None:
            frame = self.row_frame(info, expert)
        try:
            declared = zstandard.frame_content_size(frame)
            stored = _zstd_frame_nbytes(frame)
        except (zstandard.ZstdError, ValueError) as e:
            raise FormatError(f"{where}: corrupt zstd frame header ({e})") from None
        if stored != len(frame):
            # a decoder would silently ignore what follows the frame (even a second one)
            raise FormatError(f"{where}: the row's {len(frame)} bytes hold a {stored}-byte zstd frame")
        if declared != info.row_nbytes:
            raise FormatError(
                f"{where}: zstd frame declares {declared} bytes, the row has {info.row_nbytes}"
            )
        view, got = memoryview(dst), 0
        try:
            with zstandard.ZstdDecompressor().stream_reader(frame, read_across_frames=False) as r:
                while got < len(view):
                    n = r.readinto(view[got:])
                    if not n:
                        break
                    got += n
                more = r.read(1)  # runs the frame to its end: its checksum, bytes beyond the size
        except zstandard.ZstdError as e:
            raise FormatError(f"{where}: corrupt zstd frame ({e})") from None
        if got != info.row_nbytes or more:
            raise FormatError(f"{where}: row decodes to {'more than ' if more else ''}{got} bytes, "
                              f"expected {info.row_nbytes}")

    def _row_table(self, info: BankInfo) -> np.ndarray:
        key = (info.layer, info.name)
        if key not in self._tables:
            t = np.empty(info.num_experts + 1, "<u8")  # pread, not the map: see _decode_rows
            read_exact(self._fd_open(), t, info.row_table.offset, self.path, FormatError)
            if t[0] != 0 or t[-1] != info.blob.nbytes or np.any(np.diff(t.astype(np.int64)) < 0) or np.any(t > info.blob.nbytes):
                raise FormatError(
                    f"{self.path}: layer {info.layer} bank {info.name}: row table does not "
                    f"partition the bank's {info.blob.nbytes} bytes"
                )
            self._tables[key] = t
        return self._tables[key]

    def tensor(self, name: str) -> np.ndarray:
        try:
            info = self.tensors[name]
        except KeyError:
            raise FtwError(f"{self.path}: no tensor {name!r}") from None
        dt = spec.numpy_dtype(info.dtype)
        return self._bytes_at(info.blob.offset, info.blob.nbytes).view(dt).reshape(info.shape)

    def attachment(self, name: str) -> bytes:
        try:
            blob = self.attachments[name]
            return self._bytes_at(blob.offset, blob.nbytes).tobytes()
        except KeyError:
            raise FtwError(f"{self.path}: no attachment {name!r} (has {sorted(self.attachments)})") from None

    # -- integrity ----------------------------------------------------------------------
    def blobs(self) -> Iterator[tuple[str, Blob]]:
        """Every blob with a label naming what it holds: 'layer 3 bank gate_up', 'tensor x'."""
        for layer, banks in sorted(self.layers.items()):
            for name, b in banks.items():
                yield f"layer {layer} bank {name}", b.blob
                if b.row_table is not None:
                    yield f"layer {layer} bank {name} row table", b.row_table
        for name, t in self.tensors.items():
            yield f"tensor {name}", t.blob
        for name, blob in self.attachments.items():
            yield f"attachment {name}", blob

    def verify(self, threads: int | None = None, progress: Callable[[int], None] | None = None) -> int:
        """Check every blob's checksum (and every compressed bank's row table); returns bytes
        checked. Raises ChecksumError naming the first bad blob in file order."""
        items = sorted(self.blobs(), key=lambda x: x[1].offset)
        progress = progress or (lambda n: None)

        def check(item: tuple[str, Blob]) -> str | None:
            label, blob = item
            # pread into a small buffer, not the map: a file cut short under verify is a
            # FormatError naming it, not a SIGBUS, at the rate of the map (ftw/mapped.py)
            h = xxhash.xxh3_64()
            piece = 1 << 20  # stays in L2 between the read and the hash
            buf = memoryview(bytearray(min(piece, blob.nbytes)))
            for start in range(0, blob.nbytes, piece):
                part = buf[: min(piece, blob.nbytes - start)]
                read_exact(self._fd, part, blob.offset + start, self.path, FormatError)
                h.update(part)
                progress(len(part))
            return None if h.hexdigest() == blob.xxh3 else label

        self.mm  # map before the threads start: each would otherwise race to map the file
        with ThreadPoolExecutor(thread_count(threads, 4)) as pool:
            for label in pool.map(check, items):
                if label is not None:
                    pool.shutdown(cancel_futures=True)  # the rest of the file needs no hashing
                    raise ChecksumError(f"{self.path}: {label}: checksum mismatch (data corrupt)")
            # then every compressed row, on the same threads: exactly one frame that decodes
            # to the declared size (rule 14), not only when someone reads it later
            compressed = [b for banks in self.layers.values() for b in banks.values() if b.row_table is not None]
            tasks = []
            for b in compressed:
                self._row_table(b)  # checked (and cached) here, not raced for by the threads
                step = max(1, FRAME_TASK_NBYTES // max(b.row_nbytes, 1))
                tasks += [(b, lo, min(lo + step, b.num_experts)) for lo in range(0, b.num_experts, step)]
            try:
                for _ in pool.map(self._decode_rows, tasks):
                    pass
            except BaseException:
                pool.shutdown(cancel_futures=True)
                raise
        for layer, fmt in self.layer_formats.items():
            if fmt.known:  # a newer writer's format opens and verifies; computing it refuses
                self.check_layer(layer)
        return sum(b.nbytes for _, b in items)

    def _decode_rows(self, task: tuple[BankInfo, int, int]) -> None:
        """verify's frame pass over rows lo..hi: their stored bytes read with pread (like the
        checksum pass: a file cut short is a FormatError, not a SIGBUS), each decoded into
        one scratch row."""
        info, lo, hi = task
        table = self._row_table(info)
        sizes = np.diff(table[lo : hi + 1].astype(np.int64))
        stored = memoryview(np.empty(int(sizes.max(initial=0)), np.uint8))  # reused: no fresh pages per row
        scratch = np.empty(info.row_nbytes, np.uint8)
        fd = self._fd_open()
        for e in range(lo, hi):
            frame = stored[: int(table[e + 1] - table[e])]
            read_exact(fd, frame, info.blob.offset + int(table[e]), self.path, FormatError)
            self.decode_frame(info, e, scratch, frame)

    # -- lifetime -----------------------------------------------------------------------
    def close(self) -> None:
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # zero-copy views still alive keep the map; it goes with them
            self._mm = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "FtwFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
FRAME_TASK_NBYTES = 32 << 20  # decoded bytes per verify task: spreads a big bank over threads


def thread_count(threads: int | None, default: int) -> int:
    """A thread count as callers give it: None for the default (capped by the cores), else
    an int >= 1; anything else is an FtwError, not ThreadPoolExecutor's ValueError."""
    if threads is None:
        return min(default, os.cpu_count() or 1)
    if type(threads) is not int or threads < 1:
        raise FtwError(f"threads must be an integer >= 1, got {threads!r:.40}")
    return threads


def _zstd_frame_nbytes(frame: memoryview) -> int:
    """The stored size of the zstd frame that starts frame (RFC 8878 3.1.1), from its block
    headers alone; ValueError where the blocks run past the end or a header is invalid."""
    import zstandard

    if bytes(frame[:4]) != ZSTD_MAGIC:
        raise ValueError("not a zstd frame (skippable frames and others are not rows)")
    pos = zstandard.frame_header_size(frame)  # magic and frame header
    checksum = 4 if frame[4] & 0x04 else 0
    while True:
        if pos + 3 > len(frame):
            raise ValueError("frame cut short")
        header = int.from_bytes(frame[pos : pos + 3], "little")
        last, kind, size = header & 1, (header >> 1) & 3, header >> 3
        if kind == 3:
            raise ValueError("reserved block type")
        pos += 3 + (1 if kind == 1 else size)  # an RLE block stores its one byte
        if last:
            return pos + checksum


def _join_planes(planes: np.ndarray, itemsize: int, dst: np.ndarray) -> None:
    """Undo the byte-plane split into dst (u8). numpy's transposed copy runs at ~0.5 GB/s,
    slower than zstd itself; 16-bit items are rebuilt arithmetically instead (~15x faster)."""
    p = planes.reshape(itemsize, -1)
    if itemsize == 2:
        d = dst.view("<u2")
        np.left_shift(p[1], 8, out=d, dtype=np.uint16)
        np.bitwise_or(d, p[0], out=d)
    else:
        items = dst.reshape(-1, itemsize)
        for i in range(itemsize):
            items[:, i] = p[i]


_HEX16 = re.compile("[0-9a-f]{16}")


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


@dataclasses.dataclass(frozen=True)
class Selection:
    """What part of the source a conversion took (`--layers`, `--experts-only`).

    The layers in the file are the keys of the index's `layers`; `layers` here is what was
    asked for (None: every MoE layer of the model), and `experts_only` says whether the
    non-expert tensors were left out. Files without the record hold the whole source."""

    layers: tuple[int, ...] | None = None
    experts_only: bool = False

    @property
    def partial(self) -> bool:
        return self.layers is not None or self.experts_only

    def to_json(self) -> dict:
        return {"layers": None if self.layers is None else list(self.layers), "experts_only": self.experts_only}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "Selection":
        if obj is None:
            return cls()
        if not isinstance(obj, dict):
            raise FormatError(f"{where}: must be an object")
        layers, experts_only = obj.get("layers"), obj.get("experts_only", False)
        if layers is not None and not (isinstance(layers, list) and all(type(x) is int and x >= 0 for x in layers)):
            raise FormatError(f"{where}: layers must be null or a list of layer indices")
        if type(experts_only) is not bool:
            raise FormatError(f"{where}: experts_only must be true or false")
        return cls(None if layers is None else tuple(layers), experts_only)


def _layer_id(key: str, v: _Index, where: str) -> int:
    # str.isdigit() also takes "²" and Arabic-Indic digits, and "03" would alias "3"
    layer = spec.decimal_index(key)
    if layer is None:
        raise v.fail(where, "layer keys are decimal layer indices without leading zeros")
    if layer >= spec.MAX_LAYERS:
        raise v.fail(where, f"layer index {layer} is past the format's limit ({spec.MAX_LAYERS} layers, FORMAT.md 1.1)")
    return layer


def open(path: str | os.PathLike) -> FtwFile:  # noqa: A001 - mirrors the builtin, as gguf/safetensors do
    return FtwFile(path)
