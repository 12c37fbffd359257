"""Fixtures for CLI tests: run ``python -m shardsafe`` in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

Run = Callable[..., subprocess.CompletedProcess]


@pytest.fixture
def cli(subprocess_env: dict[str, str]) -> Run:
    """``cli("ls", dir, env=..., cwd=...)`` runs the command line and returns the completed process.

    ``env`` adds variables to the child's environment; a value of None removes one.
    """

    def run(*args: str, env: dict[str, str | None] | None = None, cwd: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
        merged = {**subprocess_env, **(env or {})}
        full_env = {k: v for k, v in merged.items() if v is not None}
        return subprocess.run([sys.executable, "-m", "shardsafe", *map(str, args)], env=full_env,
                              cwd=cwd, capture_output=True, text=True, timeout=timeout)

    return run

