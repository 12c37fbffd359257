"""Fixtures for CLI tests: run ``python -m shardsafe`` in a subprocess; the S3 test server."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest
from s3_server import s3, s3_server  # noqa: F401  (pytest fixtures)

Run = Callable[..., subprocess.CompletedProcess]


@pytest.fixture
def cli(subprocess_env: dict[str, str]) -> Run:
    """``cli("ls", dir, env=..., cwd=...)`` runs the command line and returns the completed process."""

    def run(*args: str, env: dict[str, str] | None = None, cwd: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
        full_env = dict(subprocess_env, **(env or {}))
        return subprocess.run([sys.executable, "-m", "shardsafe", *map(str, args)], env=full_env,
                              cwd=cwd, capture_output=True, text=True, timeout=timeout)

    return run

