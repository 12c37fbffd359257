"""Real multi-process jobs for the tests: the ranks of one torchrun-style job on this
machine, started by ``shardsafe.harness.processes`` (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, ...; a real gloo group over TCP on 127.0.0.1, no mocks).

``run_job`` runs any script as ranks and keeps each rank's output; ``run_script`` runs
one that must succeed on every rank; ``run_ranks`` runs the phases of
``distributed/dist_worker.py``, which writes each rank's result as JSON to
``<out_dir>/<scenario>-w<world>-r<rank>.json``; ``run_jax`` runs a ``jax.distributed`` job
of ``jax/jax_dist_worker.py`` (its processes take the same variables).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardsafe.harness.processes import phase_spec, start_ranks, wait_ranks

TESTS = os.path.dirname(os.path.abspath(__file__))
DIST = os.path.join(TESTS, "distributed")
SRC = os.path.join(os.path.dirname(TESTS), "src")


@dataclass
class Job:
    """A finished job: each rank's exit code and combined stdout and stderr."""

    codes: list[int]
    outputs: list[str]
    hung: bool

    def logs(self, tail: int = 4000) -> str:
        """The end of every rank's output, for an assertion message."""
        return "\n".join(f"--- rank {r} (exit {c})\n{out[-tail:]}"
                         for r, (c, out) in enumerate(zip(self.codes, self.outputs)))


def run_job(script: str, nprocs: int, *args: str, timeout: float = 120,
            log_dir: str | None = None, name: str = "",
            env: dict[str, str] | None = None) -> Job:
    """Runs ``python <script> *args`` as ranks ``0..nprocs-1`` of one job and waits for it.

    ``script`` is a path (relative ones are under ``tests/distributed``); its directory
    and ``tests`` are put on ``PYTHONPATH``. Each rank's output goes to
    ``<log_dir>/<name>-r<rank>.log`` (or a temporary file). A job still running after
    ``timeout`` seconds is killed and marked ``hung``.
    """
    path = os.path.join(DIST, script)
    logs = [open(os.path.join(log_dir, f"{name}-r{r}.log" if name else f"r{r}.log"), "w+")
            if log_dir is not None else tempfile.TemporaryFile("w+") for r in range(nprocs)]
    try:
        procs = start_ranks([path, *args], nprocs, paths=[os.path.dirname(path), TESTS],
                            env={"OMP_NUM_THREADS": "1", **(env or {})},
                            per_rank=lambda r: {"stdout": logs[r], "stderr": subprocess.STDOUT})
        finished = wait_ranks(procs, timeout)
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read())
        return Job([p.returncode for p in procs], outputs, not finished)
    finally:
        for log in logs:
            log.close()


def run_script(script: str, nprocs: int, *args: str, timeout: float = 120,
               env: dict[str, str] | None = None) -> list[str]:
    """Runs ``script`` (see ``run_job``) as ``nprocs`` ranks; each rank's output.

    Raises:
        AssertionError: a rank exited non-zero or the job hung (every rank's output is in
            the message).
    """
    job = run_job(script, nprocs, *args, timeout=timeout, env=env)
    assert not job.hung and job.codes == [0] * nprocs, job.logs()
    return job.outputs


def run_ranks(nprocs: int, phases: Sequence[tuple[str, int]], out_dir: str, *args: str,
              timeout: float = 120, killed: Sequence[int] = (), env: dict[str, str] | None = None,
              worker: str = "dist_worker.py") -> dict[tuple[str, int], list[dict[str, Any] | None]]:
    """Starts ``nprocs`` ranks of ``worker`` (a script under ``tests/distributed``, default
    ``dist_worker.py``) that run ``phases`` one after another.

    A phase ``(scenario, world)`` forms a fresh gloo group of ranks ``0..world-1`` (the
    other processes sit it out), runs the scenario and tears the group down: loading
    onto 2, 3 and 4 ranks costs one interpreter start-up instead of three.

    Returns:
        ``{(scenario, world): [result of rank 0, rank 1, ...]}`` (None for killed ranks).

    Raises:
        AssertionError: a rank failed (its output is in the message) or the job hung.
    """
    os.makedirs(out_dir, exist_ok=True)
    spec = phase_spec(phases)
    job = run_job(worker, nprocs, spec, out_dir, *args, timeout=timeout,
                  log_dir=out_dir, env=env)
    assert not job.hung, f"{spec} on {nprocs} processes hung for {timeout} s:\n{job.logs()}"
    bad = [r for r, c in enumerate(job.codes) if (c != 0) != (r in killed)]
    assert not bad, f"{spec}: rank(s) {bad} exited wrongly:\n{job.logs()}"
    return {(name, world): [None if rank in killed else _result(out_dir, name, world, rank)
                            for rank in range(world)]
            for name, world in phases}


def _result(out_dir: str, name: str, world: int, rank: int) -> dict[str, Any]:
    with open(os.path.join(out_dir, f"{name}-w{world}-r{rank}.json")) as f:
        return json.load(f)


JAX_WORKER = os.path.join(TESTS, "jax", "jax_dist_worker.py")


def run_jax(nprocs: int, devices: int, scenarios: Sequence[str], out_dir: str, *, timeout: float = 120,
            killed: Sequence[int] = ()) -> dict[str, list[dict[str, Any] | None]]:
    """Runs ``scenarios`` (of ``tests/jax/jax_dist_worker.py``) in one real ``jax.distributed``
    job of ``nprocs`` processes with ``devices`` CPU devices each.

    Returns:
        ``{scenario: [result of process 0, process 1, ...]}`` (None where a process wrote none).

    Raises:
        AssertionError: a process other than ``killed`` failed, or the job hung.
    """
    os.makedirs(out_dir, exist_ok=True)
    job = run_job(JAX_WORKER, nprocs, out_dir, str(devices), ",".join(scenarios), timeout=timeout,
                  log_dir=out_dir, name="jax")
    assert not job.hung, f"{scenarios} on {nprocs} processes hung for {timeout} s:\n{job.logs()}"
    bad = [r for r, c in enumerate(job.codes) if (c != 0) != (r in killed)]
    assert not bad, f"{scenarios}: process(es) {bad} exited wrongly:\n{job.logs()}"
    return {name: [_read(os.path.join(out_dir, f"{name}-r{r}.json")) for r in range(nprocs)]
            for name in scenarios}


def _read(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)
