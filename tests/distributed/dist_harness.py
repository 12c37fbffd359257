"""Launch real multi-process torch.distributed (gloo, CPU) jobs for the tests.

Each rank is a fresh ``python dist_worker.py <scenario> <out_dir> [args]`` process
with the torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); it writes
its result as JSON to ``<out_dir>/<scenario>-r<rank>.json``. No mocks: the ranks form a
real gloo process group over TCP on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from shardsafe.comm import free_loopback_port

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "dist_worker.py")
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")


def run_ranks(nprocs: int, phases: Sequence[tuple[str, int]], out_dir: str, *args: str,
              timeout: float = 120, killed: Sequence[int] = (),
              env: dict[str, str] | None = None) -> dict[tuple[str, int], list[dict[str, Any] | None]]:
    """Starts ``nprocs`` processes that run ``phases`` one after another.

    A phase ``(scenario, world)`` forms a fresh gloo group of ranks ``0..world-1`` (the
    other processes sit it out), runs the scenario and tears the group down: loading
    onto 2, 3 and 4 ranks costs one interpreter start-up instead of three.

    Returns:
        ``{(scenario, world): [result of rank 0, rank 1, ...]}`` (None for killed ranks).

    Raises:
        AssertionError: a rank failed (its output is in the message) or the job hung.
    """
    os.makedirs(out_dir, exist_ok=True)
    spec = ",".join(f"{name}:{world}:{free_loopback_port()}" for name, world in phases)
    procs = []
    for rank in range(nprocs):
        penv = dict(os.environ, RANK=str(rank), MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1",
                    PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
        log = open(os.path.join(out_dir, f"r{rank}.log"), "w+")
        procs.append((subprocess.Popen([sys.executable, WORKER, spec, out_dir, *args], env=penv,
                                       stdout=log, stderr=subprocess.STDOUT), log))
    deadline = time.monotonic() + timeout
    try:
        for p, _ in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for p, _ in procs:
            p.kill()
        raise AssertionError(f"{spec} on {nprocs} processes hung for {timeout} s:\n{_logs(procs)}")
    finally:
        for p, _ in procs:
            p.wait()
    try:
        bad = [r for r, (p, _) in enumerate(procs) if (p.returncode != 0) != (r in killed)]
        assert not bad, f"{spec}: rank(s) {bad} exited wrongly:\n{_logs(procs)}"
        results: dict[tuple[str, int], list[dict[str, Any] | None]] = {}
        for name, world in phases:
            results[(name, world)] = [None if rank in killed else _result(out_dir, name, world, rank)
                                      for rank in range(world)]
        return results
    finally:
        for _, log in procs:
            log.close()


def _result(out_dir: str, name: str, world: int, rank: int) -> dict[str, Any]:
    with open(os.path.join(out_dir, f"{name}-w{world}-r{rank}.json")) as f:
        return json.load(f)


def _logs(procs: list) -> str:
    out = []
    for rank, (p, log) in enumerate(procs):
        log.seek(0)
        out.append(f"--- rank {rank} (exit {p.returncode})\n{log.read()[-4000:]}")
    return "\n".join(out)


def run_script(script: str, nprocs: int, *args: str, timeout: float = 120,
               env: dict[str, str] | None = None, killed: Sequence[int] = ()) -> list[str]:
    """Runs ``python <script> *args`` as ranks ``0..nprocs-1`` of one torchrun-style job.

    Each process gets RANK, WORLD_SIZE, MASTER_ADDR/MASTER_PORT (one fresh loopback port)
    and this directory and ``src`` on PYTHONPATH; ``env`` adds or overrides variables
    (e.g. a ``MASTER_PORT`` spec of the script's own).

    Returns:
        Each rank's combined stdout and stderr.

    Raises:
        AssertionError: a rank exited non-zero, or a rank of ``killed`` (ranks the test
            expects to die) exited zero (every rank's output is in the message).
    """
    port = str(free_loopback_port())
    procs = []
    for rank in range(nprocs):
        penv = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nprocs), MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=port, OMP_NUM_THREADS="1",
                    PYTHONPATH=os.pathsep.join([SRC, HERE, os.environ.get("PYTHONPATH", "")]),
                    **(env or {}))
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, script), *args], env=penv,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode != 0 for p in procs] == [r in killed for r in range(nprocs)], "\n".join(outputs)
    return outputs


def phases(spec: str, rank: int) -> Iterator[tuple[str, int]]:
    """Inside a worker: forms one fresh gloo group per phase of ``spec`` (``name:world:port,...``)
    that includes ``rank``, yields ``(name, world)`` while it is up, then tears it down.

    A worker that must not tear its group down (a peer was killed) leaves with ``os._exit``.
    """
    import torch.distributed as dist

    for phase in spec.split(","):
        name, world, port = phase.split(":")
        if rank >= int(world):
            continue
        os.environ.update(WORLD_SIZE=world, LOCAL_WORLD_SIZE=world, LOCAL_RANK=str(rank),
                          MASTER_PORT=port)
        dist.init_process_group("gloo")
        yield name, int(world)
        dist.barrier()
        dist.destroy_process_group()
