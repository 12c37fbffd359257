"""Fixtures for the storage tests: the real S3 server (see tests/s3_server.py)."""

from __future__ import annotations

from s3_server import s3, s3_server  # noqa: F401  (pytest fixtures)
