"""The distributed benchmark: shardsafe vs DCP on 2 and 4 ranks, same total state, one run.

``python -m shardsafe.bench.distributed [--size 512MiB] [--nproc 2,4] [--repeat 3]``

One set of ``max(nproc)`` processes runs every phase (a phase forms a fresh gloo group
of its ranks; the others sit it out), so interpreter start-up is paid once:

* ``run@N``: an FSDP-style state (``--tensors`` float32 tensors sharded by rows over N
  ranks, ``--size`` bytes in all) saved and loaded by shardsafe (``save``,
  ``async_save``, in-place ``load``) and by DCP (``dcp.save``, ``dcp.async_save``,
  ``dcp.load``); the checkpoints are kept for the resharding phases;
* ``reshard@M``: the checkpoints saved by the other world size loaded onto M ranks (N->M).

Each figure is the job's time: the slowest rank's, median over ``--repeat`` rounds.
Every save goes to a fresh path (the previous round's checkpoint is removed untimed).
``stall`` is how long ``save``/``async_save`` blocked the caller, ``durable`` until the
checkpoint was committed on every rank. Cold loads evict the files from the page cache
first (``posix_fadvise``). The machine's own limits are measured by ``shardsafe bench``;
this module reports shardsafe next to DCP as ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from .._numbers import ceil_div
from ..harness.processes import phase_spec, phases, start_ranks, wait_ranks
from . import parse_size
from .report import write_doc

# ----------------------------------------------------------------------------- one rank


def _state(total: int, tensors: int, rank: int, world: int) -> dict[str, Any]:
    """This rank's shards of ``tensors`` row-sharded float32 tensors of ``total`` bytes."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (world,))
    cols = 1024
    rows = max(world, total // (tensors * cols * 4))
    out: dict[str, Any] = {}
    g = torch.Generator().manual_seed(rank)
    for i in range(tensors):
        # torch's row split for Shard(0): ceil(rows / world) rows per rank, the last fewer
        per = ceil_div(rows, world)
        lo, hi = min(rank * per, rows), min((rank + 1) * per, rows)
        local = torch.rand(hi - lo, cols, generator=g)
        out[f"layer{i:03d}.weight"] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                                         shape=(rows, cols), stride=(cols, 1))
    return {"model": out}


def _targets(state: dict[str, Any]) -> dict[str, Any]:
    import torch
    from torch.distributed.tensor import DTensor

    return {"model": {k: DTensor.from_local(torch.empty_like(v.to_local()), v.device_mesh,
                                            v.placements, run_check=False, shape=v.shape,
                                            stride=v.stride())
                      for k, v in state["model"].items()}}


def _job_seconds(fn: Callable[[], dict[str, float]]) -> dict[str, float]:
    """Runs ``fn`` on every rank (after a barrier); each metric is the slowest rank's."""
    import torch.distributed as dist

    from ..comm import get_comm

    dist.barrier()
    local = fn()
    keys = sorted(local)
    worst = get_comm().allreduce_max([int(local[k] * 1e9) for k in keys])
    return {k: v / 1e9 for k, v in zip(keys, worst)}


SAVE_PATHS = {"shardsafe save": "ss", "shardsafe async_save": "ss-async", "dcp.save": "dcp",
              "dcp.async_save": "dcp-async"}


def _remove(path: str) -> None:
    """Rank 0 removes ``path`` between barriers: every save is timed into a fresh path (an
    overwrite would add deleting the old checkpoint, which DCP does not do)."""
    import torch.distributed as dist

    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)
    dist.barrier()


def _evict(path: str) -> None:
    """Drops the checkpoint's files from the page cache (every rank's view: same files)."""
    import torch.distributed as dist

    from .measure import drop_cache

    dist.barrier()
    if dist.get_rank() == 0:
        drop_cache(path)
    dist.barrier()


