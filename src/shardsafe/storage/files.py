"""Opening the files of an untrusted checkpoint without ever reading outside it.

A checkpoint directory may have been written by someone else. Its data files and its
index are opened here, and only here, under these rules (docs/FORMAT.md section 9):

- the last path component is opened with ``O_NOFOLLOW``: a symlink is refused whatever
  its target and whatever its ``lstat`` size (a link text padded with slashes to the
  declared size is still a link);
- the entry is ``lstat``-ed first, so a device, FIFO or socket is refused without being
  opened at all (opening some devices has side effects), and the open uses
  ``O_NONBLOCK`` so a FIFO swapped in meanwhile cannot block;
- the opened descriptor is ``fstat``-ed: only a regular file is accepted, and its size
  is the one callers compare with the index.

Data file names are single components (format.index refuses separators), so the entries
opened here sit directly in the checkpoint directory; the directory itself is the
caller's choice of path and may be reached through a symlink. A reference of an
incremental save (``<step directory>/<file>``) names a file of a sibling directory,
which ``check_directory`` requires to be a real directory, never a symlink.

A refusal raises ``CorruptCheckpointError`` naming the file before any byte is read.
A missing file raises ``FileNotFoundError`` (callers decide whether that means "not a
checkpoint" or "damaged checkpoint").
"""

from __future__ import annotations

import errno
import os
import stat
from typing import TypeVar

from ..errors import CheckpointError, CorruptCheckpointError

_E = TypeVar("_E", bound=BaseException)

_FLAGS = (os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
          | getattr(os, "O_NOCTTY", 0))


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _refuse(path: str, what: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"{what}, not a regular file: a checkpoint never reads outside "
                                  f"itself", file=os.path.basename(path))


def check_regular(path: str) -> int:
    """Size of ``path`` if it is a regular file (not followed if a symlink).

    Raises:
        CorruptCheckpointError: ``path`` is a symlink, directory, FIFO, socket or device.
        FileNotFoundError: it does not exist.
    """
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, _kind(st.st_mode))
    return st.st_size


def kind_of(path: str) -> str:
    """What ``path`` is, following symlinks (for a path a user names, such as the source of
    ``shardsafe import``): ``"a regular file"``, ``"a directory"``, ``"a FIFO"``, ...

    Raises:
        FileNotFoundError: it does not exist.
    """
    mode = os.stat(path).st_mode
    return "a regular file" if stat.S_ISREG(mode) else _kind(mode)


def check_directory(path: str) -> None:
    """Refuses (``CorruptCheckpointError``) a ``path`` that is a symlink or not a directory.

    Used for the sibling step directory a reference (incremental saves) names: the
    checkpoint's own directory is the caller's choice, a referenced one is not.

    Raises:
        FileNotFoundError: it does not exist.
    """
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise CorruptCheckpointError(f"referenced step directory is {_kind(st.st_mode)}, not a "
                                     f"directory: a checkpoint never reads outside its parent",
                                     file=os.path.basename(path))


def open_regular(path: str) -> tuple[int, int]:
    """Opens a checkpoint file for reading; returns ``(fd, size)`` of the opened file.

    The caller closes ``fd``. See the module docstring for what is refused.

    Raises:
        CorruptCheckpointError: not a regular file (nothing was read from it).
        FileNotFoundError: it does not exist.
    """
    check_regular(path)  # devices and FIFOs are refused before any open
    try:
        fd = os.open(path, _FLAGS)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK):  # replaced by a symlink since the lstat
            raise _refuse(path, "a symbolic link") from None
        if e.errno in (errno.ENXIO, errno.EISDIR):  # a socket or directory swapped in
            raise _refuse(path, "a special file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, _kind(st.st_mode))
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def read_regular(path: str, limit: int) -> bytes:
    """The whole content of a regular checkpoint file of at most ``limit`` bytes.

    Reads no more than the size ``fstat`` reported when it was opened (a file growing
    meanwhile cannot make this read without end).

    Raises:
        CorruptCheckpointError: not a regular file, or larger than ``limit``.
        FileNotFoundError: it does not exist.
    """
    fd, size = open_regular(path)
    try:
        if size > limit:
            raise CorruptCheckpointError(f"file has {size} bytes, more than the {limit} allowed",
                                         file=os.path.basename(path))
        parts, got = [], 0
        while got < size:
            chunk = os.pread(fd, size - got, got)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def reopen_direct(path: str, fd: int, direct_flag: int) -> int:
    """A second descriptor of the file open as ``fd``, with ``direct_flag`` (``O_DIRECT``).

    Refuses (``CorruptCheckpointError``) if ``path`` names another file by now.
    """
    try:
        dfd = os.open(path, _FLAGS | direct_flag)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO, errno.EISDIR):
            raise _refuse(path, "a special file") from None
        raise
    a, b = os.fstat(fd), os.fstat(dfd)
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
        os.close(dfd)
        raise CorruptCheckpointError("file was replaced while being read", file=os.path.basename(path))
    return dfd


def with_path(e: _E, path: str) -> _E:
    """``e`` naming ``path`` when it is an ``OSError`` that names no file (``os.pwrite`` and
    ``fsync`` errors: "[Errno 28] No space left on device" alone does not say which disk
    filled up); any other exception as it is (a ``CheckpointError`` names its file already)."""
    if not isinstance(e, OSError) or isinstance(e, CheckpointError) or e.filename is not None:
        return e
    out = type(e)(e.errno, e.strerror or str(e), path)
    out.__cause__ = e
    return out
