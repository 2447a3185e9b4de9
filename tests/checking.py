"""`ftw check` from paths, as the CLI runs it: the caller opens the source (ftw/ imports no reader)."""

from ftw.check import check as _check
from ftw.readers import open_checkpoint


def check(src, dst, **kw):
    with open_checkpoint(src) as reader:
        return _check(reader, dst, **kw)
