"""A local checkpoint as one byte stream, and back (what travels to and from a peer).

A stream is an 8-byte little-endian header length, a JSON header
``{"step": N, "rank": r, "error": str | null, "files": [[name, size], ...]}`` and the
files' bytes one after another (the index and the data files, exactly as on disk, so
the receiver verifies the same checksums when it loads). A rank whose local save
failed sends a header with its ``error`` and no files, so every round still pairs up.

Sending (``outgoing``) opens every file of the step through ``storage.files`` (a
symlink, FIFO, device or directory inside a step is refused before anything is read
from it, so a copy can neither hang nor ship what lies outside the step) and maps it
into memory: the files are sent from the mapping, never copied whole. Receiving
(``Incoming``) takes the stream chunk by chunk: the data files go straight into the
working directory of an ``engine.commit`` transaction and the index is published last
by the same commit as any save, so a copy is either complete or absent.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engine import commit
from ..errors import CheckpointError, CorruptCheckpointError
from ..format import INDEX_NAME
from ..format.index.rules import MAX_INDEX_BYTES
from ..storage import storage_for
from ..storage.base import RangeWriter
from ..storage.files import check_regular, open_regular

_LEN = struct.Struct("<Q")
_MAX_HEADER = 1 << 20


@dataclass(slots=True)
class Outgoing:
    """What a rank sends: the stream's segments (header, then mapped files); ``close`` unmaps."""

    segments: list[Any]
    _maps: list[mmap.mmap] = field(default_factory=list)

    def close(self) -> None:
        self.segments = []
        for m in self._maps:
            try:
                m.close()
            except BufferError:  # a view is still alive (a failed send): the GC frees it
                pass
        self._maps = []


def _header(step: int, rank: int, error: str | None, files: Sequence[tuple[str, int]]) -> list[Any]:
    head = json.dumps({"step": step, "rank": rank, "error": error,
                       "files": [[n, s] for n, s in files]}).encode()
    return [_LEN.pack(len(head)), head]


def outgoing(step: int, rank: int, directory: str | None, error: str | None = None) -> Outgoing:
    """The stream of ``directory`` (a committed step directory), or an error notice.

    Raises:
        CorruptCheckpointError: an entry of the step is not a regular file (named).
    """
    if directory is None or error is not None:
        return Outgoing(_header(step, rank, error or "no local copy", []))
    out = Outgoing([])
    files = []
    try:
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            check_regular(path)  # a symlink, FIFO or device is refused without being opened
            fd, size = open_regular(path)
            try:
                if size:
                    out._maps.append(mmap.mmap(fd, size, access=mmap.ACCESS_COPY))
                    out.segments.append(out._maps[-1])
                files.append((name, size))
            finally:
                os.close(fd)
    except BaseException:
        out.close()
        raise
    out.segments[:0] = _header(step, rank, None, files)
    return out


@dataclass(frozen=True, slots=True)
class Received:
    """A stream once complete: which step of which rank, and where it was stored (None
    when the sender reported an error instead)."""

    step: int
    rank: int
    error: str | None
    path: str | None


