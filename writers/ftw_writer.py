"""Streaming writer of FTW v1 containers (docs/FORMAT.md).

Banks are written the moment they are added, row by row from the reader's zero-copy views,
so memory stays bounded by the rows in flight: one, or with compression a window of twice
the thread count.

Rows that are views of a source file's map (ftw/mapped.py) are never read through the map.
The bytes behind them are read with pread, 1 MiB at a time, straight into the output's
staging buffer (writers/sink.py), where the checksum reads them while they are in the CPU
cache and from where they go to the file with O_DIRECT: each source byte is read from the
page cache once and touched once in user space, in large sequential requests, for less CPU
time than `cp` (docs/BENCHMARKS.md), and a source that shrinks mid-conversion is a
SourceError naming it rather than a SIGBUS.
The index is written last, followed by a fixed-size footer that points at it; the file only
appears at its destination when ``close()`` commits it (writers/atomic.py).
"""

from __future__ import annotations

import json
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from typing import Callable, Iterable, Mapping

import numpy as np
import xxhash

from ftw import mapped, spec
from ftw.banks import BankSource, LayerBanks, SourceTensor
from ftw.errors import FtwError, SourceError
from ftw.formats import ModelShape

from .atomic import AtomicFile
from .sink import Sink

Progress = Callable[[int], None]  # called with source bytes consumed since the last call

# compression that saves less than this is not worth a decompression on every load
MIN_SAVING = 0.03
SAMPLE_ROWS = 4  # rows compressed first to decide whether a bank is worth compressing
# bytes per pread (and per checksum update): they are still in L2 when xxh3 reads them
CHUNK = 1 << 20


def check_level(level: int) -> int:
    import zstandard

    lo, hi = -(1 << 17), zstandard.MAX_COMPRESSION_LEVEL
    if not lo <= level <= hi:
        raise FtwError(f"zstd level {level} is out of range ({lo} to {hi})")
    return level


def _bytes(piece) -> memoryview:
    return memoryview(np.ascontiguousarray(piece)).cast("B")


def split_planes(row: memoryview, itemsize: int) -> np.ndarray:
    """Byte-plane split: all bytes 0 of each item, then all bytes 1, ... (zstd finds the
    repetitive exponent bytes of bf16 when they sit together). 16-bit items are split
    arithmetically: numpy's transposed copy runs at ~0.5 GB/s, slower than zstd itself."""
    if itemsize == 2:
        a = np.frombuffer(row, dtype="<u2")
        out = np.empty(2 * a.size, dtype=np.uint8)
        np.copyto(out[: a.size], a, casting="unsafe")  # truncation keeps the low byte
        np.right_shift(a, 8, out=out[a.size :], casting="unsafe")
        return out
    return np.ascontiguousarray(np.frombuffer(row, dtype=np.uint8).reshape(-1, itemsize).T).reshape(-1)


