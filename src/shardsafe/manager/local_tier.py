"""The local tier: each rank's own checkpoints in a fast directory on its node.

Layout under ``local_directory`` (one per node, e.g. ``/dev/shm/run``)::

    rank_<r>/step_<N>/              rank r's state alone, the ordinary format
    peer/rank_<s>/step_<N>/         a copy of rank s's checkpoint (s on another node)

Each rank saves its state alone (``collective=False``; DTensors as their local shards,
see ``local_view``) with its own ``Checkpointer``, so a local save never waits for the
persistent tier's writer. The save is asynchronous like the manager's: ``save`` returns
once the state is staged; a worker thread waits for the commit, applies retention
(``max_to_keep`` newest) and then, with replication, exchanges the new checkpoint with
the peers (``comm.p2p.PeerLink``, a dedicated gloo group used only from this thread
while training runs). An error of any of that is raised, naming step, rank and
directory, by the next ``save`` or ``wait``: it never stops the persistent tier.

Listing uses ``steps.StepDirectory`` (so the commit rule decides what exists);
``restore`` lives in ``tier_restore``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..api.load import load
from ..comm import agreement, distributed_active
from ..engine.checkpointer import Checkpointer
from ..errors import CheckpointError
from ..storage import storage_for
from . import peer_copy
from .local_view import LocalView
from .steps import StepDirectory, step_name

log = logging.getLogger("shardsafe")

ROOT_KEY = "state"  # the local checkpoint holds {"state": LocalView(state)}


class LocalTier:
    """Per-rank checkpoints in ``directory`` every ``interval`` steps.

    Args:
        directory: The node's local directory (a local path).
        interval: Save when ``step % interval == 0``.
        max_to_keep: Keep this many newest local steps (and peer copies per rank).
        replication: Also keep each rank's checkpoint on a rank of another node (needs
            torch.distributed with at least two nodes; collective to construct).
    """

    def __init__(self, directory: str, *, interval: int, max_to_keep: int, replication: bool) -> None:
        self.directory = os.path.abspath(directory)
        self.interval = interval
        self.max_to_keep = max_to_keep
        self.rank = agreement.rank()
        self.own_path = os.path.join(self.directory, f"rank_{self.rank}")
        storage, spath = storage_for(self.own_path)
        storage.makedirs(spath)
        self.own = StepDirectory(storage, spath)
        self.own.remove_leftovers()  # a crashed local save's temporary directory
        self.link = None
        if replication and distributed_active():
            from ..comm.p2p import PeerLink  # torch.distributed only when replicating

            self.link = PeerLink(self.directory)
            if self.link.holder[self.rank] is None:
                log.warning("local_replication: every rank shares one local directory (one node): "
                            "there is no other node to hold copies")
        self._saver = Checkpointer()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="shardsafe-local")
        self._future: Future | None = None
        self._future_step: int | None = None

    # ------------------------------------------------------------------ listing
    def steps(self) -> list[int]:
        """This rank's committed local steps, oldest first."""
        return list(self.own.committed())

    def peer_path(self, source: int) -> str:
        """Where this rank keeps the copies of rank ``source``."""
        return os.path.join(self.directory, "peer", f"rank_{source}")

    def held(self) -> dict[int, list[int]]:
        """Peer copies this rank holds: source rank -> committed steps."""
        if self.link is None:
            return {}
        out = {}
        for src in self.link.sources:
            storage, spath = storage_for(self.peer_path(src))
            out[src] = list(StepDirectory(storage, spath).committed()) if storage.exists(spath) else []
        return out

    # ------------------------------------------------------------------ saving
    def due(self, step: int) -> bool:
        """Whether ``step`` is due for a local save."""
        return step % self.interval == 0

    def save(self, step: int, state: Mapping[str, Any]) -> None:
        """Starts the local save of ``step`` (returns once staged).

        Raises:
            CheckpointError: The previous local save (or its peer copy) failed; this step's
                save has started all the same.
        """
        previous: CheckpointError | None = None
        try:
            self.wait()
        except CheckpointError as e:
            previous = e
        path = self.own.step_path(step)
        try:
            job = self._saver.async_save({ROOT_KEY: LocalView(state)}, path, overwrite=True,  # type: ignore[arg-type]
                                         collective=False, metadata={"shardsafe.local": {"step": step}})
        except (OSError, CheckpointError) as e:
            job = e
        self._future_step = step
        self._future = self._worker.submit(self._finish, step, path, job)
        if previous is not None:
            raise previous

    def _finish(self, step: int, path: str, job: Any) -> None:
        """Worker thread: commit, retention, then the peer exchange (always, to stay paired)."""
        error: BaseException | None = job if isinstance(job, BaseException) else None
        if error is None:
            try:
                job.result()
                self._retain(self.own)
            except (OSError, CheckpointError) as e:
                error = e
        if self.link is not None:
            self._replicate(step, None if error is not None else path, error)
        if error is not None:
            raise CheckpointError(f"local save of step {step} on rank {self.rank} to {path!r} "
                                  f"failed: {error}") from error

    def _replicate(self, step: int, path: str | None, error: BaseException | None) -> None:
        assert self.link is not None
        dst = self.link.holder[self.rank]
        msg = peer_copy.pack(step, self.rank, path, None if error is None else str(error))
        got = self.link.exchange({dst: msg} if dst is not None else {}, self.link.sources)
        for src, data in got.items():
            m = peer_copy.unpack(data)
            if m.error is not None:
                log.warning("rank %d has no peer copy of rank %d's step %d: its local save failed: %s",
                            self.rank, src, m.step, m.error)
                continue
            peer_copy.write_step(m.files, self.peer_path(src), step_name(m.step))
            storage, spath = storage_for(self.peer_path(src))
            self._retain(StepDirectory(storage, spath))

    def _retain(self, steps: StepDirectory) -> None:
        committed = steps.committed()
        for s in list(committed)[: max(0, len(committed) - self.max_to_keep)]:
            steps.delete(s, committed[s])

    def wait(self) -> None:
        """Blocks until the local save in flight (and its peer copy) is done.

        Raises:
            CheckpointError: It failed (naming step, rank and directory).
        """
        fut, self._future = self._future, None
        if fut is not None:
            fut.result()

    # ------------------------------------------------------------------ loading
    def load(self, path: str, state: MutableMapping[str, Any]) -> None:
        """Loads the local checkpoint at ``path`` into ``state`` (this rank alone, verified)."""
        load(path, {ROOT_KEY: LocalView(state)}, collective=False)

    def forget_newer(self, step: int) -> None:
        """Deletes this rank's local steps and held copies newer than ``step`` (a restore
        went back to ``step``: they belong to a discarded future)."""
        dirs = [self.own]
        for src in self.held():
            storage, spath = storage_for(self.peer_path(src))
            dirs.append(StepDirectory(storage, spath))
        for d in dirs:
            for s, name in d.committed().items():
                if s > step:
                    d.delete(s, name)

    def close(self) -> None:
        """Waits for the save in flight, stops the worker, frees buffers and the group.

        Raises:
            CheckpointError: The last local save failed.
        """
        try:
            self.wait()
        finally:
            self._worker.shutdown(wait=True)
            self._saver.close()
            if self.link is not None:
                self.link.close()
                self.link = None


__all__ = ["LocalTier", "ROOT_KEY"]
