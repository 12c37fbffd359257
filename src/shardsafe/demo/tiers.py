"""The demo's local-tier section: the same state restored from each tier, timed.

Saves one state through a ``CheckpointManager`` with a local tier (a directory in
``/dev/shm``) and restores it twice in fresh managers: from the local tier, and from the
persistent directory after evicting its files from the page cache, as a restarted job
on a new process finds them (``shardsafe.bench.tiers`` measures the same thing with
more rounds and larger states).
"""

from __future__ import annotations

import os
import tempfile

from ..bench.measure import remove
from ..bench.tiers import run

MiB = 1 << 20


def local_tier_section(size: int = 128 * MiB) -> str:
    """Text lines: what the local tier is, and both restore times of a ``size``-byte state."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    directory = tempfile.mkdtemp(prefix="shardsafe-demo-tiers-")
    local = tempfile.mkdtemp(prefix="shardsafe-demo-local-", dir=shm)
    try:
        r = run(size, directory, local, repeat=1)
    finally:
        remove(directory)
        remove(local)
    return "\n".join([
        "Local tier (local_directory=..., in host memory: survives a process crash, not the node)",
        f"  restoring a {r['state_bytes'] / MiB:.0f} MiB state after a crash:",
        f"    {'from the local tier (' + (shm or 'a local directory') + '):':<44}{r['local_s']:.3f} s",
        f"    {'from the persistent tier, cold page cache:':<44}{r['persistent_cold_s']:.3f} s",
        f"    the local tier is {r['speedup']:.1f}x faster here (on a real disk or object store, "
        f"the cold read dominates)",
    ])


__all__ = ["local_tier_section"]
