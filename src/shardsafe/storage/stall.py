"""Stall detection for uploads: connections whose sends made no progress are cut.

The S3 client (aiobotocore on aiohttp) bounds the wait for a *response* on its own:
its ``read_timeout`` (aiohttp's ``sock_read``) fires when no byte arrives for that
long, and ``connect_timeout`` bounds connecting; ``FsspecStorage`` sets both to the
stall timeout. Nothing bounds *sending* a request body: aiohttp starts the read
timeout only once the body is sent, so a server that stops reading (its TCP window
stays shut) leaves an upload waiting for ever.

``StallWatch`` closes that gap at the socket level. It is aiohttp's ``socket_factory``
(``AioConfig(connector_args={"socket_factory": ...})``): every connection the client
opens is a ``WatchedSocket``, which notes when a send could not hand all its bytes to
the kernel and when one could (any accepted byte is progress). ``sweep()`` shuts down
each socket that has had unsent bytes and no progress for ``stall_timeout`` seconds;
the request on it then fails as a lost connection and is retried. The sweep runs in
the requests' own waits (``storage.runner``), on the event loop that owns the
sockets, so the watch needs no thread. An idle pooled connection has nothing unsent
and is never cut.
"""

from __future__ import annotations

import logging
import socket
import time
import weakref
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("shardsafe")


class WatchedSocket(socket.socket):
    """A TCP socket that records whether its sends are making progress."""

    __slots__ = ("blocked_since",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.blocked_since: float | None = None

    def _sent(self, n: int, offered: int) -> int:
        # a partial send made progress: the wait for the rest starts now
        self.blocked_since = time.monotonic() if n < offered else None
        return n

    def _blocked(self) -> None:
        if self.blocked_since is None:
            self.blocked_since = time.monotonic()

    def send(self, data: Any, flags: int = 0) -> int:  # type: ignore[override]
        try:
            n = super().send(data, flags)
        except (BlockingIOError, InterruptedError):
            self._blocked()
            raise
        return self._sent(n, memoryview(data).nbytes)

    def sendmsg(self, buffers: Sequence[Any], *args: Any) -> int:  # type: ignore[override]
        try:
            n = super().sendmsg(buffers, *args)
        except (BlockingIOError, InterruptedError):
            self._blocked()
            raise
        return self._sent(n, sum(memoryview(b).nbytes for b in buffers))


class StallWatch:
    """aiohttp socket factory whose sockets ``sweep`` cuts when their sends stall.

    One watch per stall timeout (``for_timeout``): fsspec caches a filesystem per set of
    options, and a stable ``repr`` lets saves with the same settings share one client.
    """

    def __init__(self, stall_timeout: float) -> None:
        self.stall_timeout = stall_timeout
        self._sockets: weakref.WeakSet[WatchedSocket] = weakref.WeakSet()
        self.cut = 0  # connections cut so far

    @classmethod
    def for_timeout(cls, stall_timeout: float) -> StallWatch:
        watch = _WATCHES.get(stall_timeout)
        if watch is None:
            watch = _WATCHES[stall_timeout] = cls(stall_timeout)
        return watch

    def __repr__(self) -> str:
        return f"StallWatch({self.stall_timeout!r})"

    def __call__(self, addr_info: Any) -> socket.socket:
        family, type_, proto = addr_info[0], addr_info[1], addr_info[2]
        sock = WatchedSocket(family, type_, proto)
        self._sockets.add(sock)
        return sock

    def sweep(self, limit: float | None = None, now: float | None = None) -> int:
        """Shuts down every watched socket whose sends stalled for ``limit`` seconds (at most
        the watch's stall timeout; None: that timeout) at ``now`` (None: the monotonic clock);
        returns how many."""
        now = time.monotonic() if now is None else now
        limit = self.stall_timeout if limit is None else min(limit, self.stall_timeout)
        cut = 0
        for sock in list(self._sockets):
            since = sock.blocked_since
            if since is None or now - since < limit or sock.fileno() < 0:
                continue
            sock.blocked_since = None
            try:
                sock.shutdown(socket.SHUT_RDWR)  # the transport sees the error and fails the request
            except OSError:
                continue
            cut += 1
            log.warning("cut a connection to the object store whose upload made no progress "
                        "for %.0f s (it is retried)", now - since)
        self.cut += cut
        return cut


_WATCHES: dict[float, StallWatch] = {}


__all__ = ["StallWatch", "WatchedSocket"]
