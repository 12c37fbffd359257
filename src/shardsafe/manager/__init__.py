"""The checkpoint manager: save schedules, retention, preemption and fallback restore.

Modules: ``options`` (the validated configuration), ``save_policy`` (pure save
decisions), ``policy`` (pure retention rules), ``steps`` (step directories, listing via
the commit rule, metadata), ``records`` (what is known about each step, cached),
``recovery`` (restore with fallback, rollback), ``lock`` (one writable manager per
directory), ``preemption`` (signal handlers), ``saving`` (the seam to the save engine),
``manager`` (the class). The local tier: ``local_tier`` (per-rank checkpoints on the
node), ``local_view`` (DTensors as local shards), ``peer_copy`` (a checkpoint as a
message), ``tier_restore`` (agreeing on a step across tiers), ``interval`` (Young/Daly). Rank coordination lives in ``comm.agreement``.
"""

from __future__ import annotations

from .manager import CheckpointManager
from .options import ManagerOptions
from .tier_restore import RestoreInfo

__all__ = ["CheckpointManager", "ManagerOptions", "RestoreInfo"]
