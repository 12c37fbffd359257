"""A real S3-compatible server for tests: moto in server mode on 127.0.0.1, its own port.

tests/conftest.py registers this module as a plugin, so every test may ask for the fixtures:
``s3_server`` (session) runs one ``python -m moto.server`` subprocess; ``s3`` (per test)
creates a fresh bucket and yields an :class:`S3Location` holding its URL, the
``storage_options`` for fsspec/s3fs and environment variables for child processes;
``faulty_s3`` (per test) puts a fault-injecting proxy (tests/fault_proxy.py) in front of
the server and yields a :class:`FaultyS3`. Everything talks to the server through the
real s3fs/botocore client over HTTP.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from fault_proxy import FaultProxy
from shardsafe.harness import moto_server

KEY = "shardsafe-test-key"
SECRET = "shardsafe-test-secret"
REGION = "us-west-2"  # not us-east-1: s3fs sends it as a LocationConstraint, which S3 rejects


@dataclass(frozen=True)
class S3Location:
    """A fresh bucket on the test server.

    Attributes:
        url: ``s3://<bucket>``; append ``/run1`` etc.
        storage_options: fsspec options reaching the test server.
        endpoint: The server's ``http://127.0.0.1:<port>``.
        env: Variables that make a child process's s3fs/botocore reach the server.
    """

    url: str
    storage_options: dict
    endpoint: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def bucket(self) -> str:
        return self.url[len("s3://"):]

    def options_json(self) -> str:
        """``storage_options`` as JSON, for the CLI's ``--storage-options``."""
        return json.dumps(self.storage_options)

    def filesystem(self):  # noqa: ANN201 - s3fs.S3FileSystem, imported lazily
        """A fresh s3fs client (no instance or listings cache) for inspecting the bucket."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False,
                                 **self.storage_options)

    def kill_during_upload(self, child: subprocess.Popen, timeout: float = 120) -> None:
        """SIGKILLs ``child`` while one of its multipart uploads is in progress."""
        fs = self.filesystem()
        try:
            deadline = time.monotonic() + timeout
            while not fs.list_multipart_uploads(self.bucket):  # parts are going up right now
                assert child.poll() is None, "child exited before its upload started"
                assert time.monotonic() < deadline, "no multipart upload seen"
                time.sleep(0.02)
            os.kill(child.pid, signal.SIGKILL)
            child.wait(30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(30)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Runs moto's S3 server in a subprocess; yields its endpoint URL."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    # the server logs every request: to a file, since an unread pipe would fill and block it
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with open(log, "wb") as out:
        started = moto_server.start(out)
        if started is None:
            pytest.fail(f"moto server did not start: {log.read_text(errors='replace')[-2000:]}")
        proc, endpoint = started
        try:
            yield endpoint
        finally:
            moto_server.stop(proc)


@pytest.fixture
def s3(s3_server: str) -> Iterator[S3Location]:
    """A fresh, empty bucket on the test server."""
    opts = {"endpoint_url": s3_server, "key": KEY, "secret": SECRET,
            "client_kwargs": {"region_name": REGION}}
    env = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": REGION,
           "AWS_ENDPOINT_URL": s3_server, "NO_PROXY": "127.0.0.1,localhost",
           "no_proxy": "127.0.0.1,localhost"}
    loc = S3Location(f"s3://test-{uuid.uuid4().hex[:12]}", opts, s3_server, env)
    loc.filesystem().mkdir(loc.bucket)
    yield loc


@dataclass(frozen=True)
class FaultyS3:
    """A fresh bucket reached through a fault-injecting proxy.

    Attributes:
        loc: The bucket through the proxy (what the code under test uses).
        direct: The same bucket without the proxy (for inspecting it).
        proxy: The proxy; set ``proxy.faults`` to inject faults.
    """

    loc: S3Location
    direct: S3Location
    proxy: FaultProxy


STALL_TIMEOUT = "2"  # seconds without progress before a request is retried, in these tests


@pytest.fixture
def faulty_s3(s3: S3Location, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultyS3]:
    """``s3`` behind a ``FaultProxy`` (no faults until the test sets them); requests that
    make no progress for ``STALL_TIMEOUT`` seconds are retried."""
    monkeypatch.setenv("SHARDSAFE_STALL_TIMEOUT", STALL_TIMEOUT)
    proxy = FaultProxy(s3.endpoint).start()
    opts = {**s3.storage_options, "endpoint_url": proxy.endpoint}
    env = {**s3.env, "AWS_ENDPOINT_URL": proxy.endpoint, "SHARDSAFE_STALL_TIMEOUT": STALL_TIMEOUT}
    try:
        yield FaultyS3(S3Location(s3.url, opts, proxy.endpoint, env), s3, proxy)
    finally:
        proxy.stop()
