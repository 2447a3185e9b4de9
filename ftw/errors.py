"""One error hierarchy for everything ftw refuses.

The CLI prints ``str(err)`` of any FtwError on one line and exits non-zero, so every message
names the file, tensor, layer or bank at fault and what was expected.
"""


class FtwError(Exception):
    """Base of every error ftw raises on purpose."""


class FormatError(FtwError):
    """An FTW file is malformed: truncated, out-of-bounds offsets, bad JSON, unknown version."""


class ChecksumError(FormatError):
    """Stored bytes do not match their recorded checksum."""


class SourceError(FtwError):
    """A source checkpoint is malformed or incomplete (truncated shard, missing expert, bad shape)."""


class UnsupportedError(FtwError):
    """The input is well formed but uses something ftw does not handle (a layout, a type id)."""


class DestinationExistsError(FtwError):
    """The output path exists and replacing it was not asked for."""


class MergeError(FtwError):
    """Expert banks loaded separately cannot be merged (overlapping layers, different E)."""
