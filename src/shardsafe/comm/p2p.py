"""Point-to-point byte transfers between ranks of different nodes (the local tier's peers).

``PeerLink`` owns a dedicated gloo process group (``new_group(backend="gloo")``), so its
transfers never interleave with the training job's collectives and may run on a
background thread. A node is the set of ranks that share one local directory on one
host: the ranks exchange ``(hostname, realpath(local directory))`` once. Each rank sends
its copies to one rank of the next node (``partners``, a pure function) and receives
those of the ranks whose partner it is.

Every transfer is framed as an int64 length followed by that many uint8 bytes; all
sends and receives of one round are posted together (``isend``/``irecv``) and then
waited on, so two ranks that send to each other cannot deadlock.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist

from ..errors import CheckpointError


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


class PeerLink:
    """A dedicated gloo group and the partner map of this job (collective to build).

    Args:
        local_directory: This rank's local directory (names its node together with the
            host name).
    """

    def __init__(self, local_directory: str) -> None:
        self.group = dist.new_group(backend="gloo")
        self.rank = dist.get_rank()
        world = dist.get_world_size()
        key = (socket.gethostname(), os.path.realpath(local_directory))
        nodes: list[tuple[str, str] | None] = [None] * world
        dist.all_gather_object(nodes, key, group=self.group)
        self.nodes = [tuple(n) for n in nodes]  # type: ignore[arg-type]
        self.holder = partners(self.nodes)  # type: ignore[arg-type]
        self.sources = [r for r, h in enumerate(self.holder) if h == self.rank]

    def exchange(self, sends: Mapping[int, np.ndarray], receives: Sequence[int]) -> dict[int, np.ndarray]:
        """Sends each ``sends[dst]`` and receives one message from each rank of ``receives``.

        Raises:
            CheckpointError: A transfer failed (a peer died), naming the ranks.
        """
        try:
            lens_in = {src: torch.zeros(1, dtype=torch.int64) for src in receives}
            works = [dist.irecv(t, src, group=self.group) for src, t in lens_in.items()]
            works += [dist.isend(torch.tensor([len(a)], dtype=torch.int64), dst, group=self.group)
                      for dst, a in sends.items()]
            for w in works:
                w.wait()
            bufs = {src: torch.empty(int(t.item()), dtype=torch.uint8) for src, t in lens_in.items()}
            works = [dist.irecv(b, src, group=self.group) for src, b in bufs.items() if b.numel()]
            works += [dist.isend(torch.from_numpy(a), dst, group=self.group)
                      for dst, a in sends.items() if len(a)]
            for w in works:
                w.wait()
        except RuntimeError as e:  # gloo reports a dead peer as RuntimeError
            raise CheckpointError(f"rank {self.rank}: peer transfer (to {sorted(sends)}, from "
                                  f"{sorted(receives)}) failed: {e}") from e
        return {src: b.numpy() for src, b in bufs.items()}

    def close(self) -> None:
        """Destroys the dedicated group (collective in torch: call on every rank)."""
        if dist.is_initialized():
            dist.destroy_process_group(self.group)


__all__ = ["PeerLink", "partners"]
