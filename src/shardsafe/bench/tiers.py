"""Restore from the local tier against a cold restore from the persistent tier.

``python -m shardsafe.bench.tiers [--size 512MiB] [--dir DIR|URL] [--local-dir /dev/shm/...]``

One ``CheckpointManager`` saves the same state to both tiers (a persistent directory on
disk, a local directory in ``/dev/shm``). Then, ``--repeat`` times, interleaved: a fresh
manager restores from the local tier, and a fresh manager without a local tier restores
from the persistent one after its files were evicted from the page cache
(``measure.drop_cache``: fdatasync + ``posix_fadvise(DONTNEED)``), as a restarted job
on another process would find them. Both restore in place into the same state. Prints a
table and, as its last line, ``{"local_s": ..., "persistent_cold_s": ..., "speedup": ...}``
(medians).

``local_tier_section`` runs it once on a small state for ``shardsafe demo``'s last section.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from ..manager import CheckpointManager
from . import parse_size
from .measure import drop_cache, remove
from .states import large_tensors, nbytes, zeros_like

MiB = 1 << 20


def run(size: int, directory: str, local_dir: str, repeat: int,
        storage_options: dict | None = None) -> dict[str, float]:
    """Saves once to both tiers; the median seconds of local and cold persistent restores.

    ``directory`` is a local directory (its ``persistent`` subdirectory is used and
    evicted from the page cache before each persistent restore) or a URL (an object
    store is always read over the network).
    """
    state = large_tensors(size)
    url = "://" in directory
    persistent = directory.rstrip("/") + "/persistent" if url else os.path.join(directory, "persistent")
    so = {"storage_options": storage_options} if storage_options else {}
    with CheckpointManager(persistent, local_directory=local_dir, **so) as mgr:
        mgr.save(1, state)
    target = zeros_like(state)
    local, cold = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        with CheckpointManager(persistent, local_directory=local_dir, **so) as mgr:
            assert mgr.restore(target) == 1 and mgr.last_restore.tier == "local"  # type: ignore[union-attr]
        local.append(time.perf_counter() - t0)
        if not url:
            drop_cache(persistent)
        t0 = time.perf_counter()
        with CheckpointManager(persistent, **so) as mgr:
            assert mgr.restore(target) == 1 and mgr.last_restore.tier == "persistent"  # type: ignore[union-attr]
        cold.append(time.perf_counter() - t0)
    lo, co = statistics.median(local), statistics.median(cold)
    return {"state_bytes": nbytes(state), "local_s": lo, "persistent_cold_s": co, "speedup": co / lo}


def local_tier_section(size: int = 128 * MiB) -> str:
    """Text lines for ``shardsafe demo``: what the local tier is, and both restore times of
    a ``size``-byte state (local tier in ``/dev/shm``, one round)."""
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shardsafe.bench.tiers", description=__doc__.split("\n")[0])
    p.add_argument("--size", default="512MiB", help="state size (default 512MiB)")
    p.add_argument("--dir", default=None,
                   help="persistent tier's parent directory or URL, e.g. s3://bucket/x (default: a temp dir)")
    p.add_argument("--storage-options", default=None, help="JSON storage options for a --dir URL")
    p.add_argument("--local-dir", default=None, help="local tier (default: a new directory in /dev/shm)")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args(argv)
    directory = a.dir or tempfile.mkdtemp(prefix="shardsafe-tiers-")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    local_dir = a.local_dir or tempfile.mkdtemp(prefix="shardsafe-local-", dir=shm)
    try:
        so = json.loads(a.storage_options) if a.storage_options else None
        r = run(parse_size(a.size), directory, local_dir, a.repeat, so)
    finally:
        if a.dir is None:
            remove(directory)
        if a.local_dir is None:
            remove(local_dir)
    mib = r["state_bytes"] / MiB
    print(f"restore of a {mib:.0f} MiB state, median of {a.repeat}")
    print(f"  local tier ({local_dir}):        {r['local_s']:.3f} s")
    print(f"  persistent tier, cold ({directory}): {r['persistent_cold_s']:.3f} s")
    print(f"  local is {r['speedup']:.1f}x faster")
    print(json.dumps({k: round(v, 4) for k, v in r.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
