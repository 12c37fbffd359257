"""How a load reads the index: rank 0 reads what every rank needs, each rank what only it needs.

With many ranks, N reads of the same index (a metadata storm on shared file systems, N
GETs of one object on object stores, and with N x 130 MB at 16,384 ranks) become:

* the *head*, which every rank needs: a version 4 index's header and global part (tree,
  tensor table, layout rules; a few kilobytes), or all of a version 1-3 index. In a
  collective load rank 0 reads it (two ranged reads), the ranks agree through a bounded
  store round whose values are a few bytes (``comm.rounds``: a rank that never joins
  turns into ``CheckpointTimeoutError`` naming it, and nobody is left waiting in a
  collective), and the head travels by the process group's broadcast, never through the
  c10d store (docs/concepts/index-parts.md);
* the *parts* only this rank needs (version 4): from the layout rules, the parts that
  hold the chunks its targets overlap; the rank reads their directory entries and then
  the parts by byte range (nearby ones in one request), and checks the size of the data
  files it will read, not of every file.

``STATS`` records what this process's most recent load read of its index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import knobs
from ...comm import Comm, next_namespace
from ...comm.rounds import Answer, join, leader_exchange, leave
from ...errors import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError
from ...format import INDEX_NAME
from ...format.index.objects import Index, from_columnar
from ...format.index.v4_global import GlobalPart, Region
from ...format.index.v4_layout import HEADER, VERSION, Header, head_fields
from ...format.index.container import version_of
from ...format.index.rules import MAX_INDEX_BYTES
from ...format.index.versions import decode_index
from ...plan.load_plan import coalesce
from ...storage import Storage
from ..commit import transaction as commit

GAP = 64 << 10  # index byte ranges closer than this are read in one request
SIZE_FIRST = 1 << 20  # index reads above this compare their end with the file's size first


@dataclass(slots=True)
class IndexStats:
    """What this process's most recent load read of its index.

    Attributes:
        read: Bytes of ``index.json`` this rank read from storage.
        received: Bytes of it this rank received from rank 0 (the broadcast head).
        requests: Read requests this rank made of ``index.json``.
        parts: The parts of a version 4 index this rank read.
    """

    read: int = 0
    received: int = 0
    requests: int = 0
    parts: list[int] = field(default_factory=list)

    def reset(self) -> None:
        self.read = self.received = self.requests = 0
        self.parts = []


STATS = IndexStats()


def _read(storage: Storage, spath: str, offset: int, n: int) -> bytes:
    """Bytes ``[offset, offset + n)`` of the index (counted in ``STATS``). A read of more
    than ``SIZE_FIRST`` bytes asks for the file's size first: a forged header's sizes must
    not make a reader allocate what the file does not hold."""
    path = storage.join(spath, INDEX_NAME)
    try:
        if n > SIZE_FIRST and (size := storage.size(path)) < offset + n:
            raise CorruptCheckpointError(f"index is truncated or forged: it is {size} bytes, its header "
                                         f"places {n} bytes at {offset}", file=INDEX_NAME)
        buf = bytearray(n)
        storage.read_into(path, offset, memoryview(buf))
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointNotFoundError(f"no committed checkpoint at {spath!r} (no {INDEX_NAME})") from None
    except EOFError:
        raise CorruptCheckpointError(f"index is truncated (it ends before byte {offset + n})",
                                     file=INDEX_NAME) from None
    STATS.read += n
    STATS.requests += 1
    return bytes(buf)


@dataclass(slots=True)
class IndexRead:
    """What a load has read of an index: all of it, or a version 4 index's head.

    Attributes:
        storage, spath: Where the checkpoint is.
        index: The whole index, or (``head`` set) the global part's tree, tensors and the
            tensors stored as one chunk: enough to match a state and to check metadata.
        head: The decoded global part of a version 4 index (None: ``index`` is whole).
        raw: The head's bytes (all of a version 1-3 index).
    """

    storage: Storage
    spath: str
    index: Index
    head: GlobalPart | None
    raw: bytes

    def narrow(self, regions: Sequence[Region]) -> Index:
        """The index a load of ``regions`` (tensor id, offsets, shape) needs: for version 4
        the chunks of those tensors that the global part and the parts they overlap hold,
        read by byte range (the sizes of the data files they lie in checked); else the
        whole index."""
        if self.head is None:
            return self.index
        parts = self.head.parts_for(regions)
        STATS.parts = parts
        index = from_columnar(self.head.narrow(read_parts(self, parts), (t for t, _, _ in regions)), VERSION)
        commit.check_data_files(self.storage, self.spath, index)
        return index


def read_parts(read: IndexRead, parts: Sequence[int]) -> dict[int, tuple[bytes, tuple[int, int, int]]]:
    """Parts ``parts`` and their directory entries, read in as few requests as ranges
    within ``GAP`` of each other allow (``plan.load_plan.coalesce``, as data reads)."""
    assert read.head is not None
    h = read.head.header
    entries: dict[int, tuple[int, int, int]] = {}
    for group in _groups(parts, [h.entry_span(k, k) for k in parts]):
        off, n = h.entry_span(group[0], group[-1])
        got = h.entries(_read(read.storage, read.spath, off, n), group[0])
        entries.update((k, got[k - group[0]]) for k in group)
    out = {}
    for group in _groups(parts, [entries[k][:2] for k in parts]):
        lo = entries[group[0]][0]
        data = _read(read.storage, read.spath, lo, max(entries[k][0] + entries[k][1] for k in group) - lo)
        for k in group:
            out[k] = (data[entries[k][0] - lo : entries[k][0] + entries[k][1] - lo], entries[k])
    return out


def _groups(parts: Sequence[int], spans: Sequence[tuple[int, int]]) -> list[list[int]]:
    """``parts`` grouped into reads of the index by their ``(offset, length)`` spans, in
    offset order (``plan.load_plan.coalesce``)."""
    order, bounds = coalesce(np.zeros(len(parts), dtype=np.int64), [o for o, _ in spans], [n for _, n in spans],
                             MAX_INDEX_BYTES, GAP)
    ordered = [parts[i] for i in order.tolist()]
    edges = bounds.tolist()
    return [ordered[a:b] for a, b in zip(edges, edges[1:])]


def _v4_head(storage: Storage, spath: str) -> bytes | None:
    """The header and global part of a version 4 index (two ranged reads); None for an
    index of an older version (or one too short to say)."""
    try:
        first = _read(storage, spath, 0, HEADER.size)
    except CorruptCheckpointError:  # shorter than a v4 header: an older version (or damage)
        return None
    if version_of(first) != VERSION:
        return None
    return first + _read(storage, spath, HEADER.size, Header(first).head_size - HEADER.size)


def read_index_alone(storage: Storage, spath: str, whole: bool = False) -> IndexRead:
    """One rank reads the index without the others: a version 4 index's head (``whole``:
    all of it), or all of an older one (the sizes of the data files of a whole index
    checked).

    Raises:
        CheckpointNotFoundError: no committed checkpoint at ``spath``.
        CorruptCheckpointError: the index is damaged (or a data file, for a whole index).
    """
    STATS.reset()
    raw = _v4_head(storage, spath)
    if raw is None:
        data, index = commit.read_index_bytes(storage, spath)
        STATS.read, STATS.requests = STATS.read + len(data), STATS.requests + 1
        return IndexRead(storage, spath, index, None, data)
    if not whole:
        return from_head(storage, spath, raw)
    data = raw + _read(storage, spath, len(raw), Header(raw).file_size - len(raw))
    index = decode_index(data)
    commit.check_data_files(storage, spath, index)
    return IndexRead(storage, spath, index, None, data)


def read_metadata(storage: Storage, spath: str) -> dict[str, Any]:
    """The user metadata of the committed checkpoint at ``spath``, from a version 4
    index's head alone (its tensor tables not decoded: listing a directory of steps costs
    a few kilobytes each), or from all of an older index.

    Raises:
        CheckpointNotFoundError: no committed checkpoint at ``spath``.
        CorruptCheckpointError: the index (its head) is damaged.
    """
    raw = _v4_head(storage, spath)
    if raw is None:
        return commit.read_index(storage, spath).metadata
    return head_fields(raw)["metadata"]


def from_head(storage: Storage, spath: str, raw: bytes) -> IndexRead:
    """The ``IndexRead`` of index bytes rank 0 read: a version 4 head, or a whole index."""
    if version_of(raw) == VERSION and len(raw) < Header(raw).file_size:
        head = GlobalPart.decode(raw)
        return IndexRead(storage, spath, from_columnar(head.narrow({}), VERSION), head, raw)
    return IndexRead(storage, spath, decode_index(raw), None, raw)


def read_index_collective(storage: Storage, spath: str, comm: Comm, timeout: float | None = None,
                          whole: bool = False) -> IndexRead:
    """Rank 0 reads and validates the index's head (``whole``: all of the index) once and
    broadcasts it; every rank decodes it. Where the byte collectives run on a key-value
    store (``Comm.bulk`` False: a ``jax.distributed`` job), the ranks agree through the
    store and each reads the head from storage itself.

    When rank 0 fails, every other rank reads the index itself, so it raises the very
    same error.

    Raises:
        CheckpointTimeoutError: a rank did not join within ``timeout`` seconds (default
            ``SHARDSAFE_TIMEOUT``); the message names it.
    """
    wait = knobs.timeout() if timeout is None else float(timeout)
    mine, error = None, None
    if comm.rank == 0:
        try:
            mine = read_index_alone(storage, spath, whole)
        except CheckpointError as e:
            error = e
    else:
        STATS.reset()
    verdict: dict[str, Any] = {"error": True} if error is not None else {"bytes": len(mine.raw) if mine else 0}
    decision = _agree(comm, verdict, wait)
    if error is not None:
        raise error
    if "error" in decision:
        return read_index_alone(storage, spath, whole)
    if not comm.bulk:  # a key-value store carries small values only: each rank reads the head
        if mine is not None:
            return mine
        read = read_index_alone(storage, spath, whole)
        if len(read.raw) != decision["bytes"]:
            raise CheckpointError(f"read {len(read.raw)} index bytes, rank 0 read {decision['bytes']} "
                                  f"(the checkpoint changed during the load?)")
        return read
    data = comm.broadcast_bytes(mine.raw if mine is not None else None)
    if mine is not None:
        return mine
    STATS.received = len(data)
    if len(data) != decision["bytes"]:
        raise CheckpointError(f"received {len(data)} index bytes from rank 0, it announced {decision['bytes']}")
    return from_head(storage, spath, data)


def _agree(comm: Comm, verdict: dict[str, Any], wait: float) -> dict[str, Any]:
    """The bounded round: every rank arrives (or every rank raises, naming the missing
    ones), and rank 0's verdict reaches all of them."""
    ch = comm.channel(next_namespace(comm, "load"))
    join(ch)
    try:
        return leader_exchange(ch, "index", b"", lambda _: Answer(verdict), wait,
                               what="reading the index of a load", first=True).decision
    finally:
        leave(ch)
