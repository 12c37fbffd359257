"""When a request to an object store is retried, and after how long (pure decisions).

Object stores throttle (``503 SlowDown``, ``429``), fail transiently (``500``, ``502``,
``504``), reset connections, cut responses short and time out. Each of these is a
``Transient`` failure: the request is tried again, up to ``RetryPolicy.attempts`` times
in all, after an exponential backoff with full jitter (a uniform draw in
``[0, min(max_delay, base_delay * 2**n))``, so that ranks throttled together do not
retry together), and never sooner than the server's ``Retry-After``. Everything else
(a missing object, a refused credential, a bad request) is not retried.

``classify`` recognises the errors of s3fs/botocore/aiohttp by their class names, so
this module imports none of them.
"""

from __future__ import annotations

import email.utils
import errno
import random
import time
from dataclasses import dataclass

from .. import knobs
from ..errors import CheckpointError

# HTTP status codes and S3/GCS error codes that say "try again"
_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_RETRY_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "TooManyRequests",
                          "RequestLimitExceeded", "RequestTimeout", "InternalError",
                          "ServiceUnavailable", "BadDigest", "XAmzContentSHA256Mismatch"})

# (kind, class names): client-library errors, matched anywhere in an exception's MRO
_BY_NAME = (
    ("stalled", {"StalledRequestError"}),
    ("timed out", {"ReadTimeoutError", "ConnectTimeoutError", "ServerTimeoutError",
                   "SocketTimeoutError", "ConnectionTimeoutError", "FSTimeoutError"}),
    ("cut short", {"ClientPayloadError", "IncompleteReadError", "ResponseStreamingError",
                   "IncompleteRead", "ContentLengthError", "TransferEncodingError"}),
    ("connection lost", {"ServerDisconnectedError", "ClientOSError", "ClientConnectionError",
                         "ConnectionClosedError", "EndpointConnectionError", "HTTPClientError",
                         "ProxyConnectionError", "ClientConnectorError"}),
)


@dataclass(frozen=True, slots=True)
class Transient:
    """A failure worth retrying.

    Attributes:
        kind: What happened, in words (``throttled (503 SlowDown)``, ``connection lost``).
        retry_after: Seconds the server asked us to wait (``Retry-After``), if it did.
    """

    kind: str
    retry_after: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How one request is retried (the per-request budget) and when it counts as stalled."""

    attempts: int = 10
    """Tries per request, the first included."""
    base_delay: float = 0.2
    """Upper bound of the first backoff draw (seconds); it doubles with every retry."""
    max_delay: float = 20.0
    """Largest backoff draw (seconds)."""
    max_retry_after: float = 60.0
    """A longer ``Retry-After`` is shortened to this (a request has a deadline anyway)."""
    stall_timeout: float = 30.0
    """Seconds a request may make no progress (no byte sent or received) before it is
    abandoned and retried."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {self.attempts}")
        if not (0 < self.base_delay <= self.max_delay):
            raise ValueError(f"need 0 < base_delay <= max_delay, got {self.base_delay}, {self.max_delay}")
        if self.stall_timeout <= 0:
            raise ValueError(f"stall_timeout must be positive, got {self.stall_timeout}")

    @classmethod
    def from_knobs(cls) -> RetryPolicy:
        """The policy the environment asks for (``SHARDSAFE_REQUEST_ATTEMPTS``,
        ``SHARDSAFE_STALL_TIMEOUT``)."""
        return cls(attempts=knobs.request_attempts(), stall_timeout=knobs.stall_timeout())

    def delay(self, retry: int, retry_after: float | None = None,
              rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (0 for the first retry)."""
        draw = (rng or _RNG).uniform(0.0, min(self.max_delay, self.base_delay * 2.0 ** min(retry, 30)))
        if retry_after is None:
            return draw
        # honour the server, plus a little jitter so that its clients do not come back at once
        return min(retry_after, self.max_retry_after) + draw * 0.1


_RNG = random.Random()


def classify(error: BaseException) -> Transient | None:
    """The ``Transient`` failure ``error`` is (looking through its causes), or None when
    retrying cannot help (a ``CheckpointError``, such as a passed deadline, is final)."""
    if isinstance(error, CheckpointError):
        return None
    seen = 0
    e: BaseException | None = error
    while e is not None and seen < 8:
        found = _classify_one(e)
        if found is not None:
            return found
        e = e.__cause__ or e.__context__
        seen += 1
    return None


def refused(error: BaseException) -> bool:
    """Whether ``error`` (or one of its causes) is a refused connection: nothing listens at
    the address, which a wrong endpoint gives at once and a busy server does not."""
    seen = 0
    e: BaseException | None = error
    while e is not None and seen < 8:
        if isinstance(e, ConnectionRefusedError) or getattr(e, "errno", None) == errno.ECONNREFUSED:
            return True
        if getattr(getattr(e, "os_error", None), "errno", None) == errno.ECONNREFUSED:  # aiohttp's connector
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


def _classify_one(e: BaseException) -> Transient | None:
    response = getattr(e, "response", None)
    if isinstance(response, dict) and "ResponseMetadata" in response:  # botocore ClientError
        meta = response.get("ResponseMetadata") or {}
        status = meta.get("HTTPStatusCode")
        code = str((response.get("Error") or {}).get("Code", ""))
        if status in _RETRY_STATUS or code in _RETRY_CODES:
            what = "throttled" if status in (429, 503) or code in ("SlowDown", "Throttling") else "server error"
            label = f"{status} {code}" if code and code != str(status) else f"{status}"
            return Transient(f"{what} ({label})",
                             retry_after((meta.get("HTTPHeaders") or {}).get("retry-after")))
        return None
    names = {c.__name__ for c in type(e).__mro__}
    for kind, classes in _BY_NAME:
        if names & classes:
            return Transient(kind)
    if isinstance(e, (ConnectionError, TimeoutError)):
        return Transient("timed out" if isinstance(e, TimeoutError) else "connection lost")
    return None


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header value (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


__all__ = ["RetryPolicy", "Transient", "classify", "retry_after"]