def _saves(state: dict[str, Any], base: str) -> dict[str, Callable[[], dict[str, float]]]:
    import torch.distributed.checkpoint as dcp

    import shardsafe

    def ss_save() -> dict[str, float]:
        t = time.perf_counter()
        shardsafe.save(state, f"{base}/ss")
        d = time.perf_counter() - t
        return {"stall": d, "durable": d}

    def ss_async() -> dict[str, float]:
        t = time.perf_counter()
        h = shardsafe.async_save(state, f"{base}/ss-async")
        stall = time.perf_counter() - t
        h.result()
        return {"stall": stall, "durable": time.perf_counter() - t}

    def dcp_save() -> dict[str, float]:
        t = time.perf_counter()
        dcp.save(state, checkpoint_id=f"{base}/dcp")
        d = time.perf_counter() - t
        return {"stall": d, "durable": d}

    def dcp_async() -> dict[str, float]:
        t = time.perf_counter()
        fut = dcp.async_save(state, checkpoint_id=f"{base}/dcp-async")
        stall = time.perf_counter() - t
        getattr(fut, "upload_completion", fut).result()
        return {"stall": stall, "durable": time.perf_counter() - t}

    return {"shardsafe save": ss_save, "shardsafe async_save": ss_async,
            "dcp.save": dcp_save, "dcp.async_save": dcp_async}


def _loads(target: dict[str, Any], ss_path: str, dcp_path: str,
           cold: bool) -> dict[str, Callable[[], dict[str, float]]]:
    import torch.distributed.checkpoint as dcp

    import shardsafe

    def ss_load() -> dict[str, float]:
        t = time.perf_counter()
        shardsafe.load(ss_path, target)
        return {"load": time.perf_counter() - t}

    def dcp_load() -> dict[str, float]:
        t = time.perf_counter()
        dcp.load(target, checkpoint_id=dcp_path)
        return {"load": time.perf_counter() - t}

    suffix = " (cold)" if cold else " (warm)"
    return {"shardsafe load" + suffix: ss_load, "dcp.load" + suffix: dcp_load}


def _measure(ops: dict[str, Callable[[], dict[str, float]]], repeat: int,
             before: Callable[[str], None] | None = None) -> dict[str, dict[str, float]]:
    samples: dict[str, dict[str, list[float]]] = {}
    for round_ in range(repeat + 1):  # round 0 warms up and is not recorded
        for name, op in ops.items():
            if before is not None:
                before(name)
            got = _job_seconds(op)
            if round_:
                for k, v in got.items():
                    samples.setdefault(name, {}).setdefault(k, []).append(v)
    return {n: {k: statistics.median(v) for k, v in m.items()} for n, m in samples.items()}


def run_phase(kind: str, world: int, out: str, opts: dict[str, Any]) -> dict[str, Any]:
    """One phase on this rank; returns rank 0's figures."""
    import torch.distributed as dist

    rank = dist.get_rank()
    state = _state(opts["size"], opts["tensors"], rank, world)
    target = _targets(state)
    base = os.path.join(out, f"w{world}")
    result: dict[str, Any] = {}
    if kind == "run":
        result["save"] = _measure(_saves(state, base), opts["repeat"],
                                  lambda name: _remove(os.path.join(base, SAVE_PATHS[name])))
        for cold in (False, True):
            evict = (lambda name, c=cold: _evict(base)) if cold else None
            result.setdefault("load", {}).update(
                _measure(_loads(target, f"{base}/ss", f"{base}/dcp", cold), opts["repeat"], evict))
    for other in opts["nproc"]:
        src = os.path.join(out, f"w{other}")
        if other != world and os.path.exists(os.path.join(src, "ss", "index.json")):
            got = _measure(_loads(target, f"{src}/ss", f"{src}/dcp", True), opts["repeat"],
                           lambda name, s=src: _evict(s))
            result.setdefault("reshard", {})[f"{other}->{world}"] = got
    return result


def worker(argv: Sequence[str]) -> int:
    """A rank of the benchmark (``--worker`` mode)."""
    import torch

    spec, out, opts = argv[0], argv[1], json.loads(argv[2])
    warnings.filterwarnings("ignore", module="torch.distributed.checkpoint")
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    for kind, world in phases(spec, rank):
        result = run_phase(kind, world, out, opts)
        if rank == 0:
            with open(os.path.join(out, f"{kind}-{world}.json"), "w") as f:
                json.dump(result, f)
    return 0


# ----------------------------------------------------------------------------- orchestration


