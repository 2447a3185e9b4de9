"""The reader contract, and the registry that picks a reader for a source path.

A reader:
- reads the model shape and decides every MoE layer's format from config and tensor
  headers alone (no tensor data);
- ``plan(layers)`` resolves the requested layers (every needed tensor found, every shape
  and dtype checked) before any bank byte is read, so an unsupported or incomplete layer
  fails fast with nothing written. The error names the first missing tensor;
- hands out rows as zero-copy views of its memory map; other layers' bytes are never touched.
"""

from __future__ import annotations

import json
import os
import stat
from abc import ABC, abstractmethod
from typing import Callable, Iterable

from ftw.banks import LayerBanks, SourceTensor
from ftw.layer_ranges import format_layers
from ftw.errors import SourceError, UnsupportedError
from ftw.formats import LayerFormat, ModelShape


class CheckpointReader(ABC):
    path: str
    model: ModelShape

    @property
    @abstractmethod
    def name(self) -> str:
        """The reader (and family) that handles this checkpoint, for provenance: 'safetensors/qwen3_moe'."""

    @abstractmethod
    def layer_formats(self) -> dict[int, LayerFormat]:
        """Every MoE layer's format, detected from metadata only."""

    @abstractmethod
    def plan(self, layers: Iterable[int] | None = None) -> list[LayerBanks]:
        """Resolve the given MoE layers (all when None), in ascending order; reads no bank data."""

    def wanted_layers(self, layers: Iterable[int] | None) -> list[int]:
        """The MoE layers asked for (all when None), ascending; a layer that is not one of the
        model's MoE layers is refused here, the one place that says so."""
        moe = self.model.moe_layers
        if layers is None:
            return sorted(moe)
        wanted = sorted(set(int(x) for x in layers))
        known = set(moe)
        for layer in wanted:
            if layer not in known:
                raise SourceError(f"{self.path}: layer {layer} is not a MoE layer "
                                  f"(MoE layers: {format_layers(moe) or 'none'})")
        return wanted

    @abstractmethod
    def tensors(self) -> list[SourceTensor]:
        """Non-expert tensors (attention, norms, router, shared experts, embeddings), lazily fetched."""

    @abstractmethod
    def attachments(self) -> dict[str, bytes]:
        """Files that make one .ftw serve a model: config.json, tokenizer files, GGUF metadata."""

    @abstractmethod
    def source_files(self) -> list[str]:
        """The files this checkpoint is read from (provenance)."""

    def release_pages(self) -> None:
        """Unmap the source pages this process has touched (they stay in the page cache).

        The converter calls it after each layer so that a mapped checkpoint does not count
        towards its RSS beyond the layer in flight."""

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_regular(path: str, what: str = "file") -> int:
    """A read-only descriptor of path, refused (SourceError) unless it is a regular file.
    O_NONBLOCK: open() of a FIFO would otherwise wait forever for a writer; a regular file
    ignores the flag."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise SourceError(f"{path}: cannot open {what}: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SourceError(f"{path}: {what} is not a regular file (a FIFO, device or folder)")
    return fd


def read_regular(path: str, what: str, limit: int) -> bytes:
    """The whole of a small regular file (a config or an index), at most limit bytes."""
    fd = open_regular(path, what)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise SourceError(f"{path}: {what} of {size} bytes is larger than the {limit}-byte limit")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)
    except OSError as e:
        raise SourceError(f"{path}: cannot read {what}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def load_json_object(path: str, what: str, limit: int = 64 << 20) -> dict:
    """A JSON object from a small file: never a hang (FIFO), a RecursionError (100,000-deep
    nesting) or a traceback. (NaN is parsed: the values a family reads are checked one by one.)"""
    raw = read_regular(path, what, limit)
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise SourceError(f"{path}: {what} is not valid JSON: {str(e)[:200] or type(e).__name__}") from None
    if not isinstance(obj, dict):
        raise SourceError(f"{path}: {what} must be a JSON object")
    return obj


# An opener returns a reader when it recognises the path, else None.
Opener = Callable[[str], "CheckpointReader | None"]
_OPENERS: list[Opener] = []


def register_opener(opener: Opener) -> Opener:
    _OPENERS.append(opener)
    return opener


def _load_builtin_openers(path: str) -> None:
    # importing a module registers its opener; kept lazy so `import readers` stays cheap, and
    # the GGUF reader (tens of ms of imports) is loaded only for a path that can be a GGUF
    from . import safetensors_reader  # noqa: F401

    if path.lower().endswith(".gguf"):
        from . import gguf_reader  # noqa: F401


def open_checkpoint(path: str | os.PathLike) -> CheckpointReader:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise SourceError(f"{path}: no such file or folder")
    _load_builtin_openers(path)
    for opener in _OPENERS:
        reader = opener(path)
        if reader is not None:
            return reader
    raise UnsupportedError(
        f"{path}: not a checkpoint ftw can read (expected a folder with config.json and "
        f"*.safetensors, or a .gguf file)"
    )
