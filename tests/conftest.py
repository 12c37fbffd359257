"""Shared fixtures. Tests mirror the package: tests/format, tests/plan, tests/api, ...

The S3 fixtures (``s3_server``, one moto server for the whole session, and ``s3``, a
fresh bucket on it) come from tests/s3_server.py, registered here once for every test.
"""

from __future__ import annotations

import sys

import pytest

from shardsafe.harness.processes import child_env

pytest_plugins = ["s3_server"]


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for child Python processes that must import this checkout's shardsafe."""
    return child_env()


@pytest.fixture
def python() -> str:
    return sys.executable