def run(nproc: Sequence[int], size: int, tensors: int, repeat: int, directory: str) -> dict[str, Any]:
    """Runs every phase in one set of processes; returns ``{"run": {N: ...}, "reshard": ...}``."""
    spec = phase_spec([("run", n) for n in nproc]
                      + [("reshard", n) for n in nproc[:-1]])  # the last run already did
    opts = {"size": size, "tensors": tensors, "repeat": repeat, "nproc": list(nproc)}
    procs = start_ranks(["-m", "shardsafe.bench.distributed", "--worker", spec, directory, json.dumps(opts)],
                        max(nproc), env={"OMP_NUM_THREADS": "1"})
    wait_ranks(procs)
    codes = [p.returncode for p in procs]
    if any(codes):
        raise RuntimeError(f"benchmark ranks exited with {codes}")
    results: dict[str, Any] = {"run": {}, "reshard": {}}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            with open(os.path.join(directory, name)) as f:
                got = json.load(f)
            kind, world = name[:-5].split("-")
            if kind == "run":
                results["run"][int(world)] = {"save": got["save"], "load": got["load"]}
            results["reshard"].update(got.get("reshard", {}))
    return results


def _fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def table(results: dict[str, Any], size: int) -> str:
    """Markdown tables of the figures, with shardsafe/DCP ratios."""
    gib = size / (1 << 30)
    lines = ["| ranks | system | stall | durable | GB/s | DCP / shardsafe (durable) |",
             "|---|---|---|---|---|---|"]
    for n, r in sorted(results["run"].items()):
        s = r["save"]
        for name, peer in (("shardsafe save", "dcp.save"), ("shardsafe async_save", "dcp.async_save"),
                           ("dcp.save", None), ("dcp.async_save", None)):
            m = s[name]
            ratio = f"{s[peer]['durable'] / m['durable']:.2f}x" if peer else ""
            lines.append(f"| {n} | {name} | {_fmt(m['stall'])} | {_fmt(m['durable'])} | "
                         f"{size / m['durable'] / 1e9:.2f} | {ratio} |")
    lines += ["", "| ranks | load | shardsafe | dcp.load | DCP / shardsafe |", "|---|---|---|---|---|"]
    for n, r in sorted(results["run"].items()):
        for mode in ("warm", "cold"):
            a, b = r["load"][f"shardsafe load ({mode})"]["load"], r["load"][f"dcp.load ({mode})"]["load"]
            lines.append(f"| {n} | in place, {mode} | {_fmt(a)} | {_fmt(b)} | {b / a:.2f}x |")
    for key, r in sorted(results["reshard"].items()):
        a, b = r["shardsafe load (cold)"]["load"], r["dcp.load (cold)"]["load"]
        lines.append(f"| {key} | resharded, cold | {_fmt(a)} | {_fmt(b)} | {b / a:.2f}x |")
    return f"State: {gib:.2f} GiB float32 in row-sharded DTensors (same total on every world size).\n\n" \
        + "\n".join(lines)


def write_section(path: str, text: str, command: str) -> None:
    """Replaces the distributed section of ``path`` (between its markers), or appends it."""
    write_doc(path, f"## Distributed (shardsafe vs DCP)\n\nCommand: `{command}`\n\n{text}", "distributed-bench")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m shardsafe.bench.distributed``: runs the benchmark and prints the tables."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return worker(argv[1:])
    p = argparse.ArgumentParser(prog="python -m shardsafe.bench.distributed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=parse_size, default=parse_size("512MiB"), help="total state")
    p.add_argument("--tensors", type=int, default=32, help="number of tensors (default 32)")
    p.add_argument("--nproc", default="2,4", help="world sizes, comma-separated (default 2,4)")
    p.add_argument("--repeat", type=int, default=3, help="recorded rounds (medians)")
    p.add_argument("--dir", default=None, help="directory for checkpoints (default: temporary)")
    p.add_argument("--write-doc", metavar="PATH", help="also write the tables into PATH")
    args = p.parse_args(argv)
    nproc = sorted({int(x) for x in args.nproc.split(",")})
    directory = args.dir or tempfile.mkdtemp(prefix="shardsafe-bench-dist-")
    try:
        results = run(nproc, args.size, args.tensors, args.repeat, directory)
    finally:
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    text = table(results, args.size)
    print(text)
    if args.write_doc:
        write_section(args.write_doc, text, "python -m shardsafe.bench.distributed " + " ".join(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
