"""The local tier: each rank's own checkpoints in a fast directory on its node.

Layout under ``local_directory`` (one per node, e.g. ``/dev/shm/run``)::

    rank_<r>/step_<N>/              rank r's state alone, the ordinary format
    peer/rank_<s>/step_<N>/         a copy of rank s's checkpoint (s on another node)

A local checkpoint holds ``{"state": LocalView(state)}`` (DTensors as their local
shards, see ``local_view``) saved by this rank alone. It is not saved here: the manager
stages a step once for every due tier (``engine.save.replica``: the local checkpoint is fed
from the same staged bytes as the persistent save) and the tier's ``TierWriter`` waits
for it. After each local save, this module applies the tier's retention (the newest
``max_to_keep``, by ``retention.LatestN``; also after a failed save). The first save
that finds the directory full (no space left) switches the tier to making room: from
then on retention keeps one step fewer between saves, so the step being written fits
where the newest ones already are, instead of every later save failing as well. With
replication it then exchanges the new checkpoint with the
peers (``peer_copy`` over the link of ``comm.agreement.Agreement.peer_link``, whose
transfers give up after the manager's timeout).

Identity: every local step records its step and its run (``run_identity``, the id of
the persistent directory) in its index. Listing trusts only that record, never the
directory name, and skips steps of other runs (a writable manager deletes them, with a
warning: they would only fill the node's memory). A read-only manager lists and loads
but never writes here.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping, MutableMapping
from typing import Any

from ..engine.load.index_exchange import read_metadata
from ..engine.load.request import LoadRequest, holds_jax
from ..engine.load.run import run
from ..comm.agreement import Agreement
from ..comm.jax_comm import JaxComm
from ..errors import CheckpointError
from ..format import INDEX_NAME
from ..storage import storage_for
from . import peer_copy
from .local_view import LocalView
from .retention import LatestN, StepRecord, steps_to_delete
from .steps import StepDirectory, step_name
from .tier_writer import SaveJob

log = logging.getLogger("shardsafe")

ROOT_KEY = "state"  # the local checkpoint holds {"state": LocalView(state)}
LOCAL_KEY = "shardsafe.local"  # index metadata: {"step": N, "run": id}


class LocalTier:
    """Per-rank checkpoints in ``directory`` every ``interval`` steps.

    Args:
        directory: The node's local directory (a local path).
        run: The run id of the persistent directory (None: no local step is valid).
        interval: Save when ``step % interval == 0``.
        max_to_keep: Keep this many newest local steps (and peer copies per rank).
        replication: Also keep each rank's checkpoint on a rank of another node (needs
            torch.distributed with at least two nodes; collective to construct).
        agreement: The manager's agreement (rank, timeout, the peers' link).
        writable: False for a read-only manager (nothing is ever written here).

    Raises:
        ValueError: the job is a multi-process ``jax.distributed`` one: a rank's local
            checkpoint holds its own state alone, and an array spanning processes is
            saved by the whole job (use the persistent tier).
    """

    def __init__(self, directory: str, *, run: str | None, interval: int, max_to_keep: int,
                 replication: bool, agreement: Agreement, writable: bool) -> None:
        if isinstance(agreement.comm, JaxComm):
            raise ValueError("local_directory: the local tier is not available in a multi-process "
                             "jax.distributed job (its arrays span processes); save to the persistent "
                             "directory only")
        self.directory = os.path.abspath(directory)
        self.run, self.interval, self.writable = run, interval, writable
        self.max_to_keep = max_to_keep
        self.tight = False  # the directory was full once: keep a step fewer between saves
        self._sweeper: threading.Thread | None = None  # removing the data of dropped steps
        self._identities: dict[tuple[str, int, int, int], tuple[int | None, str | None]] = {}
        self.rank = agreement.rank
        self.own_path = os.path.join(self.directory, f"rank_{self.rank}")
        storage, spath = storage_for(self.own_path)
        self.own = StepDirectory(storage, spath)
        self.link = agreement.peer_link(self.directory) if replication else None
        if self.link is not None and self.link.holder[self.rank] is None:
            log.warning("local_replication: every rank shares one local directory (one node): "
                        "there is no other node to hold copies")
        if writable:
            storage.makedirs(spath)
            for d in self._directories():
                d.remove_leftovers()  # a crashed local save, a half-received copy
                self._drop_foreign(d)

    # ------------------------------------------------------------------ listing
    def _directories(self) -> list[StepDirectory]:
        peers = [self._peer_steps(src) for src in (self.link.sources if self.link is not None else [])]
        return [self.own] + [d for d in peers if d is not None]

    def _peer_steps(self, source: int) -> StepDirectory | None:
        """The copies this rank holds of rank ``source`` (None: it holds none)."""
        storage, spath = storage_for(self.peer_path(source))
        return StepDirectory(storage, spath) if storage.exists(spath) else None

    def _identity(self, steps: StepDirectory, name: str) -> tuple[int | None, str | None]:
        """The step and run a committed local step records (Nones when unreadable); kept
        per index file (its inode, size and change time: a committed step's index is
        never rewritten in place), so listing the steps again reads no index twice."""
        path = steps.storage.join(steps.path, name)
        key = _index_key(path)
        if key is None:
            return None, None
        known = self._identities.get(key)
        if known is None:
            if len(self._identities) > 256:  # steps long gone
                self._identities.clear()
            known = self._identities[key] = _read_identity(steps.storage, path)
        return known

    def valid(self, steps: StepDirectory) -> dict[int, str]:
        """Committed steps of this run whose index records the step their name says."""
        out = {}
        for step, name in steps.committed().items():  # (a symlinked entry is never listed)
            recorded, run = self._identity(steps, name)
            if run != self.run or self.run is None:
                continue
            if recorded != step:
                log.warning("ignoring local step %s in %s: its index records step %s", name, steps.path,
                            recorded)
                continue
            out[step] = name
        return out

    def _drop_foreign(self, steps: StepDirectory) -> None:
        """Deletes committed steps of another run (they are never restored)."""
        for step, name in steps.committed().items():
            if self._identity(steps, name)[1] != self.run:
                log.warning("deleting local step %s in %s: it belongs to another run (another "
                            "persistent directory)", name, steps.path)
                steps.delete(step, name)

    def steps(self) -> list[int]:
        """This rank's valid local steps, oldest first."""
        return sorted(self.valid(self.own))

    def peer_path(self, source: int) -> str:
        """Where this rank keeps the copies of rank ``source``."""
        return os.path.join(self.directory, "peer", f"rank_{source}")

    def held(self) -> dict[int, list[int]]:
        """Peer copies this rank holds: source rank -> valid steps."""
        if self.link is None:
            return {}
        out = {}
        for src in self.link.sources:
            d = self._peer_steps(src)
            out[src] = sorted(self.valid(d)) if d is not None else []
        return out

    # ------------------------------------------------------------------ saving
    def due(self, step: int) -> bool:
        """Whether ``step`` is due for a local save."""
        return self.writable and step % self.interval == 0

    def target(self, step: int, state: Mapping[str, Any]) -> tuple[dict[str, Any], str, dict[str, Any]]:
        """``(state to save, path, metadata)`` of the local save of ``step`` (on a full
        directory, once the space of the steps retention dropped is free)."""
        if self.tight:
            self.settle_sweep()
        return ({ROOT_KEY: LocalView(state)}, self.own.step_path(step),  # type: ignore[arg-type]
                {LOCAL_KEY: {"step": step, "run": self.run}})

    def describe(self, step: int) -> str:
        return f"local save of step {step} on rank {self.rank} to {self.own.step_path(step)!r} (or its peer copy)"

    def after_save(self, step: int, error: CheckpointError | None, seq: int, job: SaveJob | None) -> None:
        """Retention (also after a failed save: it frees the space the next one needs),
        then the peer exchange (always, to stay paired with the peers)."""
        problem: BaseException | None = None
        if error is not None and not self.tight and _out_of_space(error):
            if self.max_to_keep > 1:
                self.tight = True
                log.warning("the local directory %s is full: from now on it keeps %d step(s) between "
                            "saves to make room for the next one", self.directory, self.max_to_keep - 1)
            else:
                log.warning("the local directory %s is full: it cannot hold a new step beside the one "
                            "it keeps (local_max_to_keep=1); give it more space", self.directory)
        if error is None:  # what its index records, known without reading it back
            key = _index_key(self.own.step_path(step))
            if key is not None:
                self._identities[key] = (step, self.run)
        try:
            self._retain(self.own)
        except (OSError, CheckpointError) as e:
            problem = e
        if self.link is not None:
            try:
                self._replicate(step, None if error is not None else self.own.step_path(step), error)
            except (OSError, CheckpointError) as e:
                problem = problem or e
        if problem is not None:
            raise CheckpointError(f"{self.describe(step)}: {problem}") from problem

    def _retain(self, steps: StepDirectory) -> None:
        """Un-commits the steps beyond ``max_to_keep`` now (listings and restores no longer
        see them), and removes their directories in the background: on a memory-backed
        directory freeing a step's pages takes as long as writing them, and a save is
        complete once it is committed. A local step references no other step's files (the
        local tier never saves incrementally), so its directory goes whole, without the
        mark phase of a sweep; what a killed removal leaves, un-committed, the next
        manager's start sweeps."""
        committed = steps.committed()
        records = [StepRecord(s, 0.0) for s in committed]
        policy = LatestN(self.max_to_keep - 1 if self.tight else self.max_to_keep)
        drop = {s: committed[s] for s in steps_to_delete(records, policy)}
        if not drop:
            return
        for step, name in drop.items():
            steps.uncommit(step, name)
        self.settle_sweep()
        paths = [steps.step_path(s, n) for s, n in drop.items()]
        self._sweeper = threading.Thread(target=_remove, args=(steps.storage, paths),
                                         name="shardsafe-local-sweep", daemon=True)
        self._sweeper.start()

    def settle_sweep(self) -> None:
        """Waits for the background removal of dropped steps' data (if any)."""
        if self._sweeper is not None:
            self._sweeper.join()
            self._sweeper = None

    def _replicate(self, step: int, path: str | None, error: BaseException | None) -> None:
        assert self.link is not None
        dst = self.link.holder[self.rank]
        try:
            out = peer_copy.outgoing(step, self.rank, path, None if error is None else str(error))
        except (OSError, CheckpointError) as e:  # the peer still waits for this round: send why
            out = peer_copy.outgoing(step, self.rank, None, f"reading the local copy failed: {e}")
        incoming = {src: peer_copy.Incoming(self.peer_path(src), step_name) for src in self.link.sources}
        try:
            self.link.exchange({dst: out.segments} if dst is not None else {}, self.link.sources,
                               lambda src, _at, data: incoming[src].feed(data))
        except CheckpointError as e:
            raise CheckpointError(f"peer copy of step {step}: {e}") from e
        finally:
            out.close()
            for inc in incoming.values():
                if inc.received is None:
                    inc.abort()
        for src, inc in incoming.items():
            got = inc.done()
            if got.error is not None:
                log.warning("rank %d has no peer copy of rank %d's step %d: %s",
                            self.rank, src, got.step, got.error)
                continue
            storage, spath = storage_for(self.peer_path(src))
            self._retain(StepDirectory(storage, spath))

    # ------------------------------------------------------------------ loading
    def load(self, path: str, state: MutableMapping[str, Any], cast: bool = False) -> None:
        """Loads the local checkpoint at ``path`` into ``state`` (this rank alone, verified;
        ``cast`` as ``shardsafe.load``'s)."""
        # a JAX state is restored by replacing its arrays (its mutable containers in place)
        root = {ROOT_KEY: state if holds_jax(state) else LocalView(state)}
        run(LoadRequest(path=path, state=root, collective=False, cast=cast))

    def receive_directory(self) -> str:
        """Where a copy fetched from a peer is stored: this rank's own directory, or (read-only)
        a private temporary directory the caller removes with ``discard_received``."""
        return self.own_path if self.writable else tempfile.mkdtemp(prefix="shardsafe-peer-")

    def discard_received(self, directory: str) -> None:
        if directory != self.own_path:
            shutil.rmtree(directory, ignore_errors=True)

    def forget_newer(self, step: int) -> None:
        """Deletes this rank's local steps and held copies newer than ``step`` (a restore
        went back to ``step``: they belong to a discarded future)."""
        if not self.writable:
            return
        for d in self._directories():
            newer = {s: n for s, n in d.committed().items() if s > step}
            if newer:
                self.settle_sweep()  # one sweep of a directory at a time
                d.drop(newer)

    def close(self) -> None:
        """Waits for the removal of dropped steps' data; destroys the peers' link
        (collective: every rank closes its manager)."""
        self.settle_sweep()
        if self.link is not None:
            self.link.close()
            self.link = None