class FtwWriter:
    def __init__(
        self,
        path: str | os.PathLike,
        *,
        force: bool = False,
        compress_level: int | None = None,
        threads: int | None = None,
        progress: Progress | None = None,
    ):
        if compress_level is not None:
            check_level(compress_level)
        if threads is not None and threads < 1:
            raise FtwError(f"threads must be at least 1, got {threads}")
        self._file = AtomicFile(path, force=force)
        self._compressors: ThreadPoolExecutor | None = None
        self._run: list | None = None  # [FileMap, offset, nbytes]: adjacent source bytes to copy
        self._hash = None  # the checksum of the blob being written
        self.path = self._file.path
        self._pos = 0
        self._level = compress_level
        self._threads = threads or min(8, os.cpu_count() or 1)
        self._progress = progress or (lambda n: None)
        self._index: dict = {
            "model": None,
            "layer_quant_formats": {},
            "layers": {},
            "tensors": {},
            "attachments": {},
            "provenance": {},
        }
        self._names: set[tuple[str, str]] = set()
        try:
            self._sink = Sink(self._file)
            self._write(spec.PREAMBLE.pack(spec.PREAMBLE_MAGIC, spec.MAJOR, spec.MINOR))
        except BaseException:
            self.abort()
            raise

    # -- low level ----------------------------------------------------------------------
    def _write(self, data) -> None:
        self._sink.write(data)
        self._pos += memoryview(data).nbytes

    def _write_chunk(self, c: memoryview) -> None:
        """Hash and write one chunk of the blob in progress. Views of a source file's map join
        the run of adjacent source bytes, copied when a non-adjacent chunk or the blob's end
        comes; anything else (computed rows, attachments) is written from memory."""
        span = mapped.file_span(c)
        if span is None:
            self._flush_copy()
            for i in range(0, len(c), CHUNK):  # hashed while in cache, then copied in
                self._hash.update(c[i : i + CHUNK])
                self._write(c[i : i + CHUNK])
            return
        run = self._run
        if run is not None and run[0] is span[0] and run[1] + run[2] == span[1]:
            run[2] += len(c)
            return
        self._flush_copy()
        self._run = [span[0], span[1], len(c)]

    def _flush_copy(self) -> None:
        """Copy the pending run of source bytes: pread into the output buffer, hash there."""
        if self._run is None:
            return
        src, offset, nbytes = self._run
        self._run = None
        end = offset + nbytes
        while offset < end:
            buf = self._sink.room(min(CHUNK, end - offset))
            mapped.read_exact(src.source_fd, buf, offset, src.path)
            self._hash.update(buf)
            self._sink.advance(len(buf))
            self._pos += len(buf)
            offset += len(buf)

    def _align(self) -> int:
        self._flush_copy()
        pad = spec.align_up(self._pos) - self._pos
        if pad:
            self._write(bytes(pad))
        return self._pos

    def _blob(self, chunks: Iterable) -> dict:
        """Write chunks as one aligned blob; returns its {offset, nbytes, xxh3}."""
        offset = self._align()
        self._hash = h = xxhash.xxh3_64()
        for c in chunks:
            self._write_chunk(c)
        self._flush_copy()
        self._hash = None
        return {"offset": offset, "nbytes": self._pos - offset, "xxh3": h.hexdigest()}

    # -- public -------------------------------------------------------------------------
    def set_model(self, model: ModelShape) -> None:
        self._model = model
        self._index["model"] = model.to_json()

    def set_selection(self, selection) -> None:
        """What part of the source this file holds (ftw.container.Selection)."""
        self._index["selection"] = selection.to_json()

    def set_provenance(self, provenance: Mapping) -> None:
        self._index["provenance"] = dict(provenance)

    def add_layer(self, layer: LayerBanks) -> None:
        key = str(layer.layer)
        model = getattr(self, "_model", None)
        if model is not None:  # strict when writing; plan_conversion ran the same check earlier
            layer.check(model.hidden_size, model.intermediate_size(layer.layer), f"{self.path}: layer {layer.layer}")
        if key in self._index["layers"]:
            raise FtwError(f"{self.path}: layer {layer.layer} added twice")
        banks = {}
        for name, bank in layer.banks.items():
            where = f"layer {layer.layer} bank {name}"
            banks[name] = self._write_bank(bank, where)
        self._index["layers"][key] = {"banks": banks}
        self._index["layer_quant_formats"][key] = layer.format.to_json()

    def add_tensor(self, tensor: SourceTensor) -> None:
        self._unique("tensor", tensor.name)
        data = _bytes(tensor.data())
        if len(data) != tensor.nbytes:
            raise SourceError(
                f"tensor {tensor.name}: {len(data)} bytes, expected {tensor.nbytes} "
                f"for {tensor.dtype} {list(tensor.shape)}"
            )
        desc = {"dtype": tensor.dtype, "shape": list(tensor.shape), **self._blob([data])}
        if tensor.meta:
            desc["meta"] = tensor.meta
        self._index["tensors"][tensor.name] = desc
        self._progress(len(data))

    def add_attachment(self, name: str, data: bytes) -> None:
        self._unique("attachment", name)
        self._index["attachments"][name] = self._blob([memoryview(data).cast("B")])

    def close(self) -> None:
        """Write the index and footer, then move the file into place."""
        try:
            self._finish()
        except BaseException:
            self.abort()
            raise
        if self._compressors is not None:
            self._compressors.shutdown()

    def _finish(self) -> None:
        try:  # strict JSON (RFC 8259) has no NaN: a reader must be able to parse the index
            index = json.dumps(self._index, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
        except ValueError:
            raise FtwError(f"{self.path}: the index would hold a NaN or infinite number (strict JSON has none)") from None
        if len(index) > spec.MAX_INDEX_NBYTES:
            raise FtwError(f"{self.path}: index of {len(index)} bytes exceeds the format's cap")
        if self._pos < spec.ALIGNMENT:
            self._align()  # no blobs: the index still starts after the preamble page
        offset = self._pos
        self._write(index)
        body = spec.FOOTER.pack(
            spec.FOOTER_MAGIC, spec.MAJOR, spec.MINOR, 0, offset, len(index),
            xxhash.xxh3_64_intdigest(index), 0,
        )
        sealed = body[:-8]  # the footer's checksum covers everything before it
        self._write(sealed + xxhash.xxh3_64_intdigest(sealed).to_bytes(8, "little"))
        self._sink.finish()
        try:
            self._file.commit()
        except OSError as e:  # fsync or link: name the file, not only the errno
            raise FtwError(f"{self.path}: cannot commit: {e.strerror or e}") from None

    def abort(self) -> None:
        if getattr(self, "_sink", None) is not None:
            self._sink.close()
        if self._compressors is not None:
            self._compressors.shutdown(cancel_futures=True)
        self._file.abort()

    def __enter__(self) -> "FtwWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- banks --------------------------------------------------------------------------
    def _unique(self, kind: str, name: str) -> None:
        if (kind, name) in self._names:
            raise FtwError(f"{self.path}: {kind} {name!r} added twice")
        self._names.add((kind, name))

    def _rows(self, bank: BankSource, where: str):
        for e in range(bank.num_experts):
            pieces = [_bytes(p) for p in bank.row(e)]
            got = sum(len(p) for p in pieces)
            if got != bank.row_nbytes:
                raise SourceError(
                    f"{where} expert {e}: row of {got} bytes, expected {bank.row_nbytes} "
                    f"({bank.dtype} {list(bank.row_shape)})"
                )
            yield pieces

    def _write_bank(self, bank: BankSource, where: str) -> dict:
        desc = {"dtype": bank.dtype, "shape": [bank.num_experts, *bank.row_shape]}
        if self._level is not None and bank.nbytes:
            compressed = self._compress_bank(bank, where)
            if compressed is not None:
                return {**desc, **compressed}

        def chunks():
            for pieces in self._rows(bank, where):
                yield from pieces
                self._progress(bank.row_nbytes)

        return {**desc, "codec": spec.RAW, **self._blob(chunks())}

    def _compress_bank(self, bank: BankSource, where: str) -> dict | None:
        """Compress rows on the pool in a bounded window, in order. A sample of the first rows
        decides whether the bank is worth it (packed 4-bit data rarely is): then the bank is
        written raw, having cost only the sample's compression."""
        import zstandard

        itemsize = spec.dtype(bank.dtype).itemsize
        codec = spec.ZSTD_BYTESPLIT if itemsize == 2 else spec.ZSTD
        level = self._level

        def compress(pieces: list[memoryview]) -> bytes:
            # source bytes read with pread, not through the map: a shrunk source is an error
            pieces = [p if (r := mapped.read_span(p)) is None else r for p in pieces]
            row = pieces[0] if len(pieces) == 1 else memoryview(b"".join(pieces))
            if codec == spec.ZSTD_BYTESPLIT:
                row = split_planes(row, itemsize)
            # one context per call: ZstdCompressor objects are not thread-safe
            return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(row)

        if self._compressors is None:
            self._compressors = ThreadPoolExecutor(self._threads, thread_name_prefix="ftw-zstd")
        pool = self._compressors
        rows = self._rows(bank, where)
        sample = list(pool.map(compress, islice(rows, SAMPLE_ROWS)))
        if sum(len(f) for f in sample) > len(sample) * bank.row_nbytes * (1 - MIN_SAVING):
            return None
        sizes: list[int] = []

        def frames():
            window = deque(pool.submit(lambda f=f: f) for f in sample)
            for pieces in rows:
                window.append(pool.submit(compress, pieces))
                if len(window) > 2 * self._threads:
                    yield window.popleft().result()
            while window:
                yield window.popleft().result()

        def counted():
            for f in frames():
                sizes.append(len(f))
                yield f
                self._progress(bank.row_nbytes)

        blob = self._blob(counted())
        table = np.zeros(bank.num_experts + 1, dtype="<u8")
        table[1:] = np.cumsum(sizes)
        row_table = self._blob([memoryview(table).cast("B")])
        return {"codec": codec, **blob, "row_table": row_table}
