"""Collective restore across tiers: every rank agrees on one step and gets it somewhere.

Each rank reports what it can reach: its own local steps, the peer copies it holds for
other ranks, and the copies that already failed to load. Rank 0 runs ``choose`` (pure)
on the reports and broadcasts the plan: the newest step that every rank can get from its
own local directory or else from the rank holding its copy, provided it is not older
than the newest persistent step (otherwise the persistent tier wins). Copies travel from
holder to owner over the peers' dedicated group; the owner stores the copy in its local
directory and loads it from there, verifying every checksum like any load. If any rank
fails to load, all ranks try again without the copy that failed (warning with step, rank
and reason); when no step is left, the caller restores from the persistent tier.
"""

from __future__ import annotations

import logging
import time
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..comm import agreement, get_comm
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


def restore_local(tier: LocalTier, state: MutableMapping[str, Any], at_least: int | None) -> RestoreInfo | None:
    """Restores the newest step every rank can get from the local tier or its peers.

    Collective (every rank calls it). Returns None when no such step is at least
    ``at_least`` (the caller then restores from the persistent tier).
    """
    t0 = time.monotonic()
    comm = get_comm()
    holders = tier.link.holder if tier.link is not None else [None] * comm.world_size
    bad_local: set[int] = set()
    bad_peer: set[int] = set()
    while True:
        report = {"local": tier.steps(), "held": {str(k): v for k, v in tier.held().items()},
                  "bad_local": sorted(bad_local), "bad_peer": sorted(bad_peer)}
        reports = comm.gather(report)
        plan = agreement.leader_decides(lambda: choose(reports, holders, at_least),  # noqa: B023
                                        what="choosing the step to restore")
        if plan is None:
            return None
        step, mine = plan["step"], plan["tiers"][tier.rank]
        if mine == "peer" and step not in bad_local:
            log.warning("step %d: rank %d has no usable local copy in %s; fetching it from rank %s",
                        step, tier.rank, tier.own_path, holders[tier.rank])
        error = _fetch_and_load(tier, state, plan, holders)
        if agreement.worst(0 if error is None else 1) == 0:
            return RestoreInfo(step, mine, time.monotonic() - t0)
        if error is not None:
            (bad_local if mine == "local" else bad_peer).add(step)
            nxt = "the peer copy" if mine == "local" else "an older step or the persistent tier"
            log.warning("step %d: rank %d could not load its %s copy (%s); trying %s",
                        step, tier.rank, mine, error, nxt)


def _fetch_and_load(tier: LocalTier, state: MutableMapping[str, Any], plan: dict[str, Any],
                    holders: Sequence[int | None]) -> str | None:
    """Moves the planned peer copies to their owners, then loads; this rank's error or None."""
    step, tiers = plan["step"], plan["tiers"]
    error: str | None = None
    if tier.link is not None and "peer" in tiers:
        sends = {}
        for r, t in enumerate(tiers):
            if t == "peer" and holders[r] == tier.rank:
                held = tier.held().get(r, [])
                path = f"{tier.peer_path(r)}/{step_name(step)}" if step in held else None
                sends[r] = peer_copy.pack(step, r, path, None if path else "copy is gone")
        receives = [holders[tier.rank]] if tiers[tier.rank] == "peer" else []
        try:
            got = tier.link.exchange(sends, receives)  # type: ignore[arg-type]
            for msg in got.values():
                m = peer_copy.unpack(msg)
                if m.error is not None:
                    raise CheckpointError(f"the holder has no copy: {m.error}")
                peer_copy.write_step(m.files, tier.own_path, step_name(step))
        except (OSError, CheckpointError) as e:
            error = f"fetching from rank {holders[tier.rank]} failed: {e}"
    if error is None:
        try:
            tier.load(tier.own.step_path(step), state)
        except (OSError, CheckpointError) as e:
            error = f"{type(e).__name__}: {e}"
    return error


__all__ = ["RestoreInfo", "Tier", "choose", "restore_local"]
