"""Incremental saves: which chunks are unchanged since the last committed save, exactly.

A ``Baseline`` is what one rank's previous committed save of a ``CheckpointManager``
wrote: for every chunk, a digest of its bytes and where those bytes are stored (a data
file of that step, or of the earlier step it referenced in turn). The next save hashes
each chunk it is about to write and compares it with the chunk of the same key path,
dtype, global shape, position and shape in the baseline; an equal digest means the
bytes are equal, and the new index references the stored bytes instead of writing them
again (``Delta.refs``).

Change detection is exact: the digest is a 256-bit cryptographic hash (SHA-256 or
BLAKE2b-256 from ``hashlib``, whichever this machine computes faster: SHA-256 where the
CPU has SHA instructions) of the exact bytes being saved. Different contents get equal
digests with probability about 2^-256 per comparison, and even a deliberate collision
would cost about 2^128 work; on top of the digest the key, dtype, shapes and byte count
must be equal. The bytes are hashed in pieces of ``PIECE`` bytes on the I/O pool
(``hashlib`` releases the GIL for large buffers), so hashing runs on every I/O thread;
a chunk's digest is the hash of its byte count and its piece digests. The algorithm is
chosen once per process, and digests live only in that process's memory, so two
algorithms are never compared with each other. (A CUDA tensor is copied to the host to
be hashed, one tensor at a time.)

A reference always names the file that really holds the bytes (``step_N/<file>``, a
name relative to the manager directory): a chunk referenced by the previous save keeps
that save's reference, so chains never form. A compressed chunk (``compression=``) is
referenced in its block file with its coding (codec, stored size and stored CRC32C per
block), so an unchanged chunk is neither written nor coded again; hashing compares the
raw bytes, whatever their coding. The baseline lives in memory only: after
a restart the first save writes everything (see docs/guides/incremental.md).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ... import values
from ...format.blockfile import DATA_START as BLOCK_FILE_DATA_START
from ...format.index.rows import FileEntry
from ...format.tree import KeyPath
from ...plan.flatten import TensorItem
from ...plan.layout import FilePlan
from ..commit.transaction import split_path
from ..commit.entries import ChunkRef
from ..commit.entries import CodedFile
from ..io_pool import io_pool, wait_all


DIGEST_SIZE = 32  # bytes: 256-bit digests
PIECE = 16 << 20  # bytes hashed by one I/O-pool job
ALGORITHMS = ("sha256", "blake2b")  # both 256-bit cryptographic hashes in hashlib
_CALIBRATION = 4 << 20  # bytes each candidate hashes once to pick the faster
_chosen: list[str] = []

ChunkKey = tuple[KeyPath, str, tuple[int, ...], tuple[int, ...], tuple[int, ...]]


@dataclass(slots=True)
class Delta:
    """One save's chunks, divided into those to write and those already stored.

    Attributes:
        write: Items whose bytes changed (or are new): written as usual.
        refs: Items whose bytes are stored already, with where.
        digests: Digest of every chunk hashed, by ``chunk_key``.
    """

    write: list[TensorItem]
    refs: list[tuple[TensorItem, ChunkRef]] = field(default_factory=list)
    digests: dict[ChunkKey, bytes] = field(default_factory=dict)


def chunk_key(it: TensorItem) -> ChunkKey:
    """What must be equal, besides the bytes, for a chunk to be the same chunk."""
    return (tuple(it.path), it.dtype, tuple(it.shape), tuple(it.offsets), tuple(it.local_shape))


def algorithm() -> str:
    """The hash of this process: the faster of ``ALGORITHMS`` here (measured once)."""
    if not _chosen:
        data = bytes(_CALIBRATION)
        best = min(ALGORITHMS, key=lambda name: _timed(name, data))
        _chosen.append(best)
    return _chosen[0]


def _timed(name: str, data: bytes) -> float:
    t0 = time.perf_counter()
    _new(name).update(data)
    return time.perf_counter() - t0


def _new(name: str) -> Any:
    return hashlib.blake2b(digest_size=DIGEST_SIZE) if name == "blake2b" else hashlib.sha256()


def _hash_piece(name: str, data: memoryview) -> bytes:
    h = _new(name)
    h.update(data)
    return h.digest()


def digests(items: Sequence[TensorItem]) -> dict[int, bytes]:
    """256-bit digest of each item's bytes, by item id, hashed in parallel on the I/O pool."""
    return {it.id: d for it, d in zip(items, _hash_all(items))}


