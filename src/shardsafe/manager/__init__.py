"""The checkpoint manager: save schedules, tiers, retention, preemption and fallback restore.

Modules: ``manager`` (the class), ``options`` (the validated configuration),
``save_policy`` (pure save decisions, the automatic interval among them), ``interval``
(Young/Daly measurements), ``retention`` (pure retention rules), ``steps`` (step
directories, listing via the commit rule, metadata), ``records`` (what is known about
each step, cached), ``recovery`` (restore with fallback, rollback), ``lock`` (one
writable manager per directory), ``preemption`` (signal handlers). The tiers:
``tier_save`` (one step's save to every due tier, staged once), ``tier_writer`` (each
tier's background worker and carried error), ``persistent_tier`` (its retention and
incremental baseline), ``local_tier`` (per-rank checkpoints on the node),
``run_identity`` (which run a local step belongs to), ``local_view`` (DTensors as local
shards), ``peer_copy`` (a checkpoint as a byte stream), ``tier_restore`` (agreeing on a
step across tiers). Rank coordination goes through ``comm.agreement`` only.
"""

from __future__ import annotations

from .manager import CheckpointManager
from .options import ManagerOptions
from .tier_restore import RestoreInfo

__all__ = ["CheckpointManager", "ManagerOptions", "RestoreInfo"]
