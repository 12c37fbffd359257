"""The checkpoint manager: save schedules, retention, preemption and fallback restore.

Modules: ``options`` (the validated configuration), ``policy`` (pure retention rules),
``steps`` (step directories, listing via the commit rule, metadata), ``recovery``
(restore with fallback), ``preemption`` (signal handlers), ``saving`` (the seam to the
save engine), ``manager`` (the class).
"""

from __future__ import annotations

from .manager import CheckpointManager
from .options import ManagerOptions

__all__ = ["CheckpointManager", "ManagerOptions"]
