"""Point-to-point byte streams between ranks of different nodes (the local tier's peers).

``PeerLink`` owns a dedicated gloo process group (``new_group(backend="gloo")``), so its
transfers never interleave with the training job's collectives and may run on a
background thread; its group timeout bounds every transfer, so a peer that died or
never joined the round turns into an error naming it instead of a hang. A node is the
set of ranks that share one local directory on one host: the ranks exchange
``(hostname, realpath(local directory))`` once (JSON over the new group, never pickled).
Each rank sends its copies to one rank of the next node (``partners``, a pure function)
and receives those of the ranks whose partner it is.

A transfer is a byte stream: its length (int64), then the stream in chunks of ``CHUNK``
bytes. The sender gives a list of segments (``bytes``-like; e.g. memory-mapped files),
sent without copying where a chunk lies within one segment; the receiver hands each
chunk to a callback as it arrives, so neither side holds a whole stream in memory. All
sends and receives of one chunk index are posted together (``isend``/``irecv``) and then
waited on, so two ranks that send to each other cannot deadlock.
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..errors import CheckpointError, CheckpointTimeoutError
from .torch_comm import TorchComm

CHUNK = 64 << 20  # bytes per message of a stream: bounds the memory of a transfer

Segments = Sequence["bytes | bytearray | memoryview | np.ndarray"]
Sink = Callable[[int, int, memoryview], None]
"""``sink(source rank, offset in its stream, bytes)``: receives a stream chunk by chunk."""


def partners(nodes: Sequence[tuple[str, str]]) -> list[int | None]:
    """For each rank, the rank that holds its copies (None when there is only one node).

    Ranks are grouped by node key (first appearance order); rank ``j``-th of node ``i``
    sends to the ``j``-th rank (modulo its size) of node ``i + 1`` (cyclically).
    """
    order: dict[tuple[str, str], list[int]] = {}
    for r, key in enumerate(nodes):
        order.setdefault(tuple(key), []).append(r)  # type: ignore[arg-type]
    members = list(order.values())
    if len(members) < 2:
        return [None] * len(nodes)
    out: list[int | None] = [None] * len(nodes)
    for i, ranks in enumerate(members):
        nxt = members[(i + 1) % len(members)]
        for j, r in enumerate(ranks):
            out[r] = nxt[j % len(nxt)]
    return out


def _chunk(segments: Segments, lengths: Sequence[int], start: int, n: int, scratch: np.ndarray) -> np.ndarray:
    """Bytes ``[start, start + n)`` of the concatenated segments (a view when they lie in one)."""
    pos = 0
    parts: list[tuple[int, np.ndarray]] = []
    for seg, size in zip(segments, lengths):
        lo, hi = max(start, pos), min(start + n, pos + size)
        if hi > lo:
            parts.append((lo - start, np.frombuffer(seg, dtype=np.uint8, count=hi - lo, offset=lo - pos)))
        pos += size
        if pos >= start + n:
            break
    if len(parts) == 1:
        return parts[0][1]
    for at, view in parts:
        scratch[at : at + len(view)] = view
    return scratch[:n]


class PeerLink:
    """A dedicated gloo group and the partner map of this job (collective to build).

    Args:
        local_directory: This rank's local directory (names its node together with the
            host name).
        timeout: Seconds any transfer of this link waits for a peer.
    """

    def __init__(self, local_directory: str, *, timeout: float) -> None:
        self.timeout = float(timeout)
        self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=self.timeout))
        self.rank = dist.get_rank()
        comm = TorchComm(self.group)
        key = [socket.gethostname(), os.path.realpath(local_directory)]
        nodes = comm.broadcast(comm.gather(key))
        self.nodes = [tuple(n) for n in nodes]
        self.holder = partners(self.nodes)  # type: ignore[arg-type]
        self.sources = [r for r, h in enumerate(self.holder) if h == self.rank]

    def exchange(self, sends: Mapping[int, Segments], receives: Sequence[int], sink: Sink) -> None:
        """Streams ``sends[dst]`` to each ``dst`` and each stream of ``receives`` into ``sink``.

        Raises:
            CheckpointTimeoutError: a peer did not take part within the timeout (named); also
                every later transfer with it (gloo closes the connection after a timeout).
            CheckpointError: a transfer failed (a peer died), naming the ranks.
        """
        try:
            self._exchange(sends, receives, sink)
        except RuntimeError as e:  # gloo reports a dead or absent peer as RuntimeError
            cls = CheckpointTimeoutError if "timeout" in str(e).lower() else CheckpointError
            raise cls(f"rank {self.rank}: peer transfer (to ranks {sorted(sends)}, from ranks "
                      f"{sorted(receives)}) failed within {self.timeout:g} s: a peer died, raised, "
                      f"or is much slower: {e}") from e

    @staticmethod
    def _wait(works: list[Any]) -> None:
        for w in works:
            w.wait()

    def _exchange(self, sends: Mapping[int, Segments], receives: Sequence[int], sink: Sink) -> None:
        lengths = {dst: [len(memoryview(s).cast("B")) for s in segs] for dst, segs in sends.items()}
        lens_in = {src: torch.zeros(1, dtype=torch.int64) for src in receives}
        works = [dist.irecv(t, src, group=self.group) for src, t in lens_in.items()]
        works += [dist.isend(torch.tensor([sum(ls)], dtype=torch.int64), dst, group=self.group)
                  for dst, ls in lengths.items()]
        self._wait(works)
        total_in = {src: int(t.item()) for src, t in lens_in.items()}
        total_out = {dst: sum(ls) for dst, ls in lengths.items()}
        scratch = {dst: np.empty(min(CHUNK, n), dtype=np.uint8) for dst, n in total_out.items()}
        bufs = {src: torch.empty(min(CHUNK, n), dtype=torch.uint8) for src, n in total_in.items()}
        longest = max([*total_in.values(), *total_out.values(), 0])
        for start in range(0, longest, CHUNK):
            recv = {src: min(CHUNK, n - start) for src, n in total_in.items() if n > start}
            works = [dist.irecv(bufs[src][:n], src, group=self.group) for src, n in recv.items()]
            for dst, n in total_out.items():
                if n > start:
                    piece = _chunk(sends[dst], lengths[dst], start, min(CHUNK, n - start), scratch[dst])
                    works.append(dist.isend(torch.from_numpy(piece), dst, group=self.group))
            self._wait(works)
            for src, n in recv.items():
                sink(src, start, memoryview(bufs[src].numpy())[:n])

    def close(self) -> None:
        """Destroys the dedicated group (collective in torch: call on every rank)."""
        if dist.is_initialized():
            dist.destroy_process_group(self.group)


__all__ = ["CHUNK", "PeerLink", "partners"]
