"""Shared fixtures. Tests mirror the package: tests/format, tests/plan, tests/api, ...

The S3 fixtures (``s3_server``, one moto server for the whole session, and ``s3``, a
fresh bucket on it) come from tests/s3_server.py, registered here once for every test.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest
from helpers import run_cli

from shardsafe.harness.processes import child_env

pytest_plugins = ["s3_server"]


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for child Python processes that must import this checkout's shardsafe."""
    return child_env()


@pytest.fixture
def python() -> str:
    return sys.executable


@pytest.fixture
def tiny_tmpfs(tmp_path):  # noqa: ANN001, ANN201
    """A real 1 MiB tmpfs (a full disk or /dev/shm in miniature); skipped where mount is refused."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=True)


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess]:
    """``cli("ls", dir, env=..., cwd=...)`` runs the shardsafe command and returns the
    completed process (see ``helpers.run_cli``)."""
    return run_cli
