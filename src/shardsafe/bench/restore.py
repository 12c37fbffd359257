"""A restore at scale, simulated with the real index reader: what each rank reads, once.

``restore_figures(index, ranks)`` writes the index of ``bench.scale``'s FSDP job as
saves write it (version 4) onto a simulated storage that counts requests, then runs a
collective restore's index reads (``engine.load.index_exchange``) for every rank of a
same-layout restore on ``ranks`` ranks and of a resharded one on 3/4 of them: rank 0
reads the head (header and global part) and broadcasts it, every rank works out with
``GlobalPart.parts_for`` which parts its dim-0 shard of every tensor overlaps and reads
their directory entries and the parts (``index_exchange.read_parts``, which groups
nearby ranges into one request as a load does). A middle rank of each runs a whole
``IndexRead.narrow`` (decoding the global part and its parts, checking its data files'
sizes), timed (``restore_decode_s``: CPU seconds, the best of three) and counted; rank
0 also lists the manager directory the checkpoint sits in (``comm.agreement`` tells the
other ranks: they list nothing). Figures:

- ``restore_index_bytes_rank`` / ``reshard_index_bytes_rank``: index bytes read or
  received by one rank, the largest over the ranks; ``_total``: all ranks together;
- ``restore_decode_s`` (``reshard_decode_s``): decoding what one rank needs;
- ``restore_list_requests``: LIST requests of the whole job's restore;
- ``restore_requests_rank`` (``reshard_requests_rank``): storage requests of one rank:
  rank 0's, which reads the head, and its directory entries, parts and data file sizes.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from typing import Any

from ..comm.agreement import Agreement
from ..engine.load import index_exchange as ix
from ..format import INDEX_NAME
from ..format.index.model import ColumnarIndex, TensorInfo
from ..format.index.v4_global import Region
from ..format.index.versions import encode_columnar
from ..manager.recovery import listed_once
from ..manager.steps import StepDirectory

RUN, STEP = "run", "step_00000001"
CKPT = f"{RUN}/{STEP}"


class SimulatedStorage:
    """The checkpoint's index in memory and its data files by size (nothing else is
    read), counting the requests an object store would serve: ``get`` (ranged reads),
    ``head`` (sizes, existence), ``list``."""

    atomic_rename = False

    def __init__(self, index: bytes, files: dict[str, int]) -> None:
        self.index, self.files = index, files
        self.counts: collections.Counter[str] = collections.Counter()

    def join(self, *parts: str) -> str:
        return "/".join(parts)

    def read_into(self, path: str, offset: int, out: memoryview) -> None:
        self.counts["get"] += 1
        if path != f"{CKPT}/{INDEX_NAME}" or offset + len(out) > len(self.index):
            raise EOFError(path)
        out[:] = self.index[offset : offset + len(out)]

    def size(self, path: str) -> int:
        self.counts["head"] += 1
        return self.files[path.rsplit("/", 1)[-1]]

    def exists(self, path: str) -> bool:
        self.counts["head"] += 1
        return path == f"{CKPT}/{INDEX_NAME}"

    def list(self, path: str) -> list[str]:
        self.counts["list"] += 1
        return [STEP] if path == RUN else []

    def is_link(self, path: str) -> bool:
        return False


def shard_regions(infos: Sequence[TensorInfo], world: int, rank: int) -> list[Region]:
    """Rank ``rank``'s dim-0 shard of every tensor when ``world`` ranks share them (FSDP)."""
    out = []
    for t, info in enumerate(infos):
        shape = info.shape
        q = -(-shape[0] // world)
        lo = min(rank * q, shape[0])
        out.append((t, (lo,) + (0,) * (len(shape) - 1), (min(q, shape[0] - lo), *shape[1:])))
    return out


def _head(data: bytes, files: dict[str, int]) -> tuple[ix.IndexRead, SimulatedStorage, int]:
    """Rank 0's read of the head (as ``read_index_alone`` does): the ``IndexRead`` every
    rank decodes from the broadcast, rank 0's storage and the head's length."""
    storage = SimulatedStorage(data, files)
    read = ix.read_index_alone(storage, CKPT)  # type: ignore[arg-type]
    return read, storage, len(read.raw)


def _every_rank(read: ix.IndexRead, world: int, head: int) -> tuple[int, int]:
    """(the most index bytes one rank reads or receives, all ranks' together) for a
    restore on ``world`` ranks: the head (rank 0 reads it, the others receive it) and the
    directory entries and parts each rank reads."""
    assert read.head is not None
    most = total = 0
    for rank in range(world):
        ix.STATS.reset()
        ix.read_parts(read, read.head.parts_for(shard_regions(read.head.infos, world, rank)))
        mine = head + ix.STATS.read
        most, total = max(most, mine), total + mine
    return most, total


def _one_rank(data: bytes, files: dict[str, int], read: ix.IndexRead, world: int) -> tuple[float, dict[str, int]]:
    """A middle rank's whole narrowing from the broadcast head: CPU seconds (decoding the
    global part, choosing and decoding its parts; the best of three) and its requests."""
    regions = shard_regions(read.head.infos, world, world // 2)  # type: ignore[union-attr]
    best = float("inf")
    counts: dict[str, int] = {}
    for _ in range(3):
        storage = SimulatedStorage(data, files)
        c0 = time.process_time()
        ix.from_head(storage, CKPT, read.raw).narrow(regions)  # type: ignore[arg-type]
        best = min(best, time.process_time() - c0)
        counts = dict(storage.counts)
    return best, counts


def restore_figures(index: ColumnarIndex, ranks: int, data: bytes | None = None) -> dict[str, Any]:
    """The restore figures of ``index``'s FSDP job (see the module's docstring); ``data``:
    its bytes as saves write them, if already encoded."""
    data = encode_columnar(index) if data is None else data
    files = {f.name: f.size for f in index.files}
    read, rank0, head = _head(data, files)
    head_requests = sum(rank0.counts.values())
    lister = SimulatedStorage(data, files)
    listed_once(StepDirectory(lister, RUN), Agreement())  # type: ignore[arg-type]
    out: dict[str, Any] = {"restore_head_bytes": head}
    for name, world in (("restore", ranks), ("reshard", max(1, ranks * 3 // 4))):
        most, total = _every_rank(read, world, head)
        decode_s, counts = _one_rank(data, files, read, world)
        requests = head_requests + sum(counts.values())  # rank 0 reads the head too
        out.update({f"{name}_index_bytes_rank": most, f"{name}_index_bytes_total": total,
                    f"{name}_decode_s": round(decode_s, 4), f"{name}_requests_rank": requests})
    out["restore_list_requests"] = lister.counts["list"] + (ranks - 1) * counts.get("list", 0)
    return out