def _hash_all(items: Sequence[TensorItem]) -> list[bytes]:
    """The digest of each item's bytes, in order (the shards of one tensor share an id)."""
    name = algorithm()
    views = [memoryview(values.host_bytes(it.value)) for it in items]
    jobs = [[io_pool().submit(_hash_piece, name, v[a : a + PIECE]) for a in range(0, len(v), PIECE)]
            for v in views]
    wait_all([f for fs in jobs for f in fs])
    out = []
    for v, fs in zip(views, jobs):
        h = _new(name)
        h.update(len(v).to_bytes(8, "little"))
        for f in fs:
            h.update(f.result())
        out.append(h.digest())
    return out


class Baseline:
    """One rank's view of the last committed save of a manager: per chunk, digest and place.

    Thread-safe: the manager's caller thread splits a save while the previous save's
    writer thread may still advance it (the Checkpointer waits for that save first, so
    in practice the two never overlap).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._source: str | None = None
        self._parent: str | None = None
        self._chunks: dict[ChunkKey, tuple[bytes, ChunkRef]] = {}

    @property
    def source(self) -> str | None:
        """Directory name of the step this baseline describes (None: empty)."""
        return self._source

    def files(self) -> set[str]:
        """The data files (``<step directory>/<file>``) the baseline's chunks are stored in."""
        with self._lock:
            return {ref.file.name for _, ref in self._chunks.values()}

    def reset(self) -> None:
        """Forgets everything: the next save writes every chunk."""
        with self._lock:
            self._source, self._chunks = None, {}

    def keep_only_if(self, steps: Iterable[str]) -> bool:
        """Resets unless its step is one of ``steps`` (the committed step directory names);
        True if it did (its step was deleted, rolled back or set aside)."""
        with self._lock:
            gone = self._source is not None and self._source not in set(steps)
            if gone:
                self._source, self._chunks = None, {}
        return gone

    def split(self, items: Sequence[TensorItem], path: str) -> Delta:
        """Hashes ``items`` and divides them into changed ones and ones stored already.

        ``path``: the checkpoint being saved. References resolve against its parent, so
        only a save into the baseline step's parent references anything.
        """
        keys = [chunk_key(it) for it in items]
        sums = dict(zip(keys, _hash_all(items)))
        out = Delta([], digests=sums)
        with self._lock:
            known_chunks = self._chunks if split_path(path)[0] == self._parent else {}
            for it, key in zip(items, keys):
                known = known_chunks.get(key)
                if known is not None and known[0] == sums[key] and it.nbytes > 0:
                    out.refs.append((it, known[1]))
                else:
                    out.write.append(it)
        return out

    def advance(self, path: str, plans: Sequence[FilePlan],
                checksums: Sequence[Sequence[Sequence[int]]], split: Delta, rank: int,
                coded: Sequence[CodedFile] = ()) -> None:
        """After the save to ``path`` committed: its chunks become the baseline.

        ``plans``/``checksums``: the safetensors files this rank wrote and their per-item
        block checksums; ``coded``: the block files it wrote (compressed chunks, with their
        coding); ``split``: what it hashed and referenced.
        """
        parent, step_dir = split_path(path)
        chunks: dict[ChunkKey, tuple[bytes, ChunkRef]] = {}
        for plan, per_item in zip(plans, checksums):
            f = FileEntry(f"{step_dir}/{plan.name}", plan.layout.size, plan.layout.data_start, rank)
            for it, off, sums in zip(plan.items, plan.layout.offsets, per_item):
                key = chunk_key(it)
                if key in split.digests:
                    chunks[key] = (split.digests[key], ChunkRef(f, off, tuple(sums)))
        for w in coded:
            f = FileEntry(f"{step_dir}/{w.name}", w.size, BLOCK_FILE_DATA_START, rank)
            for i, it in enumerate(w.items):
                key = chunk_key(it)
                if key in split.digests:
                    chunks[key] = (split.digests[key], ChunkRef(
                        f, w.offsets[i], tuple(w.sums[i]), tuple(w.codec[i]), tuple(w.stored[i]),
                        tuple(w.stored_sums[i])))
        for it, ref in split.refs:
            key = chunk_key(it)
            chunks[key] = (split.digests[key], ref)
        with self._lock:
            self._parent, self._source, self._chunks = parent, step_dir, chunks

