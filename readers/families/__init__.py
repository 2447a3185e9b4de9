"""Model families of HF safetensors checkpoints, registered by config.json `model_type`.

Each family is one small class (see ``base.Family``); ``family_for(config)`` picks it.
"""

from __future__ import annotations

from ftw.errors import UnsupportedError

from .base import Dims, ExpertGroup, Family

FAMILIES: dict[str, type[Family]] = {}


def register(cls: type[Family]) -> type[Family]:
    for t in cls.model_types or (cls.name,):
        FAMILIES[t] = cls
    return cls


def family_for(config: dict, where: str) -> Family:
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        tc = config.get("text_config")
        model_type = tc.get("model_type") if isinstance(tc, dict) else None
    cls = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if cls is None:
        raise UnsupportedError(
            f"{where}: model_type {model_type!r} is not a family ftw reads "
            f"(known: {', '.join(sorted(FAMILIES))})"
        )
    return cls(config, where)


# importing the family modules registers them
from . import deepseek, gpt_oss, mixtral, qwen  # noqa: E402,F401

__all__ = ["FAMILIES", "Dims", "ExpertGroup", "Family", "family_for", "register"]
