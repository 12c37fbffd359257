"""Fuzz: random seeded damage to real checkpoints through load,
load(mmap=True), in-place load, ``verify`` and CheckpointManager.restore. Only
CheckpointError comes out (restore falls back), each case within a time bound, and the
whole run in a child process limited to 4 GiB of address space (bounded memory).
The cases themselves live in fuzz_cases.py (they run in that child)."""

from __future__ import annotations

import os
import resource
import subprocess

import pytest

CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_cases.py")
MEMORY = 4 << 30


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def _fuzz(tmp_path, python: str, env: dict, seed: int, cases: int, version: int, timeout: int) -> None:
    r = subprocess.run([python, CASES, str(tmp_path), str(seed), str(cases), str(version)], env=env,
                       capture_output=True, text=True, timeout=timeout, preexec_fn=_limit_memory)
    assert r.returncode == 0 and f"{cases} cases, 0 violations" in r.stdout, (r.stdout[-8000:],
                                                                               r.stderr[-4000:])


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_fuzzed_checkpoints_raise_only_checkpoint_errors(tmp_path, python, subprocess_env, version) -> None:
    _fuzz(tmp_path, python, subprocess_env, seed=20261124 + version, cases=120, version=version,
          timeout=240)


@pytest.mark.stress
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_fuzzed_checkpoints_stress(tmp_path, python, subprocess_env, version, seed) -> None:
    _fuzz(tmp_path, python, subprocess_env, seed=1000 * seed + version, cases=1000, version=version,
          timeout=1800)
