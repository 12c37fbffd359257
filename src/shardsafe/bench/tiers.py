"""The tiers, measured: a step saved to both tiers against one saved to the persistent
tier alone, and a restore from the local tier against a cold one from the persistent tier.

``python -m shardsafe.bench.tiers [--size 256MiB] [--repeat 3] [--steps 5] [--budget 64MiB]
[--dir DIR|URL] [--local-dir /dev/shm/...]``

Saves: each configuration runs in a fresh process (its memory is measured alone). A
``CheckpointManager`` saves ``--steps`` steps of the same state asynchronously; each
step's blocking time (the ``save`` call) is measured, and the peak extra resident memory
over the process before its first save (imports and pools warmed by another manager's
small save first). ``persistent``: no local tier; ``both``: every step due on both tiers
(one staged copy feeds both: the local checkpoint is a copy of the save, see
``engine.save.replica``); ``both+budget``: the same with ``max_staging_bytes``. Between steps
the manager waits for its writes, not counted: each step's blocking time is its own.

Restores: ``--repeat`` interleaved rounds, each in a fresh process whose target tensors
are live (faulted in), as in a process that replaces a crashed one: from the local tier,
and from the persistent tier after evicting its files from the page cache
(``measure.drop_cache``). The ``restore`` call alone is timed (GB/s of the state);
building the manager is reported apart.

Prints a table and, as its last line, JSON with medians: ``save_persistent_s``,
``save_both_s``, ``both_vs_persistent``, ``extra_*_bytes``, ``local_s``,
``persistent_cold_s``, ``speedup``, ``local_gbps``. ``local_tier_section`` (for
``shardsafe demo``) times one round of restores in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from ..harness.processes import child_env
from ..manager import CheckpointManager
from . import parse_size
from .measure import PeakRSS, drop_cache, remove
from .states import large_tensors, nbytes, zeros_like

MiB = 1 << 20


def _persistent(directory: str) -> str:
    return directory.rstrip("/") + "/persistent" if "://" in directory else os.path.join(directory, "persistent")


CONFIGS = ("persistent", "both", "budget")


def _managers(directory: str, local_dir: str | None, budget: int | None, so: dict,
              names: tuple[str, ...]) -> dict[str, CheckpointManager]:
    """One manager per configuration of ``names`` (module docstring), each on its own directories."""
    def sub(base: str, name: str) -> str:
        return f"{base.rstrip('/')}/{name}" if "://" in base else os.path.join(base, name)

    out = {}
    for name in names:
        tiers = {"local_directory": sub(local_dir, name)} if local_dir and name != "persistent" else {}
        out[name] = CheckpointManager(_persistent(sub(directory, name)), max_staging_bytes=budget if name == "budget"
                                      else None, **tiers, **so)
    return out


def save_steps(size: int, directory: str, local_dir: str, steps: int, budget: int,
               storage_options: dict | None = None, config: str | None = None) -> dict[str, Any]:
    """Saves ``steps`` steps with each configuration, interleaved step by step (so that load
    changes hit all alike); the blocking seconds of each. With ``config``, that
    configuration alone, with its peak extra resident bytes (run it in a fresh process)."""
    state = large_tensors(size)
    so = {"storage_options": storage_options} if storage_options else {}
    with tempfile.TemporaryDirectory(prefix="shardsafe-warm-") as tmp, \
            CheckpointManager(os.path.join(tmp, "p"), local_directory=os.path.join(tmp, "l"), **so) as warm:
        warm.save(0, large_tensors(4 * MiB))  # imports, pools: not measured
    peak = PeakRSS()
    blocked: dict[str, list[float]] = {}
    with peak.track():
        mgrs = _managers(directory, local_dir, budget, so, CONFIGS if config is None else (config,))
        try:
            for step in range(steps):
                for name, mgr in mgrs.items():
                    t0 = time.perf_counter()
                    mgr.save(step, state)
                    blocked.setdefault(name, []).append(time.perf_counter() - t0)
                    mgr.wait_until_finished()
        finally:
            for mgr in mgrs.values():
                mgr.close()
    return {"blocked_s": blocked, "extra": peak.extra}


def restore_once(size: int, directory: str, local_dir: str | None, storage_options: dict | None = None) -> dict:
    """One restore into live tensors: seconds of the ``restore`` call and of the manager's
    construction, and the tier used."""
    target = zeros_like(large_tensors(size))
    for t in target.values():
        t.fill_(1.0)  # live memory: every page faulted in, as a model's tensors are
    so = {"storage_options": storage_options} if storage_options else {}
    tiers = {"local_directory": local_dir} if local_dir else {}
    t0 = time.perf_counter()
    with CheckpointManager(_persistent(directory), **tiers, **so) as mgr:
        t1 = time.perf_counter()
        step = mgr.restore(target)
        t2 = time.perf_counter()
        tier = mgr.last_restore.tier  # type: ignore[union-attr]
    return {"step": step, "tier": tier, "restore_s": t2 - t1, "open_s": t1 - t0}


def _child(kind: str, **args: Any) -> dict:
    """Runs ``save_steps`` or ``restore_once`` in a fresh process; its JSON result."""
    r = subprocess.run([sys.executable, "-m", "shardsafe.bench.tiers", "--child", kind, json.dumps(args)],
                       env=child_env(), capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{kind} child failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_restores(size: int, directory: str, local_dir: str, repeat: int, storage_options: dict | None = None,
                 *, fresh: bool = True) -> dict[str, float]:
    """Saves once to both tiers, then ``repeat`` interleaved restores from each tier (each in
    a fresh process unless ``fresh`` is False); medians."""
    so = {"storage_options": storage_options} if storage_options else {}
    state = large_tensors(size)
    size = nbytes(state)
    with CheckpointManager(_persistent(directory), local_directory=local_dir, **so) as mgr:
        mgr.save(1, state)
    del state
    local, cold = [], []
    for _ in range(repeat):
        args = dict(size=size, directory=directory, storage_options=storage_options)
        got = _child("restore", local_dir=local_dir, **args) if fresh else restore_once(local_dir=local_dir, **args)
        assert got["step"] == 1 and got["tier"] == "local", got
        local.append(got)
        if "://" not in directory:
            drop_cache(_persistent(directory))
        got = _child("restore", local_dir=None, **args) if fresh else restore_once(local_dir=None, **args)
        assert got["step"] == 1 and got["tier"] == "persistent", got
        cold.append(got)
    lo, co = (statistics.median(g["restore_s"] for g in rows) for rows in (local, cold))
    return {"state_bytes": size, "local_s": lo, "persistent_cold_s": co, "speedup": co / lo,
            "local_gbps": size / lo / 1e9, "open_local_s": statistics.median(g["open_s"] for g in local)}


def run_saves(size: int, directory: str, local_dir: str, steps: int, budget: int,
              storage_options: dict | None = None) -> dict[str, float]:
    """The blocking times of the three configurations, interleaved in one fresh process, and
    the peak extra memory of each, alone in a fresh process."""
    args = dict(size=size, local_dir=local_dir, budget=budget, storage_options=storage_options)
    got = _child("save", directory=f"{directory.rstrip('/')}/timed" if "://" in directory
                 else os.path.join(directory, "timed"), steps=steps, **args)
    out: dict[str, float] = {}
    for name in CONFIGS:
        out[f"save_{name}_s"] = statistics.median(got["blocked_s"][name][1:])
        alone = _child("save", directory=f"{directory.rstrip('/')}/{name}" if "://" in directory
                       else os.path.join(directory, name), steps=2, config=name, **args)
        out[f"extra_{name}_bytes"] = alone["extra"]
    out["both_vs_persistent"] = out["save_both_s"] / out["save_persistent_s"]
    out["budget_bytes"] = budget
    return out


def local_tier_section(size: int = 128 * MiB) -> str:
    """Text lines for ``shardsafe demo``: what the local tier is, and both restore times of
    a ``size``-byte state (local tier in ``/dev/shm``, one round, in this process)."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    directory = tempfile.mkdtemp(prefix="shardsafe-demo-tiers-")
    local = tempfile.mkdtemp(prefix="shardsafe-demo-local-", dir=shm)
    try:
        r = run_restores(size, directory, local, repeat=1, fresh=False)
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


