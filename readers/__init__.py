"""Source checkpoint readers: HF safetensors folders and GGUF files.

``open_checkpoint(path)`` picks the reader; every reader honours the contract in
``readers.base.CheckpointReader``.
"""

from .base import CheckpointReader, open_checkpoint, register_opener

__all__ = ["CheckpointReader", "open_checkpoint", "register_opener"]
