"""Child Python processes: their environment, and local multi-rank jobs.

``child_env`` is the environment every child of the demos, the benchmarks and the tests
starts with: this very shardsafe first on ``PYTHONPATH`` (also when it is not installed)
and one OpenMP thread unless the caller's environment chose.

A multi-rank job is ``nprocs`` processes of one command line with the environment
``torchrun`` gives its ranks (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR=127.0.0.1, MASTER_PORT) on this machine: ``start_ranks`` starts them,
``wait_ranks`` waits for all of them within a time limit. A job may run several
*phases* one after another in the same processes (``phase_spec`` on the launching side,
``phases`` inside each rank): each phase forms a fresh gloo group of ranks
``0..world-1`` while the others sit it out, so runs on 2, 3 and 4 ranks cost one
interpreter start-up per process instead of three.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import shardsafe

from ..comm import free_loopback_port

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(shardsafe.__file__)))


def child_env(*paths: str, **overrides: str) -> dict[str, str]:
    """This process's environment for a child: shardsafe's source and then ``paths``
    first on ``PYTHONPATH``, ``OMP_NUM_THREADS=1`` unless set, then ``overrides``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([SOURCE, *paths, env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(overrides)
    return env


def start_ranks(argv: Sequence[str], nprocs: int, *, paths: Sequence[str] = (),
                env: Mapping[str, str] | None = None,
                per_rank: Callable[[int], dict[str, Any]] | None = None,
                **popen: Any) -> list[subprocess.Popen]:
    """Starts ``python *argv`` as ranks ``0..nprocs-1`` of one job on this machine.

    Args:
        argv: The command line after the interpreter (a script or ``-m module``, and arguments).
        nprocs: The number of ranks.
        paths: Directories put on ``PYTHONPATH`` after shardsafe's source.
        env: Variables added to (or replacing) each rank's environment.
        per_rank: ``subprocess.Popen`` arguments of one rank (e.g. its ``stdout``).
        popen: ``subprocess.Popen`` arguments of every rank.
    """
    base = child_env(*paths, WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs),
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_loopback_port()))
    procs = []
    for rank in range(nprocs):
        kw = dict(popen, **(per_rank(rank) if per_rank is not None else {}))
        procs.append(subprocess.Popen([sys.executable, *argv], **kw,
                                      env=dict(base, RANK=str(rank), LOCAL_RANK=str(rank), **(env or {}))))
    return procs


def wait_ranks(procs: Sequence[subprocess.Popen], timeout: float | None = None) -> bool:
    """Waits until every rank has ended; True when they did within ``timeout`` seconds.

    On a timeout every rank still running is killed (and reaped) before this returns False.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=None if deadline is None else max(0.1, deadline - time.monotonic()))
        return True
    except subprocess.TimeoutExpired:
        return False
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def phase_spec(phases: Sequence[tuple[str, int]]) -> str:
    """The ``name:world:port,...`` argument that tells each rank its phases (``phases``),
    with a fresh loopback port for each phase's group."""
    return ",".join(f"{name}:{world}:{free_loopback_port()}" for name, world in phases)


def phases(spec: str, rank: int) -> Iterator[tuple[str, int]]:
    """Inside a rank: forms one fresh gloo group per phase of ``spec`` that includes
    ``rank``, yields ``(name, world)`` while it is up, then tears it down.

    A rank that must not tear its group down (a peer was killed) leaves with ``os._exit``.
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