def _index_key(path: str) -> tuple[str, int, int, int] | None:
    """What tells one committed index at ``path`` from another (None: there is none)."""
    try:
        st = os.stat(os.path.join(path, INDEX_NAME))
    except OSError:
        return None
    return path, st.st_ino, st.st_size, st.st_ctime_ns


def _read_identity(storage: Any, path: str) -> tuple[int | None, str | None]:
    """The step and run the committed local step at ``path`` records (Nones when unreadable)."""
    try:
        info = read_metadata(storage, path).get(LOCAL_KEY)
    except (OSError, CheckpointError):
        return None, None
    if not isinstance(info, dict):
        return None, None
    step, run = info.get("step"), info.get("run")
    return (step if isinstance(step, int) and not isinstance(step, bool) else None,
            run if isinstance(run, str) else None)


def _remove(storage: Any, paths: list[str]) -> None:
    """Removes the un-committed step directories ``paths`` (a failure is logged: they stay
    un-committed, and a later sweep removes them), at the lowest CPU priority:
    housekeeping gives way to the training and to a restore."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread alone (Linux)
    except (AttributeError, OSError):
        pass
    for path in paths:
        try:
            storage.delete(path)
        except OSError as e:
            log.warning("removing the dropped local step %s failed (%s: %s); it is swept later",
                        path, type(e).__name__, e)


def _out_of_space(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) says the filesystem is full."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


__all__ = ["LOCAL_KEY", "LocalTier", "ROOT_KEY"]