class Incoming:
    """Receives one stream chunk by chunk into ``parent/<step name>`` (see module docstring).

    Args:
        parent: The directory the copy is stored in (a local path).
        name_of: The directory name of a step.
    """

    def __init__(self, parent: str, name_of: Callable[[int], str]) -> None:
        self.parent, self.name_of = parent, name_of
        self._head = bytearray()
        self._need: int | None = None  # header bytes still expected
        self._files: list[tuple[str, int]] = []
        self._meta: dict[str, Any] = {}
        self._at = 0  # position in the data part of the stream
        self._file = 0
        self._writer: RangeWriter | None = None
        self._index = bytearray()
        self._txn: commit.Transaction | None = None
        self.received: Received | None = None

    def feed(self, data: memoryview) -> None:
        """Takes the next bytes of the stream (in order)."""
        try:
            self._feed(data)
        except BaseException:
            self.abort()
            raise

    def _feed(self, data: memoryview) -> None:
        while len(data):
            if self._txn is None and self.received is None:
                data = self._take_header(data)
                continue
            data = self._take_data(data)

    def _take_header(self, data: memoryview) -> memoryview:
        want = _LEN.size if self._need is None else self._need
        take = max(0, want - len(self._head))
        self._head += data[:take]
        data = data[take:]
        if len(self._head) < want:
            return data
        if self._need is None:
            (n,) = _LEN.unpack(bytes(self._head))
            if n > _MAX_HEADER:
                raise CorruptCheckpointError(f"malformed peer message: a {n}-byte header")
            self._need = _LEN.size + n
            return data
        self._start(self._head[_LEN.size :])
        return data

    def _start(self, raw: bytes | bytearray) -> None:
        try:
            head = json.loads(bytes(raw))
            step, rank, error = int(head["step"]), int(head["rank"]), head["error"]
            files = [(str(n), int(s)) for n, s in head["files"]]
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptCheckpointError(f"malformed peer message: {e}") from None
        names = [n for n, _ in files]
        for name, size in files:
            if os.path.basename(name) != name or name.startswith(".") or size < 0:
                raise CorruptCheckpointError(f"malformed peer message: bad file {name!r} ({size} bytes)")
        if error is None and (names.count(INDEX_NAME) != 1 or len(set(names)) != len(names)):
            raise CorruptCheckpointError("malformed peer message: not one index and distinct files")
        if error is None and not 0 < dict(files)[INDEX_NAME] <= MAX_INDEX_BYTES:
            raise CorruptCheckpointError("malformed peer message: the index is empty or too large")
        self._meta = {"step": step, "rank": rank}
        if error is not None:  # (else the files hold the index: checked above)
            self.received = Received(step, rank, str(error), None)
            return
        storage, parent = storage_for(self.parent)
        storage.makedirs(parent)
        self._storage = storage
        self._txn = commit.plan_transaction(storage, storage.join(parent, self.name_of(step)),
                                            overwrite=True)
        commit.begin(self._txn)
        self._files = files
        self._skip_empty()

    def _skip_empty(self) -> None:
        while self._file < len(self._files) and self._files[self._file][1] == 0 \
                and self._files[self._file][0] != INDEX_NAME:
            self._open(self._files[self._file][0], 0)
            self._close_file()
        if self._file == len(self._files):
            self._finish()

    def _open(self, name: str, size: int) -> None:
        assert self._txn is not None
        if name != INDEX_NAME:
            w = self._storage.open_writer(self._storage.join(self._txn.workdir, name), size)
            assert w is not None  # a local path: ranged writes
            self._writer = w

    def _close_file(self) -> None:
        if self._writer is not None:
            self._writer.close(sync=True)
            self._writer = None
        self._file += 1
        self._at = 0

    def _take_data(self, data: memoryview) -> memoryview:
        if self._file == len(self._files):
            raise CorruptCheckpointError("malformed peer message: bytes left over")
        name, size = self._files[self._file]
        if self._at == 0 and self._writer is None:
            self._open(name, size)
        take = min(len(data), size - self._at)
        if name == INDEX_NAME:
            self._index += data[:take]
        elif self._writer is not None and take:
            self._writer.write_at(self._at, data[:take])
        self._at += take
        if self._at == size:
            self._close_file()
            self._skip_empty()
        return data[take:]

    def _finish(self) -> None:
        assert self._txn is not None
        commit.finish(self._txn, bytes(self._index))
        self.received = Received(self._meta["step"], self._meta["rank"], None, self._txn.final)
        self._txn = None

    def done(self) -> Received:
        """The outcome once the whole stream arrived.

        Raises:
            CorruptCheckpointError: the stream ended early.
        """
        if self.received is None:
            self.abort()
            raise CorruptCheckpointError("malformed peer message: the stream ended early")
        return self.received

    def abort(self) -> None:
        """Removes a partly received copy (nothing of it is committed)."""
        if self._writer is not None:
            self._writer.abort()
            self._writer = None
        if self._txn is not None:
            try:
                commit.abort(self._txn)
            except OSError as e:  # the receive error matters more
                raise CheckpointError(f"could not remove a partly received copy: {e}") from e
            finally:
                self._txn = None


__all__ = ["Incoming", "Outgoing", "Received", "outgoing"]
