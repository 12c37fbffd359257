"""Shared fixtures. Tests mirror the package: tests/format, tests/plan, tests/api, ..."""

from __future__ import annotations

import sys

import pytest

from shardsafe.harness.processes import child_env


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for child Python processes that must import this checkout's shardsafe."""
    return child_env()


@pytest.fixture
def python() -> str:
    return sys.executable
