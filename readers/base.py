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

import os
from abc import ABC, abstractmethod
from typing import Callable, Iterable

from ftw.banks import LayerBanks, SourceTensor
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


# An opener returns a reader when it recognises the path, else None.
Opener = Callable[[str], "CheckpointReader | None"]
_OPENERS: list[Opener] = []


def register_opener(opener: Opener) -> Opener:
    _OPENERS.append(opener)
    return opener


def _load_builtin_openers() -> None:
    # importing a module registers its opener; kept lazy so `import readers` stays cheap
    from . import gguf_reader, safetensors_reader  # noqa: F401


def open_checkpoint(path: str | os.PathLike) -> CheckpointReader:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise SourceError(f"{path}: no such file or folder")
    _load_builtin_openers()
    for opener in _OPENERS:
        reader = opener(path)
        if reader is not None:
            return reader
    raise UnsupportedError(
        f"{path}: not a checkpoint ftw can read (expected a folder with config.json and "
        f"*.safetensors, or a .gguf file)"
    )
