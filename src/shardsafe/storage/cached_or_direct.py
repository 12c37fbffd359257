"""Reads that come from the page cache when the data is there, and with direct I/O when not.

A warm read (the checkpoint was just written buffered, or read before) should copy from
the page cache at memcpy speed; a cold read is faster with ``O_DIRECT`` (large device
requests from huge-page memory, no page-cache insertion, no readahead heuristics). Which
one a range needs is asked of the kernel with ``mincore`` on a mapping of the range,
which starts no I/O (a ``preadv2(RWF_NOWAIT)`` probe was measured to start readahead that
then slows the direct read down). Direct reads go through a per-thread huge-page
bounce buffer and are copied out, since targets (tensor memory) are rarely aligned;
aligned targets are read into directly. Without ``O_DIRECT`` or ``mincore`` this is a
plain buffered read.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading

import numpy as np

from .._numbers import ceil_div
from ..format.datafile import ALIGN
from .files import open_regular, reopen_direct
from .memory import anonymous

BOUNCE = 16 << 20  # one checksum block per direct read; kept per I/O thread (4 x 16 MiB)
DIRECT_MIN = 256 << 10  # below this, a buffered read costs less than the checks and the copy
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_tls = threading.local()

try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _mincore = _libc.mincore
    _mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    _mincore.restype = ctypes.c_int
except (OSError, AttributeError):  # not Linux/glibc: every read is buffered
    _mincore = None


def _bounce() -> np.ndarray:
    buf = getattr(_tls, "bounce", None)
    if buf is None:
        _tls.map, buf = anonymous(BOUNCE)
        _tls.bounce = buf
    return buf


def _address(buf: memoryview) -> int:
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data) if len(buf) else 0


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [("nr_cache", ctypes.c_uint64), ("nr_dirty", ctypes.c_uint64),
                ("nr_writeback", ctypes.c_uint64), ("nr_evicted", ctypes.c_uint64),
                ("nr_recently_evicted", ctypes.c_uint64)]


_SYS_CACHESTAT = 451  # Linux 6.5+, the same number on every architecture
_has_cachestat = _mincore is not None and os.uname().sysname == "Linux"


def _cachestat(fd: int, offset: int, length: int) -> bool | None:
    """``cached`` through the ``cachestat`` system call: no mapping of the file, so no
    write lock on the address space (``mmap``/``munmap`` stall every page fault of the
    other I/O threads, which a load into new memory is full of); None where unavailable."""
    global _has_cachestat
    if not _has_cachestat:
        return None
    rng, st = _CachestatRange(offset, length), _Cachestat()
    if _libc.syscall(_SYS_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(st), 0) != 0:
        if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):  # older kernel, or a seccomp filter
            _has_cachestat = False
        return None
    first = offset // mmap.PAGESIZE
    return st.nr_cache >= ceil_div(offset + length, mmap.PAGESIZE) - first


def cached(fd: int, offset: int, length: int) -> bool | None:
    """True if every page of the range is in the page cache; None if it cannot be told."""
    if _mincore is None or length <= 0:
        return None
    fast = _cachestat(fd, offset, length)
    if fast is not None:
        return fast
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    span = offset + length - start
    try:
        m = mmap.mmap(fd, span, prot=mmap.PROT_READ, offset=start)
    except (OSError, ValueError):  # e.g. the range runs past the end of the file
        return None
    try:
        pages = ceil_div(span, mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        view = np.frombuffer(m, dtype=np.uint8)
        rc = _mincore(ctypes.c_void_p(int(view.ctypes.data)), span, vec)
        del view
        if rc != 0:
            return None
        return bool((np.frombuffer(vec, dtype=np.uint8) & 1).all())
    finally:
        m.close()


def _read_direct(dfd: int, out: memoryview, offset: int, path: str) -> None:
    end = offset + len(out)
    if offset % ALIGN == 0 and len(out) % ALIGN == 0 and _address(out) % ALIGN == 0:
        _read_fully(dfd, out, offset, path)  # aligned target: no bounce copy
        return
    bounce = _bounce()
    dst = np.frombuffer(out, dtype=np.uint8)
    pos = offset - offset % ALIGN
    while pos < end:
        want = min(BOUNCE, ceil_div(end - pos, ALIGN) * ALIGN)
        n = os.preadv(dfd, [memoryview(bounce)[:want]], pos)
        lo, hi = max(pos, offset), min(pos + n, end)
        if hi > lo:
            dst[lo - offset : hi - offset] = bounce[lo - pos : hi - pos]
        if n < want and pos + n < end:
            raise EOFError(f"{path}: file ends before byte {end}")
        pos += n


def _read_fully(fd: int, out: memoryview, offset: int, path: str) -> None:
    """Fills ``out`` from ``fd`` at ``offset`` (EOFError if the file ends first)."""
    pos = 0
    while pos < len(out):
        n = os.preadv(fd, [out[pos:]], offset + pos)
        if n == 0:
            raise EOFError(f"{path}: file ends before byte {offset + len(out)}")
        pos += n


def read_range(path: str, offset: int, out: memoryview, *, direct: bool) -> None:
    """Fills ``out`` with the file bytes at ``offset`` (cache if all there, else direct).

    Raises:
        EOFError: the file is shorter than ``offset + len(out)``.
    """
    out = memoryview(out).cast("B")
    fd, _ = open_regular(path)  # no symlink, FIFO or device (CorruptCheckpointError)
    try:
        if direct and _O_DIRECT and len(out) >= DIRECT_MIN and cached(fd, offset, len(out)) is False:
            try:
                dfd = reopen_direct(path, fd, _O_DIRECT)
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise
            else:
                try:
                    _read_direct(dfd, out, offset, path)
                finally:
                    os.close(dfd)
                return
        _read_fully(fd, out, offset, path)
    finally:
        os.close(fd)
