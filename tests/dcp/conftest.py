"""Fixtures for the DCP tests."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _one_process_dcp() -> Iterator[None]:
    """DCP warns that it saves in a single process when no group is initialised: intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
