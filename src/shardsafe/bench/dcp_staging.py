"""How long ``dcp.async_save`` blocks the caller: DCP's default staging against
``shardsafe.dcp.Stager``, on the same state, interleaved in one run.

``python -m shardsafe.bench.dcp_staging --size 1GiB --repeat 5 --dir /tmp/b`` saves the
state through ``shardsafe.dcp.Writer`` with each stager in turn (each save waited for
before the next, as a training job waits for the previous checkpoint), after one warm-up
round, and prints a markdown table: the median time ``dcp.async_save`` blocked, until
durable, the ratio, and the most staging memory the Stager held against its budget
(``max_staging_bytes``: one image of the state, rounded up to 1 MiB).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
import warnings
from typing import Any

from . import parse_size
from .states import large_tensors, nbytes

MiB = 1 << 20


def _save(dcp: Any, state: dict[str, Any], path: str, stager: Any) -> tuple[float, float]:
    from ..dcp import Writer

    t = time.perf_counter()
    fut = dcp.async_save(state, storage_writer=Writer(path), async_stager=stager)
    stall = time.perf_counter() - t
    fut.result()
    return stall, time.perf_counter() - t


def run(size: int, repeat: int, directory: str, tensor_size: int = 64 * MiB) -> dict[str, Any]:
    """The samples of both stagers (seconds), the Stager's budget and peak (bytes)."""
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    import torch.distributed.checkpoint as dcp

    from ..dcp import Stager

    state = large_tensors(size, tensor_size)
    budget = -(-(nbytes(state) + 64 * 1024) // MiB) * MiB  # one image: the tensors and the header
    stager = Stager(max_staging_bytes=budget)
    samples: dict[str, list[tuple[float, float]]] = {"default": [], "stager": []}
    try:
        for r in range(-1, repeat):  # round -1 warms up (the Stager allocates its buffers)
            for name in (("default", "stager") if r % 2 else ("stager", "default")):
                path = os.path.join(directory, f"dcp-staging-{name}-{r}")
                m = _save(dcp, state, path, stager if name == "stager" else None)
                shutil.rmtree(path, ignore_errors=True)
                if r >= 0:
                    samples[name].append(m)
    finally:
        peak = stager.peak_nbytes
        stager.close()
    return {"nbytes": nbytes(state), "samples": samples, "budget": budget, "peak": peak}


def table(res: dict[str, Any]) -> str:
    med = {k: (statistics.median(s for s, _ in v), statistics.median(d for _, d in v))
           for k, v in res["samples"].items()}
    rows = [f"{res['nbytes'] / MiB:.0f} MiB fp32 state, {len(res['samples']['stager'])} rounds, medians.", "",
            "| dcp.async_save through shardsafe.dcp.Writer | caller blocked (s) | durable (s) |",
            "|---|---:|---:|",
            f"| DCP's default staging | {med['default'][0]:.3f} | {med['default'][1]:.3f} |",
            f"| shardsafe.dcp.Stager | {med['stager'][0]:.3f} | {med['stager'][1]:.3f} |", "",
            f"Stager / default, caller blocked: **{med['stager'][0] / med['default'][0]:.2f}x**. "
            f"Stager staging memory: peak {res['peak'] / MiB:.0f} MiB, budget (max_staging_bytes) "
            f"{res['budget'] / MiB:.0f} MiB: {'held' if res['peak'] <= res['budget'] else 'EXCEEDED'}."]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shardsafe.bench.dcp_staging", description=__doc__.split("\n")[0])
    p.add_argument("--size", type=parse_size, default=1 << 30, help="state size (default 1GiB)")
    p.add_argument("--repeat", type=int, default=5, help="recorded rounds (medians)")
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary directory)")
    args = p.parse_args(argv)
    directory = args.dir or os.path.join(os.environ.get("TMPDIR", "/tmp"), f"shardsafe-dcp-staging-{os.getpid()}")
    os.makedirs(directory, exist_ok=True)
    print(table(run(args.size, args.repeat, directory)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
