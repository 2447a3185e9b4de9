"""A GGUF header parser of our own: key/values, tensor infos, and zero-copy tensor views.

gguf.GGUFReader builds every tensor's numpy view while it parses, so a type id it does not
know (newer llama.cpp's Q2_0 = 42) or a tensor past the end of a truncated file raises deep
inside the package. Parsing the header here lets every problem become one ftw error naming
the file and the tensor, and lets nothing but the header be read at open.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from ftw import mapped
from ftw.errors import SourceError, UnsupportedError
from ftw.formats.ggml_types import FLOAT_DTYPES, GgmlType, ggml_type, known_types  # noqa: F401 (re-exported)

from .base import open_regular

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NESTING = 8  # arrays of arrays: llama.cpp writes none; 2,000 levels would exhaust the stack

# GGUF value types
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


@dataclass
class KV:
    key: str
    type: int  # GGUF value type
    value: Any  # python scalar, str, or list (numeric arrays as numpy arrays)
    raw: bytes  # the key/value's bytes in the file, key included (copied verbatim)
    sub_type: int | None = None


@dataclass(frozen=True)
class GgufTensor:
    name: str
    type: GgmlType
    ne: tuple[int, ...]  # ggml order: ne[0] is the fastest axis (values per row)
    offset: int  # absolute, in the shard file
    nbytes: int
    shard: int

    @property
    def row_nbytes(self) -> int:
        return self.type.row_nbytes(self.ne[0])

    @property
    def byte_shape(self) -> tuple[int, ...]:
        """numpy (C order) shape of the raw bytes: dims reversed, the row as its byte count."""
        return tuple(reversed(self.ne[1:])) + (self.row_nbytes,)


class _Cursor:
    """Bounds-checked little-endian reads over the header, naming what was being read.

    The header is read with pread, growing a buffer as the parse needs it, never through the
    memory map: a page fault on the map pulls in a read-around window (MBs on some disks),
    while a header read brings in little more than the header itself.
    """

    CHUNK = 256 << 10

    def __init__(self, fd: int, size: int, path: str):
        self.fd, self.path, self.pos, self.size = fd, path, 0, size
        self.buf = b""

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise SourceError(
                f"{self.path}: truncated GGUF header: {what} needs bytes [{self.pos}, {self.pos + n}) "
                f"but the file has {self.size}"
            )
        end = self.pos + n
        if end > len(self.buf):
            want = min(self.size, max(end, 2 * len(self.buf), self.CHUNK)) - len(self.buf)
            try:
                more = os.pread(self.fd, want, len(self.buf))
            except OSError as e:  # EIO and the like: named, as every message is
                raise SourceError(f"{self.path}: cannot read the GGUF header: {e.strerror or e}") from None
            if len(more) != want:
                raise SourceError(f"{self.path}: short read at byte {len(self.buf)} (file changed while reading?)")
            self.buf += more

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return v

    def raw_string(self, what: str) -> bytes:
        n = self.unpack("<Q", what)
        self.need(n, what)
        s = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return s

    def string(self, what: str) -> str:
        return self.raw_string(what).decode("utf-8", errors="replace")

    def _strings(self, count: int, what: str) -> list[str]:
        # a tight loop: vocabularies hold 150k-250k tokens and as many merges
        out, unpack = [], struct.unpack_from
        for _ in range(count):
            self.need(8, what)
            n = unpack("<Q", self.buf, self.pos)[0]
            self.pos += 8
            self.need(n, what)
            out.append(self.buf[self.pos:self.pos + n].decode("utf-8", errors="replace"))
            self.pos += n
        return out

    def value(self, vtype: int, what: str, depth: int = 0) -> tuple[Any, int | None]:
        if depth > MAX_NESTING:
            raise SourceError(f"{self.path}: {what}: arrays nested more than {MAX_NESTING} deep")
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype], what), None
        if vtype == STRING:
            return self.string(what), None
        if vtype == ARRAY:
            sub = self.unpack("<I", what)
            count = self.unpack("<Q", what)
            if sub in _SCALARS:
                dt = np.dtype(_SCALARS[sub])
                self.need(count * dt.itemsize, what)
                arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos).copy()
                self.pos += count * dt.itemsize
                return arr, sub
            # each element takes at least 8 bytes (a length or a nested header): refuse
            # absurd counts before looping over them
            self.need(count * 8, what)
            if sub == STRING:
                return self._strings(count, what), sub
            return [self.value(sub, what, depth + 1)[0] for _ in range(count)], sub
        raise SourceError(f"{self.path}: {what}: unknown GGUF value type {vtype}")


class GGUFFile:
    """One .gguf file: header parsed at open, tensor bytes memory-mapped and never read here."""

    def __init__(self, path: str, shard: int = 0):
        self.path, self.shard = path, shard
        fd = open_regular(path, "GGUF file")  # a FIFO is refused, not waited on
        try:
            self.size = os.fstat(fd).st_size
            if self.size < 24:
                raise SourceError(f"{path}: truncated GGUF file ({self.size} bytes, the header alone needs 24)")
            self._parse(_Cursor(fd, self.size, path))
            self._mm = mapped.FileMap(fd, path)  # the writer finds the file and offset behind a row view
        finally:
            os.close(fd)
        self.data = np.frombuffer(self._mm, dtype=np.uint8)

    def _parse(self, c: _Cursor) -> None:
        c.need(4, "magic")
        if c.buf[:4] != MAGIC:
            raise SourceError(f"{self.path}: not a GGUF file (magic {c.buf[:4]!r}, expected b'GGUF')")
        c.pos = 4
        self.version = c.unpack("<I", "version")
        if self.version & 0xFFFF == 0:
            raise UnsupportedError(f"{self.path}: big-endian GGUF files are not supported")
        if self.version not in (2, 3):
            raise UnsupportedError(f"{self.path}: GGUF version {self.version} (supported: 2, 3)")
        n_tensors = c.unpack("<Q", "tensor count")
        n_kv = c.unpack("<Q", "key/value count")
        # every KV needs >= 12 bytes and every tensor info >= 24: refuse counts the file cannot hold
        if n_kv * 12 + n_tensors * 24 > self.size:
            raise SourceError(
                f"{self.path}: header claims {n_kv} key/values and {n_tensors} tensors, "
                f"more than {self.size} bytes can hold (truncated or corrupt)"
            )

        self.kv: dict[str, KV] = {}
        for i in range(n_kv):
            start = c.pos
            key = c.string(f"key #{i}")
            vtype = c.unpack("<I", f"type of key {key!r}")
            value, sub = c.value(vtype, f"value of key {key!r}")
            if key in self.kv:
                raise SourceError(f"{self.path}: duplicate metadata key {key!r}")
            self.kv[key] = KV(key, vtype, value, c.buf[start:c.pos], sub)

        align = self.kv.get("general.alignment")
        self.alignment = DEFAULT_ALIGNMENT if align is None else align.value
        if align is not None and (align.type != 4 or self.alignment <= 0 or self.alignment & (self.alignment - 1)):
            raise SourceError(f"{self.path}: general.alignment must be a u32 power of two, got {self.alignment!r}")

        raw = []
        for i in range(n_tensors):
            name = c.string(f"name of tensor #{i}")
            n_dims = c.unpack("<I", f"tensor {name}: dims")
            if not 1 <= n_dims <= MAX_DIMS:
                raise SourceError(f"{self.path}: tensor {name}: {n_dims} dims (GGUF allows 1..{MAX_DIMS})")
            ne = tuple(c.unpack("<Q", f"tensor {name}: shape") for _ in range(n_dims))
            type_id = c.unpack("<I", f"tensor {name}: type")
            rel = c.unpack("<Q", f"tensor {name}: offset")
            raw.append((name, ne, type_id, rel))
        self.header_nbytes = c.pos
        self.data_offset = -(-c.pos // self.alignment) * self.alignment

        self.tensors: dict[str, GgufTensor] = {}
        for name, ne, type_id, rel in raw:
            where = f"{self.path}: tensor {name}"
            t = ggml_type(type_id, where)
            if name in self.tensors:
                raise SourceError(f"{self.path}: duplicate tensor {name}")
            if ne[0] % t.block:
                raise SourceError(
                    f"{where}: rows of {ne[0]} values are not a whole number of {t.name} blocks of {t.block}"
                )
            if rel % self.alignment:
                raise SourceError(f"{where}: data offset {rel} is not a multiple of the alignment {self.alignment}")
            if prod(max(d, 1) for d in ne) >= 1 << 63:  # [0, 2**64-1] holds no bytes, yet no array has it
                raise SourceError(f"{where}: shape {list(ne)} is too large for any array")
            nbytes = prod(ne[1:]) * t.row_nbytes(ne[0])
            start = self.data_offset + rel
            if start + nbytes > self.size:
                raise SourceError(
                    f"{where}: data [{start}, {start + nbytes}) lies past the end of the file "
                    f"({self.size} bytes): truncated file or bad offset"
                )
            self.tensors[name] = GgufTensor(name, t, ne, start, nbytes, self.shard)

    def view(self, info: GgufTensor) -> np.ndarray:
        """The tensor's bytes as a zero-copy uint8 view of the map, shaped [..., rows, row_bytes]."""
        return self.data[info.offset:info.offset + info.nbytes].reshape(info.byte_shape)

    def release_pages(self) -> None:
        if self.data is not None:
            mapped.release_pages(self._mm)

    def close(self) -> None:
        self.data = None
        if not hasattr(self, "_mm"):
            return
        try:
            self._mm.close()
        except BufferError:
            pass  # views handed out still hold the map; it goes when they do


def tensorless_gguf(files: list[GGUFFile], keys: list[str]) -> bytes:
    """A GGUF with the given keys' original bytes and no tensors: llama.cpp tools read it as is."""
    src = {k: f.kv[k] for f in reversed(files) for k in f.kv}
    body = b"".join(src[k].raw for k in keys)
    return MAGIC + struct.pack("<IQQ", files[0].version, 0, len(keys)) + body
