"""One writable manager per directory: the owner lock.

A writable ``CheckpointManager`` (rank 0 of a job) creates ``<directory>/.shardsafe-manager.lock``
holding its host, pid, start time and a random token. A second writable manager finds the
file and raises ``CheckpointError`` naming the owner, instead of removing the first one's
in-flight save as a leftover or deleting its steps by retention. A lock whose owner is a
dead process on this host is stale (the owner crashed or was killed) and is taken over.
A lock of another host is trusted until an operator removes it (we cannot see that
host's processes); the error says so.

On a local filesystem the lock is written to a private file and hard-linked into place,
which fails if a lock exists: of two managers starting at once exactly one wins, and a
lock is never seen empty or half-written. A lock file is read only if it is a small
regular file; anything else in its place (forged or damaged content, a huge file, a
symlink, a FIFO) is damage and is replaced, except a directory, which is refused.
Replacing a stale or damaged lock is serialised with ``flock`` on the directory, and the
lock is removed only if it is still the file that was judged: of two managers taking one
stale lock over, the second sees the first one's new lock instead of deleting it. Object stores have no exclusive create: there the
lock is written and read back, which catches a second manager started later but not two
started within the same moment.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from ..errors import CheckpointError, CorruptCheckpointError
from ..format.index.rules import reject_constant
from ..storage import LocalStorage
from ..storage.base import Storage

log = logging.getLogger("shardsafe")

LOCK_NAME = ".shardsafe-manager.lock"
MAX_LOCK_BYTES = 4096  # what LockOwner.encode writes is ~150 bytes
_MAX_PID = (1 << 31) - 1  # a pid_t; os.kill needs a C int
_MAX_TIME = 1e11  # seconds since the epoch (year 5138): time.gmtime handles it


@dataclass(frozen=True, slots=True)
class LockOwner:
    """Who holds a directory's lock.

    Attributes:
        host: The owner's host name.
        pid: The owner's process id on that host.
        started: Unix time the owner took the lock.
        token: A random value naming this lock (so a manager only removes its own).
    """

    host: str
    pid: int
    started: float
    token: str

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        return f"pid {self.pid} on host {self.host!r}, since {when}"

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode("utf-8")


def _decode(data: bytes) -> LockOwner | None:
    """The owner recorded in a lock file; None if the file is not a lock we wrote (anything
    else in it -- a huge or negative pid, a non-finite time, deep JSON -- is damage)."""
    try:
        raw = json.loads(data.decode("utf-8"), parse_constant=reject_constant)
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, dict):
        return None
    host, pid, started, token = (raw.get(k) for k in ("host", "pid", "started", "token"))
    if not (isinstance(host, str) and len(host) <= 255 and isinstance(token, str) and len(token) <= 64
            and type(pid) is int and 1 <= pid <= _MAX_PID  # noqa: E721 - not a bool
            and type(started) in (int, float) and 0 <= started < _MAX_TIME):  # noqa: E721
        return None
    return LockOwner(host, pid, float(started), token)


def _read(storage: Storage, path: str) -> LockOwner | None:
    """The owner a lock file names; None when it is damaged, larger than a lock can be, or
    not a regular file (it is never read whole then)."""
    try:
        if storage.size(path) > MAX_LOCK_BYTES:
            return None
        return _decode(storage.read(path))
    except CorruptCheckpointError:  # a symlink, FIFO or directory where the lock should be
        return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _create(storage: Storage, path: str, data: bytes) -> bool:
    """Creates the lock file, complete, unless it exists; True if this call created it.

    Locally the content is written to a private file first and hard-linked into place:
    the link fails if the lock exists, and a lock that exists is never seen empty or
    half-written by another manager (which would take it over as damaged).
    """
    if isinstance(storage, LocalStorage):
        tmp = f"{path}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.remove(tmp)
        storage.sync_dir(os.path.dirname(path) or ".")
        return True
    if storage.exists(path):
        return False
    storage.publish(path, data)
    return storage.read(path) == data  # best effort: another writer may have raced us


def _fingerprint(storage: Storage, path: str) -> tuple[int, ...] | None:
    """Which file ``path`` is now (local: device, inode, size, mtime); None elsewhere or absent."""
    if not isinstance(storage, LocalStorage):
        return None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


@contextmanager
def _takeover_guard(storage: Storage, directory: str) -> Iterator[None]:
    """Serialises lock takeovers of one local directory (``flock`` on the directory).

    Without it two managers that both judged the same lock stale could each delete it:
    the second would delete the lock the first had just created. Where ``flock`` is not
    available (object stores, some network file systems) the takeover is best effort.
    """
    fd = None
    if isinstance(storage, LocalStorage):
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            log.debug("no flock on %s (%s): lock takeover is best effort", directory, e)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the flock


class DirectoryLock:
    """The lock of one manager directory, held from ``acquire`` until ``release``."""

    def __init__(self, storage: Storage, directory: str, owner: LockOwner) -> None:
        self._storage = storage
        self._path = storage.join(directory, LOCK_NAME)
        self.owner = owner

    @classmethod
    def acquire(cls, storage: Storage, directory: str, url: str) -> DirectoryLock:
        """Takes the lock of ``directory`` (``url`` names it in errors).

        Raises:
            CheckpointError: Another live manager holds it (the message names its host,
                pid and start time).
        """
        me = LockOwner(socket.gethostname(), os.getpid(), time.time(), secrets.token_hex(8))
        path = storage.join(directory, LOCK_NAME)
        for _ in range(5):  # a stale lock removed, or a lock released meanwhile: try again
            if _create(storage, path, me.encode()):
                return cls(storage, directory, me)
            seen = _fingerprint(storage, path)  # before the read: what is judged is at most this
            try:
                other = _read(storage, path)
            except FileNotFoundError:
                continue  # released between our create and our read
            if other is not None and not (other.host == me.host and not _alive(other.pid)):
                hint = "" if other.host == me.host else (
                    f"; if that job is gone, delete {path!r}")
                raise CheckpointError(
                    f"{url!r} already has a writable CheckpointManager: {other.describe()}; "
                    f"use read_only=True for a second manager{hint}")
            if storage.is_directory(path):  # never removed: its files are not ours to delete
                raise CheckpointError(f"{path!r} is a directory, not a manager lock; remove it")
            what = "damaged lock" if other is None else f"stale lock of {other.describe()} (dead)"
            log.warning("taking over the %s in %s", what, url)
            with _takeover_guard(storage, directory):  # two managers taking over: one at a time
                if _fingerprint(storage, path) != seen:
                    continue  # replaced since we judged it (another manager took it over): look again
                storage.delete(path)  # a link is removed itself, never what it points to
        raise CheckpointError(f"could not take the manager lock {path!r}: other managers keep "
                              f"taking it")

    def held(self) -> bool:
        """True while the lock file still names this owner."""
        try:
            other = _read(self._storage, self._path)
        except FileNotFoundError:
            return False
        return other is not None and other.token == self.owner.token

    def release(self) -> None:
        """Removes the lock file if it is still ours (idempotent)."""
        if self.held():
            self._storage.delete(self._path)

    def release_quietly(self) -> None:
        """``release``, logging (not raising) an I/O error: for ``close`` and exit paths."""
        try:
            self.release()
        except OSError as e:
            log.warning("could not remove the manager lock %s: %s", self._path, e)