def _report(r: dict[str, float], a: argparse.Namespace, directory: str, local_dir: str) -> None:
    mib = r["state_bytes"] / MiB
    ex = {k: (r[f"extra_{k}_bytes"] or 0) / MiB for k in ("persistent", "both", "budget")}
    print(f"save of a {mib:.0f} MiB state, async, median of {a.steps - 1} steps (after the first)")
    print(f"  persistent tier only:   blocks {r['save_persistent_s'] * 1e3:7.1f} ms, peak extra {ex['persistent']:6.0f} MiB")
    print(f"  both tiers:             blocks {r['save_both_s'] * 1e3:7.1f} ms, peak extra {ex['both']:6.0f} MiB"
          f"  ({r['both_vs_persistent']:.2f}x the blocking time)")
    print(f"  both, budget {r['budget_bytes'] / MiB:.0f} MiB:   blocks {r['save_budget_s'] * 1e3:7.1f} ms, "
          f"peak extra {ex['budget']:6.0f} MiB")
    print(f"restore of the {mib:.0f} MiB state in a fresh process, median of {a.repeat}")
    print(f"  local tier ({local_dir}):  {r['local_s']:.3f} s ({r['local_gbps']:.1f} GB/s)")
    print(f"  persistent tier, cold ({directory}): {r['persistent_cold_s']:.3f} s")
    print(f"  local is {r['speedup']:.1f}x faster")
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shardsafe.bench.tiers", description=__doc__.split("\n")[0])
    p.add_argument("--size", default="256MiB", help="state size (default 256MiB)")
    p.add_argument("--dir", default=None,
                   help="persistent tier's parent directory or URL, e.g. s3://bucket/x (default: a temp dir)")
    p.add_argument("--storage-options", default=None, help="JSON storage options for a --dir URL")
    p.add_argument("--local-dir", default=None, help="local tier (default: a new directory in /dev/shm)")
    p.add_argument("--repeat", type=int, default=3, help="restore rounds")
    p.add_argument("--steps", type=int, default=5, help="saves per configuration")
    p.add_argument("--budget", default="64MiB", help="max_staging_bytes of the budgeted configuration")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        fn = save_steps if a.child[0] == "save" else restore_once
        print(json.dumps(fn(**json.loads(a.child[1]))))
        return 0
    directory = a.dir or tempfile.mkdtemp(prefix="shardsafe-tiers-")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    local_dir = a.local_dir or tempfile.mkdtemp(prefix="shardsafe-local-", dir=shm)
    try:
        so = json.loads(a.storage_options) if a.storage_options else None
        size = parse_size(a.size)
        r: dict[str, Any] = {"state_bytes": size}
        r.update(run_saves(size, directory, local_dir, max(2, a.steps), parse_size(a.budget), so))
        r.update(run_restores(size, directory, os.path.join(local_dir, "restore"), a.repeat, so))
    finally:
        if a.dir is None:
            remove(directory)
        if a.local_dir is None:
            remove(local_dir)
    _report(r, a, directory, local_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
