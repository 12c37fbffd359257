"""Local POSIX backend: parallel pwrite/pread, direct I/O where allowed, fsync everywhere.

Writes split each buffer into segments written concurrently by a small thread pool
(``os.pwrite`` releases the GIL). Page-aligned segments go through an ``O_DIRECT``
descriptor when the filesystem accepts one, bypassing the page cache; unaligned tails
use a normal descriptor. The file is fsynced before ``write`` returns.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

log = logging.getLogger("shardsafe")

ALIGN = 4096
SEGMENT = 64 << 20  # bytes one thread writes per call
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_RENAME_EXCHANGE = 2

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def io_threads() -> int:
    """Threads used for parallel file I/O (``SHARDSAFE_IO_THREADS``, default 4)."""
    return max(1, int(os.environ.get("SHARDSAFE_IO_THREADS", "4")))


def io_pool() -> ThreadPoolExecutor:
    """The process-wide pool for file I/O (created lazily, shared by all backends)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(io_threads(), thread_name_prefix="shardsafe-io")
        return _pool


def _address(buf: memoryview) -> int:
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data) if len(buf) else 0


def _pwrite_all(fd: int, buf: memoryview, offset: int) -> None:
    while len(buf):
        n = os.pwrite(fd, buf, offset)
        buf, offset = buf[n:], offset + n


def _pread_all(fd: int, out: memoryview, offset: int, path: str) -> None:
    while len(out):
        n = os.preadv(fd, [out], offset)
        if n == 0:
            raise EOFError(f"{path}: file ends before byte {offset + len(out)}")
        out, offset = out[n:], offset + n


def _direct_ok(buf: memoryview, offset: int) -> bool:
    return len(buf) % ALIGN == 0 and offset % ALIGN == 0 and _address(buf) % ALIGN == 0


class LocalStorage:
    """The POSIX filesystem backend.

    Args:
        direct_io: Use ``O_DIRECT`` for aligned segments when the filesystem allows it.
    """

    atomic_rename = True

    def __init__(self, *, direct_io: bool = True) -> None:
        self.direct_io = direct_io and bool(_O_DIRECT)

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    # ------------------------------------------------------------------ writing
    def _open_direct(self, path: str) -> int | None:
        if not self.direct_io:
            return None
        try:
            return os.open(path, os.O_WRONLY | _O_DIRECT | os.O_CLOEXEC)
        except OSError as e:
            if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                return None  # e.g. tmpfs: buffered writes only
            raise

    def write(self, path: str, buffers: Sequence[memoryview]) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        dfd = None
        try:
            dfd = self._open_direct(path)
            jobs, offset = [], 0
            for b in buffers:
                b = memoryview(b).cast("B")
                for i in range(0, len(b), SEGMENT):
                    jobs.append((b[i : i + SEGMENT], offset + i))
                offset += len(b)
            os.ftruncate(fd, offset)

            def one(seg: memoryview, off: int) -> None:
                if dfd is not None:
                    aligned = len(seg) - len(seg) % ALIGN
                    if aligned and off % ALIGN == 0 and _address(seg) % ALIGN == 0:
                        try:
                            _pwrite_all(dfd, seg[:aligned], off)
                            seg, off = seg[aligned:], off + aligned
                        except OSError as e:
                            if e.errno != errno.EINVAL:
                                raise
                _pwrite_all(fd, seg, off)

            if len(jobs) <= 1:
                for seg, off in jobs:
                    one(seg, off)
            else:
                for fut in [io_pool().submit(one, s, o) for s, o in jobs]:
                    fut.result()
            os.fsync(fd)
        finally:
            if dfd is not None:
                os.close(dfd)
            os.close(fd)

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
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        self.sync_dir(os.path.dirname(path) or ".")

    # ------------------------------------------------------------------ reading
    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def read_into(self, path: str, offset: int, out: memoryview) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _pread_all(fd, memoryview(out).cast("B"), offset, path)
        finally:
            os.close(fd)

    def size(self, path: str) -> int:
        return os.stat(path).st_size

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def list(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []

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
