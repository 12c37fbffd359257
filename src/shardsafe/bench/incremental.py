"""Incremental saves: a frozen base plus a small trainable adapter, saved by a manager.

``python -m shardsafe.bench.incremental [--base 64MiB] [--adapter 512KiB] [--saves 10]
[--compression auto]`` saves the same run twice, with ``CheckpointManager(incremental=True)``
and without, both with ``max_to_keep=3``, synchronous saves and the given compression (so each ``save`` call's time is the whole
save: hashing, writing, fsync, commit and retention). It reports the bytes left on disk
against the base's bytes, and the time of the first save against the later ones.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

from . import parse_size


def _disk_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


def run_case(root: str, base_bytes: int, adapter_bytes: int, saves: int, incremental: bool,
             compression: str | None = None) -> dict[str, Any]:
    """Saves ``saves`` steps (the adapter changes every step, the base never); returns sizes
    and per-save times."""
    import torch

    import shardsafe

    g = torch.Generator().manual_seed(0)
    state = {"base": {f"layer{i}": torch.randn(base_bytes // 4 // 8, generator=g) for i in range(8)},
             "adapter": {"a": torch.randn(adapter_bytes // 8, generator=g),
                         "b": torch.randn(adapter_bytes // 8, generator=g)},
             "step": 0}
    times = []
    with shardsafe.CheckpointManager(root, max_to_keep=3, incremental=incremental, async_save=False,
                                     compression=compression) as mgr:
        for step in range(saves):
            state["adapter"]["a"].add_(0.01)
            state["adapter"]["b"].mul_(0.99)
            state["step"] = step
            t0 = time.perf_counter()
            mgr.save(step, state)
            times.append(time.perf_counter() - t0)
    base = sum(t.nbytes for t in state["base"].values())
    disk = _disk_bytes(root)
    return {"incremental": incremental, "base_bytes": base, "disk_bytes": disk,
            "disk_over_base": disk / base, "first_s": times[0],
            "later_median_s": statistics.median(times[1:]), "times_s": times,
            "hash_s": _hash_time(state) if incremental else None}


def _hash_time(state: dict[str, Any]) -> float:
    """Median time to hash the whole state (what an incremental save adds to every save)."""
    from ..engine.save.incremental import digests
    from ..plan.flatten import flatten

    _, items = flatten(state)
    samples = []
    for _ in range(3):
        t0 = time.perf_counter()
        digests(items)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=parse_size, default=parse_size("64MiB"), help="frozen base bytes")
    p.add_argument("--adapter", type=parse_size, default=parse_size("512KiB"), help="adapter bytes")
    p.add_argument("--saves", type=int, default=10)
    p.add_argument("--compression", choices=["zstd", "auto"], default=None,
                   help="compress the saves too (default: none)")
    p.add_argument("--dir", default=None, help="where to save (default: a temp dir)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = p.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for incremental in (True, False):
            results.append(run_case(os.path.join(tmp, f"inc{int(incremental)}"), args.base,
                                    args.adapter, args.saves, incremental, args.compression))
    print(f"frozen base {args.base / 2**20:.0f} MiB + adapter {args.adapter / 2**10:.0f} KiB, "
          f"{args.saves} saves, max_to_keep=3, synchronous saves, compression={args.compression}")
    print("| incremental | on disk / base | first save | later saves (median) | hashing the state |")
    print("|---|---|---|---|---|")
    for r in results:
        hashing = f"{r['hash_s'] * 1e3:.0f} ms" if r["hash_s"] is not None else "-"
        print(f"| {r['incremental']} | {r['disk_over_base']:.3f}x | {r['first_s'] * 1e3:.0f} ms | "
              f"{r['later_median_s'] * 1e3:.0f} ms | {hashing} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
