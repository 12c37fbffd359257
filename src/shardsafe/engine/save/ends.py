"""The last stage of a save's run: what happens around this rank's durable files.

A run (``save.run``) begins its end before the first byte is written, hands it what this
rank wrote once every file is durable, and aborts it when the run fails:

- ``Commit``: the save's own transaction. Begins the working directory (a collective
  save's: rank 0's, awaited), publishes the index once every rank's files are durable
  (``commit.two_phase`` for a collective save) and moves an incremental save's baseline;
  on failure tells the other ranks and removes the working directory (never a committed
  checkpoint).
- ``HandBack``: a part of a save another system plans and commits (``shardsafe.dcp``'s
  ``Writer``, ``shardsafe cp --compression``): nothing to begin or abort, and its end is
  this rank's entries, kept for the caller to hand to its coordinator.
"""

from __future__ import annotations

from .. import commit
from ..commit import two_phase
from ..commit.entries import Entries
from .prepare import PreparedSave, local_entries
from .run import Written


class Commit:
    """The end of a save that commits itself (``prep``'s transaction)."""

    def __init__(self, prep: PreparedSave) -> None:
        self.prep = prep

    def begin(self) -> None:
        """Creates the working directory (a collective save's: rank 0's, awaited)."""
        if self.prep.channel is not None:
            two_phase.begin(self.prep)
        else:
            commit.begin(self.prep.txn)

    def finish(self, written: Written) -> None:
        """The coordinator publishes the index once every rank's files are durable (a
        collective save through ``commit.two_phase``, safe on a background thread); an
        incremental save's baseline then moves to it.

        Raises:
            CheckpointError: the commit failed (collective saves: on every rank).
            CheckpointTimeoutError: another rank did not answer within the timeout.
        """
        prep = self.prep
        local = local_entries(prep, written.sums, written.coded)
        if prep.channel is None:
            commit.finish(prep.txn, prep.index_bytes([local]))
        else:
            two_phase.commit_collective(prep, local)
        if prep.baseline is not None and prep.split is not None:  # committed: the next save compares with it
            prep.baseline.advance(prep.txn.final, prep.plans, written.sums, prep.split, prep.comm.rank,
                                  written.coded)

    def abort(self, error: BaseException, begun: bool) -> None:
        """Tells the other ranks of a collective save (so nothing commits and nobody waits
        for this rank) and removes the working directory once it was begun."""
        if self.prep.channel is not None:
            two_phase.abort(self.prep, error)
        if begun and self.prep.comm.rank == 0:
            commit.abort_quietly(self.prep.txn)


class HandBack:
    """The end of a part of a save committed elsewhere: ``entries`` once the run ends."""

    def __init__(self, prep: PreparedSave) -> None:
        self.prep = prep
        self.entries: Entries | None = None

    def begin(self) -> None:
        """Nothing: the coordinator created the working directory."""

    def finish(self, written: Written) -> None:
        """Keeps this rank's entries (its files are durable)."""
        self.entries = local_entries(self.prep, written.sums, written.coded)

    def abort(self, error: BaseException, begun: bool) -> None:
        """Nothing: the coordinator never commits a part that failed, and removes its work."""


__all__ = ["Commit", "HandBack"]
