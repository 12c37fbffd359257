"""Where the time of a save and a load of many tiny tensors goes: a ``cProfile`` of each.

``python -m shardsafe.bench.profile --count 100000`` saves ``count`` fp32 tensors of 16
elements with ``shardsafe.save``, loads them back with ``shardsafe.load`` (new tensors)
and into a state of the same layout, and prints for each the wall time without the
profiler (best of ``--repeat``), then the functions with the most time of their own
under the profiler (the profiler's overhead inflates small functions; compare rows,
not totals). Only the public API is used, so the same command profiles any version.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import shardsafe

from .states import tiny_tensors, zeros_like


def _best(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
        del out
    return best


def _profile(fn: Callable[[], Any], top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    out = fn()
    prof.disable()
    del out
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.strip_dirs().sort_stats("tottime").print_stats(top)
    return text.getvalue()


def run(count: int, repeat: int, top: int, directory: str) -> str:
    """The report (markdown-ish text) for ``count`` tiny tensors saved under ``directory``."""
    state = tiny_tensors(count)
    target = zeros_like(state)
    path = os.path.join(directory, "ckpt")

    def save() -> None:
        shutil.rmtree(path, ignore_errors=True)
        shardsafe.save(state, path)

    ops: Sequence[tuple[str, Callable[[], Any]]] = [
        ("shardsafe.save", save), ("shardsafe.load (new tensors)", lambda: shardsafe.load(path)),
        ("shardsafe.load (in place)", lambda: shardsafe.load(path, target))]
    save()  # warm-up: imports, pools, buffers
    shardsafe.load(path)
    out = [f"{count} tensors of 16 fp32 elements; wall times are the best of {repeat}."]
    for name, fn in ops:
        t = _best(fn, repeat)
        out.append(f"\n## {name}: {t:.3f} s, {t / count * 1e6:.1f} us per tensor\n")
        out.append(_profile(fn, top))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shardsafe.bench.profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=100_000, help="tensors (default 100000)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs without the profiler (best of)")
    p.add_argument("--top", type=int, default=20, help="functions listed per profile")
    p.add_argument("--dir", default=None, help="where the checkpoint goes (default: a temp dir)")
    args = p.parse_args(argv)
    directory = args.dir or tempfile.mkdtemp(prefix="shardsafe-profile-")
    try:
        print(run(args.count, args.repeat, args.top, directory))
    finally:
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
