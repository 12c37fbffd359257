"""storage.retry: which failures are retried, after how long (tables), and the deadline."""

from __future__ import annotations

import email.utils
import pickle
import random
import time

import pytest

from shardsafe import CheckpointError, CheckpointTimeoutError
from shardsafe.errors import StorageRequestError
from shardsafe.storage import Deadline
from shardsafe.storage.retry import RetryPolicy, classify, retry_after

aiohttp = pytest.importorskip("aiohttp")
botocore_exceptions = pytest.importorskip("botocore.exceptions")
s3fs_errors = pytest.importorskip("s3fs.errors")


def _client_error(status: int, code: str, headers: dict | None = None) -> Exception:
    response = {"Error": {"Code": code, "Message": "m"},
                "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": headers or {}}}
    return botocore_exceptions.ClientError(response, "PutObject")


@pytest.mark.parametrize("error, kind, after", [
    (_client_error(503, "SlowDown", {"retry-after": "3"}), "throttled (503 SlowDown)", 3.0),
    (_client_error(429, "TooManyRequests"), "throttled (429 TooManyRequests)", None),
    (_client_error(500, "InternalError"), "server error (500 InternalError)", None),
    (_client_error(503, "503"), "throttled (503)", None),  # a HEAD: no body, no code
    (_client_error(400, "RequestTimeout"), "server error (400 RequestTimeout)", None),
    (aiohttp.ClientPayloadError("Response payload is not completed"), "cut short", None),
    (aiohttp.ServerDisconnectedError(), "connection lost", None),
    (botocore_exceptions.ReadTimeoutError(endpoint_url="http://x"), "timed out", None),
    (botocore_exceptions.EndpointConnectionError(endpoint_url="http://x"), "connection lost", None),
    (ConnectionResetError(104, "reset"), "connection lost", None),
    (TimeoutError("socket"), "timed out", None),
])
def test_transient_failures_are_retried(error: Exception, kind: str, after: float | None) -> None:
    t = classify(error)
    assert t is not None and t.kind == kind and t.retry_after == after


@pytest.mark.parametrize("error", [
    _client_error(404, "NoSuchKey"), _client_error(403, "AccessDenied"), _client_error(400, "InvalidArgument"),
    FileNotFoundError("x"), PermissionError("x"), ValueError("x"),
    botocore_exceptions.NoCredentialsError(),
    CheckpointTimeoutError("deadline"),  # final, although a TimeoutError
    StorageRequestError("out of attempts"),  # final, although an OSError
])
def test_other_failures_are_not(error: Exception) -> None:
    assert classify(error) is None


def test_translated_errors_are_classified_through_their_cause() -> None:
    """s3fs turns a ClientError into an OSError whose cause is the ClientError."""
    e = s3fs_errors.translate_boto_error(_client_error(503, "SlowDown", {"retry-after": "1"}))
    assert isinstance(e, OSError) and classify(e).retry_after == 1.0
    wrapped = OSError("outer")
    wrapped.__cause__ = aiohttp.ClientPayloadError("cut")
    assert classify(wrapped).kind == "cut short"


def test_retry_after_seconds_and_dates() -> None:
    now = time.time()
    assert retry_after("7") == 7.0 and retry_after(" 0 ") == 0.0 and retry_after(None) is None
    assert retry_after("soon") is None
    assert retry_after(email.utils.formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30, abs=1)
    assert retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0


def test_backoff_is_jittered_exponential_and_honours_retry_after() -> None:
    p = RetryPolicy(base_delay=0.5, max_delay=4.0, max_retry_after=10.0)
    rng = random.Random(1)
    for retry, cap in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (10, 4.0), (200, 4.0)]:
        draws = [p.delay(retry, rng=rng) for _ in range(200)]
        assert 0 <= min(draws) and max(draws) <= cap and max(draws) > 0.8 * cap  # full jitter
        assert len(set(draws)) > 150  # ranks throttled together do not retry together
    assert all(3.0 <= p.delay(0, 3.0, rng) <= 3.05 for _ in range(50))
    assert 10.0 <= p.delay(5, 600.0, rng) <= 10.4  # an absurd Retry-After is capped


@pytest.mark.parametrize("kw", [dict(attempts=0), dict(base_delay=0), dict(base_delay=5, max_delay=1),
                                dict(stall_timeout=0)])
def test_invalid_policies_are_refused(kw: dict) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kw)


def test_deadline_error_names_rank_file_and_request() -> None:
    d = Deadline(0.05, rank=3, what="save to s3://b/c")
    assert not d.passed() and 0 < d.remaining() <= 0.05
    time.sleep(0.06)
    assert d.passed()
    e = d.error("PUT part 2/4", "b/c/data-r00003-000.safetensors", ["stalled", "connection lost"])
    assert isinstance(e, CheckpointTimeoutError) and isinstance(e, CheckpointError)
    assert (e.rank, e.file, e.request) == (3, "b/c/data-r00003-000.safetensors", "PUT part 2/4")
    assert "rank 3" in str(e) and "PUT part 2/4" in str(e) and "data-r00003" in str(e) and "stalled" in str(e)
    early = Deadline(30, rank=1).error("GET bytes 0-9", "f", ["throttled (503 SlowDown)"], retry_in=40.0)
    assert "too little to retry (in 40.0 s) GET bytes 0-9 of f" in str(early) and early.rank == 1
    back = pickle.loads(pickle.dumps(e))  # crosses processes (async jobs, the agreement)
    assert (back.rank, back.file, back.request, str(back)) == (e.rank, e.file, e.request, str(e))
    with pytest.raises(ValueError):
        Deadline(0)
