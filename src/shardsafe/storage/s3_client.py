"""How the S3 client behind an fsspec store is set up for ``storage.fsspec``: connect and
read timeouts from the stall timeout, the client's own retries off (``storage.runner``
retries instead), sockets that report progress to a ``StallWatch``, and the endpoint
named in error messages."""

from __future__ import annotations

import functools
import logging
from typing import Any

from .retry import RetryPolicy
from .stall import StallWatch

log = logging.getLogger("shardsafe")
CONNECT_TIMEOUT = 10.0  # seconds to connect, at most (less when the stall timeout is shorter)


def endpoint_of(fs: Any) -> str | None:
    """The endpoint an S3-compatible filesystem sends its requests to, when it says."""
    url = getattr(fs, "endpoint_url", None) or (getattr(fs, "client_kwargs", None) or {}).get("endpoint_url")
    return url if isinstance(url, str) else None


def s3_options(opts: dict[str, Any], policy: RetryPolicy) -> dict[str, Any]:
    """s3fs options with this backend's request handling (what the caller set wins)."""
    config = dict(opts.get("config_kwargs") or {})
    config.setdefault("connect_timeout", min(CONNECT_TIMEOUT, policy.stall_timeout))
    config.setdefault("read_timeout", policy.stall_timeout)  # aiohttp's sock_read: no byte for that long
    config.setdefault("retries", {"total_max_attempts": 1})  # storage.runner retries instead
    if takes_socket_factory():
        connector = dict(config.get("connector_args") or {})
        connector.setdefault("socket_factory", StallWatch.for_timeout(policy.stall_timeout))
        config["connector_args"] = connector
    return {**opts, "config_kwargs": config}


@functools.cache
def takes_socket_factory() -> bool:
    """Whether this aiobotocore passes a socket factory to aiohttp (2.x from 2.13 on);
    without one, uploads whose server stops reading are caught by the deadline only."""
    from aiobotocore.config import AioConfig
    from botocore.exceptions import BotoCoreError

    try:
        AioConfig(connector_args={"socket_factory": None})
    except (BotoCoreError, TypeError, ValueError):
        log.warning("this aiobotocore takes no socket factory: stalled uploads are not detected "
                    "(only the deadline ends them); upgrade aiobotocore")
        return False
    return True


def watch_of(fs: Any) -> StallWatch | None:
    config = getattr(fs, "config_kwargs", None) or {}
    watch = (config.get("connector_args") or {}).get("socket_factory")
    return watch if isinstance(watch, StallWatch) else None


__all__ = ["CONNECT_TIMEOUT", "endpoint_of", "s3_options", "takes_socket_factory", "watch_of"]
