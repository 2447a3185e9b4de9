"""ftw: FTW containers of per-layer MoE expert banks.

``ftw.open(path)`` reads a container; ``ftw.load_expert_banks`` loads its banks for a runtime.
torch is never imported here: converting and inspecting work without it.
"""

from .container import BankInfo, FtwFile, open
from .errors import (
    ChecksumError,
    DestinationExistsError,
    FormatError,
    FtwError,
    MergeError,
    SourceError,
    UnsupportedError,
)
from .formats import FORMATS, LayerFormat, ModelShape

__version__ = "0.1.0"

__all__ = [
    "open", "FtwFile", "BankInfo", "LayerFormat", "ModelShape", "FORMATS",
    "FtwError", "FormatError", "ChecksumError", "SourceError", "UnsupportedError",
    "DestinationExistsError", "MergeError", "load_expert_banks", "merge_expert_banks",
]


def __getattr__(name):
    # the loader pulls in thread pools and, with pin=True, torch: load it on first use only
    if name in ("load_expert_banks", "merge_expert_banks", "ExpertBanks"):
        from . import loader

        return getattr(loader, name)
    raise AttributeError(name)
