"""Fixtures for the DCP tests: the real S3 server (see tests/s3_server.py)."""

from __future__ import annotations

import warnings

import pytest
from s3_server import s3, s3_server  # noqa: F401  (pytest fixtures)


@pytest.fixture(autouse=True)
def _one_process_dcp():  # noqa: ANN202
    """DCP warns that it saves in a single process when no group is initialised: intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
