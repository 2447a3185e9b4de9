"""ftw: FTW containers of per-layer MoE expert banks.

``ftw.open(path)`` reads a container; ``ftw.load_expert_banks`` loads its banks for a runtime.
torch is never imported here: converting and inspecting work without it.

The repository keeps readers/, writers/ and cli.py beside ftw/ (the project card's layout);
the wheel installs them inside this package as ftw.readers, ftw.writers and ftw.cli so that
nothing generic lands at the top of site-packages. In a source tree the same names resolve
through the parent folder, added to this package's search path below.
"""

import os as _os

_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isdir(_os.path.join(_root, "readers")) and _os.path.isfile(_os.path.join(_root, "cli.py")):
    __path__.append(_root)  # noqa: F821 (a package's own __path__)

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
from .formats import FORMATS, Activation, LayerFormat, ModelShape, get_format

__version__ = "0.1.0"

__all__ = [
    "open", "FtwFile", "BankInfo", "LayerFormat", "ModelShape", "Activation", "FORMATS", "get_format",
    "FtwError", "FormatError", "ChecksumError", "SourceError", "UnsupportedError",
    "DestinationExistsError", "MergeError", "load_expert_banks", "merge_expert_banks",
]


def __getattr__(name):
    # the loader pulls in thread pools and, with pin=True, torch: load it on first use only
    if name in ("load_expert_banks", "merge_expert_banks", "ExpertBanks"):
        from . import loader

        return getattr(loader, name)
    raise AttributeError(name)
