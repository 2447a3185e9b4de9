"""An output file that appears at its destination complete, or not at all.

Where the OS allows (Linux O_TMPFILE), the data is written to an anonymous inode in the
destination folder and linked into place only at commit: a SIGKILL mid-write leaves no file
behind at all. Elsewhere (some sandboxes, other OSes) a hidden temporary file beside the
destination is used, removed on any exception; a reaper process in its own session holds
the read end of a pipe and removes the file when the writer dies without committing, even
by SIGKILL. Either way the destination is created (or replaced, when asked) by one
rename, after an fsync, so an existing file is never damaged.
"""

from __future__ import annotations

import errno
import os
import secrets
import subprocess

from ftw.errors import DestinationExistsError, FtwError

# (destination, st_dev, st_ino) of every file this process moved or was moving into place
_COMMITS: list[tuple[str, int, int]] = []
TMP_SUFFIX_NBYTES = len(".") + 8 + len(".tmp")  # what _hidden_name adds to the (cut) base name


def committed() -> list[str]:
    """Destinations this process has put in place, as the file system says now: a Ctrl-C
    can land between the rename and any bookkeeping after it, so the destination's inode
    is compared with the one written rather than trusting a flag."""
    out = []
    for path, dev, ino in _COMMITS:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (dev, ino):
            out.append(path)
    return out


def _io_error(path: str, what: str, e: OSError) -> FtwError:
    return FtwError(f"{path}: cannot {what}: {e.strerror or e}")


class AtomicFile:
    def __init__(self, path: str | os.PathLike, *, force: bool = False):
        self.path = os.path.abspath(os.fspath(path))
        self.force = force
        self.folder = os.path.dirname(self.path)
        if os.path.isdir(self.path):
            raise DestinationExistsError(f"{self.path}: is a folder, expected a file path")
        if os.path.lexists(self.path) and not force:  # a dangling symlink counts: link() would fail
            raise DestinationExistsError(f"{self.path}: exists (use --force to replace it)")
        if not os.path.isdir(self.folder):
            raise FtwError(f"{self.path}: folder {self.folder} does not exist")
        self._named_tmp: str | None = None
        self._reaper: subprocess.Popen | None = None
        self.fd = -1
        try:
            if _anonymous_files_link(self.folder):
                self.fd = os.open(self.folder, os.O_TMPFILE | os.O_WRONLY, 0o644)
            else:
                self._named_tmp = self._hidden_name()
                self.fd = os.open(self._named_tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                self._reaper = _start_reaper(self._named_tmp)
        except OSError as e:
            self._named_tmp = None
            raise _io_error(self.path, "create a file in its folder", e) from None

    def _hidden_name(self) -> str:
        """'.NAME.xxxxxxxx.tmp', NAME cut so the whole stays within the folder's NAME_MAX:
        a destination name of 240-255 bytes must not fail on its temporary name."""
        base = os.fsencode(os.path.basename(self.path))
        try:
            name_max = os.pathconf(self.folder, "PC_NAME_MAX")
        except (OSError, ValueError):
            name_max = 255
        base = base[: max(1, name_max - 1 - TMP_SUFFIX_NBYTES)]
        return os.path.join(self.folder, os.fsdecode(b"." + base) + f".{secrets.token_hex(4)}.tmp")

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        total = len(view)
        try:
            while view:
                n = os.write(self.fd, view)
                view = view[n:]
        except OSError as e:
            raise _io_error(self.path, "write", e) from None
        return total

    def commit(self) -> None:
        try:
            self._commit()
        except OSError as e:
            raise _io_error(self.path, "commit", e) from None
        finally:
            self.abort()

    def _commit(self) -> None:
        os.fsync(self.fd)
        if self._named_tmp is None:
            # link the anonymous inode under a hidden name, then rename: rename is the only
            # step that can replace the destination, and it is atomic
            tmp = self._hidden_name()
            os.link(f"/proc/self/fd/{self.fd}", tmp)
            self._named_tmp = tmp
        st = os.fstat(self.fd)
        _COMMITS.append((self.path, st.st_dev, st.st_ino))
        os.close(self.fd)
        self.fd = -1
        if self.force:
            os.replace(self._named_tmp, self.path)
        else:
            # link() fails if the destination appeared meanwhile: never clobber it
            try:
                os.link(self._named_tmp, self.path)
            except FileExistsError:
                raise DestinationExistsError(
                    f"{self.path}: appeared while converting; not replaced (use --force)"
                ) from None
            os.unlink(self._named_tmp)
        self._named_tmp = None
        _fsync_dir(self.folder)

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self._named_tmp is not None:
            try:
                os.unlink(self._named_tmp)
            except FileNotFoundError:
                pass
            self._named_tmp = None
        if self._reaper is not None:
            self._reaper.stdin.close()  # the file is gone or committed: the reaper removes nothing
            self._reaper.wait()
            self._reaper = None


def _start_reaper(path: str) -> subprocess.Popen | None:
    """A process that waits for this one to close the pipe (commit, abort, or death), then
    removes path if it still exists. Its own session keeps it out of Ctrl-C and group kills."""
    try:
        return subprocess.Popen(
            ["sh", "-c", 'cat >/dev/null; rm -f -- "$0"', path],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        return None  # no shell: a SIGKILL may then leave the hidden temporary file


_LINKABLE: dict[int, bool] = {}


def _anonymous_files_link(folder: str) -> bool:
    """Whether an O_TMPFILE inode in folder can later be linked into place. Some kernels and
    sandboxes (gVisor) create the inode but refuse the link, so probe once per filesystem."""
    dev = os.stat(folder).st_dev
    if dev not in _LINKABLE:
        probe = os.path.join(folder, f".ftw-probe.{secrets.token_hex(4)}")
        try:
            fd = os.open(folder, os.O_TMPFILE | os.O_WRONLY, 0o644)
        except AttributeError:  # no O_TMPFILE on this OS
            _LINKABLE[dev] = False
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                return False  # this folder, not the filesystem: the named path will say why
            _LINKABLE[dev] = False
        else:
            try:
                os.link(f"/proc/self/fd/{fd}", probe)
                os.unlink(probe)
                _LINKABLE[dev] = True
            except OSError:
                _LINKABLE[dev] = False
            finally:
                os.close(fd)
    return _LINKABLE[dev]


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
