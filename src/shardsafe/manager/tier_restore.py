"""Collective restore across tiers: every rank agrees on one step and gets it somewhere.

Each rank reports what it can reach: its own local steps, the peer copies it holds for
other ranks, and the copies that already failed to load. Rank 0 runs ``choose`` (pure)
on the reports and broadcasts the plan: the newest step that every rank can get from its
own local directory or else from the rank holding its copy, provided it is not older
than the newest persistent step (otherwise the persistent tier wins). The ranks agree
through ``comm.agreement`` (bounded by the manager's timeout). Copies travel from holder
to owner over the peers' link as a stream (``peer_copy``); the owner stores the copy in
its local directory (a read-only manager: in a private temporary directory, removed
after the load) and loads it from there, verifying every checksum like any load. If any rank
fails to load, all ranks try again without the copy that failed (warning with step, rank
and reason); when no step is left, the caller restores from the persistent tier.
"""

from __future__ import annotations

import logging
import time
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..comm.agreement import Agreement
from ..errors import CheckpointError
from . import peer_copy
from .local_tier import LocalTier
from .steps import step_name

log = logging.getLogger("shardsafe")

Tier = Literal["local", "peer", "persistent"]
"""Where a restore found its checkpoint."""


@dataclass(frozen=True, slots=True)
class RestoreInfo:
    """What the last ``CheckpointManager.restore`` did.

    Attributes:
        step: The restored step (None: nothing to restore).
        tier: Where this rank's data came from: ``"local"`` (its node's local directory),
            ``"peer"`` (the copy on a rank of another node, fetched over the network) or
            ``"persistent"``.
        seconds: Wall time of the restore on this rank.
    """

    step: int | None
    tier: Tier
    seconds: float


def choose(reports: Sequence[dict[str, Any]], holders: Sequence[int | None],
           at_least: int | None) -> dict[str, Any] | None:
    """The plan ``{"step": s, "tiers": [per rank "local" | "peer"]}`` or None (persistent).

    ``reports[r]``: ``{"local": [...], "held": {src: [...]}, "bad_local": [...],
    "bad_peer": [...]}`` of rank r; ``holders[r]``: the rank holding r's copies.
    """
    reach = []
    for r, rep in enumerate(reports):
        local = set(rep["local"]) - set(rep["bad_local"])
        h = holders[r] if r < len(holders) else None
        peer = set(reports[h]["held"].get(str(r), [])) - set(rep["bad_peer"]) if h is not None else set()
        reach.append((local, peer))
    common = set.intersection(*(lo | pe for lo, pe in reach)) if reach else set()
    if at_least is not None:
        common = {s for s in common if s >= at_least}
    if not common:
        return None
    step = max(common)
    return {"step": step, "tiers": ["local" if step in lo else "peer" for lo, _ in reach]}


def restore_local(tier: LocalTier, agreement: Agreement, state: MutableMapping[str, Any],
                  at_least: int | None, cast: bool = False) -> RestoreInfo | None:
    """Restores the newest step every rank can get from the local tier or its peers.

    Collective (every rank calls it; each round is bounded by the agreement's timeout).
    Returns None when no such step is at least ``at_least`` (the caller then restores
    from the persistent tier). ``cast``: as ``shardsafe.load``'s.
    """
    t0 = time.monotonic()
    holders = tier.link.holder if tier.link is not None else [None] * agreement.world_size
    bad_local: set[int] = set()
    bad_peer: set[int] = set()
    while True:
        report = {"local": tier.steps(), "held": {str(k): v for k, v in tier.held().items()},
                  "bad_local": sorted(bad_local), "bad_peer": sorted(bad_peer)}
        plan = agreement.decide_together(report, lambda reports: choose(reports, holders, at_least),
                                         what="choosing the step to restore")
        if plan is None:
            return None
        step, mine = plan["step"], plan["tiers"][tier.rank]
        if mine == "peer" and step not in bad_local:
            log.warning("step %d: rank %d has no usable local copy in %s; fetching it from rank %s",
                        step, tier.rank, tier.own_path, holders[tier.rank])
        error = _fetch_and_load(tier, state, plan, holders, cast)
        if agreement.worst(0 if error is None else 1, what=f"restoring step {step} from the local tier") == 0:
            return RestoreInfo(step, mine, time.monotonic() - t0)
        if error is not None:
            (bad_local if mine == "local" else bad_peer).add(step)
            nxt = "the peer copy" if mine == "local" else "an older step or the persistent tier"
            log.warning("step %d: rank %d could not load its %s copy (%s); trying %s",
                        step, tier.rank, mine, error, nxt)


def _fetch(tier: LocalTier, step: int, tiers: Sequence[str], holders: Sequence[int | None],
           into: str) -> None:
    """Moves the planned peer copies of ``step`` from their holders to their owners."""
    assert tier.link is not None
    sends, outs = {}, []
    for r, t in enumerate(tiers):
        if t == "peer" and holders[r] == tier.rank:
            held = tier.held().get(r, [])
            path = f"{tier.peer_path(r)}/{step_name(step)}" if step in held else None
            try:
                outs.append(peer_copy.outgoing(step, r, path, None if path else "copy is gone"))
            except (OSError, CheckpointError) as e:  # the owner still waits for this round: send why
                outs.append(peer_copy.outgoing(step, r, None, f"reading the copy failed: {e}"))
            sends[r] = outs[-1].segments
    src = holders[tier.rank]
    receives = [src] if tiers[tier.rank] == "peer" and src is not None else []
    incoming = peer_copy.Incoming(into, step_name)
    try:
        tier.link.exchange(sends, receives, lambda _src, _at, data: incoming.feed(data))
    finally:
        for o in outs:
            o.close()
        if incoming.received is None:  # the link failed mid-transfer: drop the partial copy
            incoming.abort()
    if receives:
        got = incoming.done()
        if got.error is not None:
            raise CheckpointError(f"the holder has no copy: {got.error}")


def _fetch_and_load(tier: LocalTier, state: MutableMapping[str, Any], plan: dict[str, Any],
                    holders: Sequence[int | None], cast: bool) -> str | None:
    """Moves the planned peer copies to their owners, then loads; this rank's error or None."""
    step, tiers = plan["step"], plan["tiers"]
    into = tier.receive_directory() if tiers[tier.rank] == "peer" else tier.own_path
    try:
        if tier.link is not None and "peer" in tiers:
            try:
                _fetch(tier, step, tiers, holders, into)
            except (OSError, CheckpointError) as e:
                return f"fetching from rank {holders[tier.rank]} failed: {e}"
        try:
            tier.load(f"{into}/{step_name(step)}", state, cast)
        except (OSError, CheckpointError) as e:
            return f"{type(e).__name__}: {e}"
        return None
    finally:
        tier.discard_received(into)


__all__ = ["RestoreInfo", "Tier", "choose", "restore_local"]
