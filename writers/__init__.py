"""Writers of FTW containers."""

from .ftw_writer import FtwWriter

__all__ = ["FtwWriter"]
