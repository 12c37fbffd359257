"""Shared fixtures. Tests mirror the package: tests/format, tests/plan, tests/api, ..."""

from __future__ import annotations

import os
import sys

import pytest

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for child Python processes that must import this checkout's shardsafe."""
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@pytest.fixture
def python() -> str:
    return sys.executable
