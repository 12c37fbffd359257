"""Local POSIX backend: pwrite/pread, direct I/O where allowed, fsync everywhere.

The backend owns no threads. Parallel writes of one file go through ``open_writer``:
the engine's I/O pool (``engine.io_pool``) writes disjoint ranges concurrently
(``os.pwrite`` releases the GIL). ``write`` writes its buffers segment by segment on
the calling thread. Page-aligned segments go through an ``O_DIRECT`` descriptor when
the filesystem accepts one, bypassing the page cache; unaligned tails use a normal
descriptor. The file is fsynced before ``write`` returns.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
import stat
import uuid
from collections.abc import Iterable, Sequence

import numpy as np

from .. import knobs
from ..errors import CorruptCheckpointError
from ..format.datafile import ALIGN
from ..format.index.rules import MAX_INDEX_BYTES
from .cached_or_direct import cached, read_range
from .files import check_directory, check_regular, open_regular, read_regular, with_path

log = logging.getLogger("shardsafe")

SEGMENT = 64 << 20  # bytes ``write`` hands to one pwrite call
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_RENAME_EXCHANGE = 2
_IOV_MAX = 1024
MAX_READ = MAX_INDEX_BYTES  # ``read`` is for indexes; anything larger is refused unread

def _address(buf: memoryview) -> int:
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data) if len(buf) else 0


def _pwrite_all(fd: int, buf: memoryview, offset: int) -> None:
    while len(buf):
        n = os.pwrite(fd, buf, offset)
        buf, offset = buf[n:], offset + n


class LocalFileWriter:
    """One data file being written by several threads at once (see ``LocalStorage.open_writer``).

    Aligned ranges go through an ``O_DIRECT`` descriptor (no page-cache copy, no dirty
    pages to flush later); anything else, or everything on filesystems without direct
    I/O (tmpfs), goes through a buffered descriptor. Ranges may extend past ``size`` (a
    caller padding its last range to the alignment): ``close`` truncates to ``size``.

    Args:
        path: The file to create (replaced if present).
        size: Its final size in bytes.
        direct_io: Try ``O_DIRECT`` for aligned ranges.
    """

    def __init__(self, path: str, size: int, *, direct_io: bool = True) -> None:
        self.path = path
        self.size = size
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self._dfd: int | None = None
        self._fds = [self._fd]  # every descriptor opened, closed once in _close_fds
        try:
            os.ftruncate(self._fd, size)
            if direct_io and _O_DIRECT:
                self._dfd = _open_direct(path)
                if self._dfd is not None:
                    self._fds.append(self._dfd)
        except BaseException:
            os.close(self._fd)
            raise

    @property
    def direct(self) -> bool:
        """True while aligned ranges bypass the page cache."""
        return self._dfd is not None

    def write_at(self, offset: int, data: memoryview) -> None:
        """Writes ``data`` at ``offset``; safe to call from several threads for disjoint ranges."""
        seg = memoryview(data).cast("B")
        dfd = self._dfd
        if dfd is not None and offset % ALIGN == 0 and _address(seg) % ALIGN == 0:
            aligned = len(seg) - len(seg) % ALIGN
            if aligned:
                try:
                    _pwrite_all(dfd, seg[:aligned], offset)
                    seg, offset = seg[aligned:], offset + aligned
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    log.debug("direct write refused for %s; using buffered writes", self.path)
                    self._dfd = None  # buffered from now on; the fd is closed in close()
        if len(seg):
            _pwrite_all(self._fd, seg, offset)

    def write_gather(self, offset: int, views: Sequence[memoryview]) -> None:
        """Writes ``views`` back to back from ``offset`` through the buffered descriptor.

        One ``pwritev`` per ``IOV_MAX`` views: many small tensors cost a few system
        calls instead of one copy each into a bounce buffer.
        """
        for i in range(0, len(views), _IOV_MAX):
            batch = [memoryview(v).cast("B") for v in views[i : i + _IOV_MAX]]
            want = sum(len(v) for v in batch)
            n = os.pwritev(self._fd, batch, offset)
            if n < want:  # short write: finish the rest one view at a time
                pos = offset
                for v in batch:
                    if n < len(v):
                        _pwrite_all(self._fd, v[n:], pos + n)
                    n = max(0, n - len(v))
                    pos += len(v)
            offset += want

    def close(self, *, sync: bool = True) -> None:
        """Truncates to ``size`` and (by default) fsyncs data and metadata, then closes."""
        try:
            os.ftruncate(self._fd, self.size)
            if sync:
                os.fsync(self._fd)
        finally:
            self._close_fds()

    def abort(self) -> None:
        """Closes without syncing (the caller deletes the file)."""
        self._close_fds()

    def _close_fds(self) -> None:
        fds, self._fds, self._dfd = self._fds, [], None
        for fd in fds:
            os.close(fd)


def _open_direct(path: str) -> int | None:
    try:
        return os.open(path, os.O_WRONLY | _O_DIRECT | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return None  # e.g. tmpfs: buffered writes only
        raise


class LocalStorage:
    """The POSIX filesystem backend.

    Args:
        direct_io: Use ``O_DIRECT`` for aligned segments when the filesystem allows it
            (default: on unless the environment sets ``SHARDSAFE_DIRECT_IO=0``, e.g. for
            network filesystems where direct I/O is slow).
    """

    atomic_rename = True

    def __init__(self, *, direct_io: bool | None = None) -> None:
        if direct_io is None:
            direct_io = knobs.direct_io()
        self.direct_io = direct_io and bool(_O_DIRECT)

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    # ------------------------------------------------------------------ writing
    def open_writer(self, path: str, size: int) -> LocalFileWriter:
        """Opens ``path`` for parallel ranged writes of a file of ``size`` bytes.

        The caller writes disjoint ranges (from any threads) and then calls ``close()``,
        which makes the file durable, or ``abort()``.
        """
        try:
            return LocalFileWriter(path, size, direct_io=self.direct_io)
        except OSError as e:  # e.g. EFBIG from the preallocation: say which file
            raise with_path(e, path) from None

    def write(self, path: str, buffers: Sequence[memoryview]) -> None:
        jobs, offset = [], 0
        for b in buffers:
            b = memoryview(b).cast("B")
            for i in range(0, len(b), SEGMENT):
                jobs.append((b[i : i + SEGMENT], offset + i))
            offset += len(b)
        w = LocalFileWriter(path, offset, direct_io=self.direct_io)
        try:
            for seg, off in jobs:
                w.write_at(off, seg)
        except BaseException:
            w.abort()
            raise
        w.close()

    def write_stream(self, path: str, size: int | None, pieces: Iterable[memoryview]) -> None:
        w = self.open_writer(path, size or 0)
        offset = 0
        try:
            for piece in pieces:
                w.write_at(offset, piece)
                offset += len(memoryview(piece).cast("B"))
            if size is not None and offset != size:
                raise ValueError(f"{path}: {offset} bytes written, {size} expected")
        except BaseException:
            w.abort()
            raise
        w.size = offset
        w.close()

    def publish(self, path: str, data: bytes) -> None:
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                _pwrite_all(fd, memoryview(data), 0)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, path)
        except BaseException as e:
            if os.path.exists(tmp):
                os.remove(tmp)
            if isinstance(e, OSError):
                raise with_path(e, path) from None
            raise
        self.sync_dir(os.path.dirname(path) or ".")

    # ------------------------------------------------------------------ reading
    def sibling_file(self, path: str, directory: str, name: str) -> str:
        # the lexical parent of the caller's path ("." and trailing slashes resolved);
        # the sibling directory itself must be a real directory, never a symlink
        sibling = os.path.join(os.path.dirname(os.path.abspath(path)), directory)
        check_directory(sibling)
        return os.path.join(sibling, name)

    def read(self, path: str) -> bytes:
        # never follows a symlink, never opens a FIFO or device (see storage.files)
        return read_regular(path, MAX_READ)

    def read_into(self, path: str, offset: int, out: memoryview) -> None:
        # Cached pages come from the page cache, the rest with direct I/O (cold loads
        # run at device speed, warm ones at memcpy speed); see cached_or_direct.
        read_range(path, offset, out, direct=self.direct_io)

    def reads_direct(self, path: str) -> bool:
        """Whether a load will read (some of) file ``path`` with direct I/O: direct I/O is on
        and part of the file is out of the page cache (asked of the kernel, no I/O)."""
        if not self.direct_io:
            return False
        try:
            fd, size = open_regular(path)
        except (OSError, CorruptCheckpointError):  # a read of it fails later, with its error
            return False
        try:
            return cached(fd, 0, size) is False
        finally:
            os.close(fd)

    def size(self, path: str) -> int:
        # a symlink, FIFO, device or directory is refused here (CorruptCheckpointError),
        # before anything is read through it (a checkpoint never reads outside itself)
        return check_regular(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def list(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def is_link(self, path: str) -> bool:
        return os.path.islink(path.rstrip("/") or path)  # "link/" would resolve the link

    def is_directory(self, path: str) -> bool:
        try:
            return stat.S_ISDIR(os.lstat(path.rstrip("/") or path).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False

    # ------------------------------------------------------------------ namespace
    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def delete(self, path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=False, onerror=_ignore_missing)
        else:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass

    def rename(self, src: str, dst: str, *, exchange: bool = False) -> None:
        if not exchange:
            os.rename(src, dst)
        else:
            _rename_exchange(src, dst)
        self.sync_dir(os.path.dirname(os.path.abspath(dst)))

    def sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _ignore_missing(func, path, exc_info) -> None:  # noqa: ANN001 - shutil's callback shape
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]


def _rename_exchange(src: str, dst: str) -> None:
    """Atomically swaps two paths with renameat2(RENAME_EXCHANGE) (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available; cannot swap atomically")
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"renameat2({src!r}, {dst!r}, RENAME_EXCHANGE): {os.strerror(err)}")
