"""A fault-injecting HTTP proxy in front of the test S3 server (tests/s3_server.py).

``FaultProxy(upstream).start()`` listens on a free 127.0.0.1 port and relays every
HTTP/1.1 request of its clients to the upstream server, one request at a time per
client connection (keep-alive towards the client; moto closes after each response, so
each request gets a fresh upstream connection). Per request, with the probabilities of
its ``Faults`` (decided by one seeded generator), it instead:

* **throttle**: reads the request and answers ``503 SlowDown`` with ``Retry-After``
  (what S3 says when hundreds of ranks PUT or LIST at once);
* **reset**: drops the connection with a TCP RST, before, while or after the request
  reaches the server (so the server may or may not have acted on it);
* **early_eof**: relays the request, then sends only part of the response and closes;
* **stall**: stops passing anything on, in either direction, for ``stall_seconds``
  (accepting nothing more from the client, whose sends then block), at a random point
  of the request or the response; then drops the connection.

``outage(seconds)`` (or ``Faults.outage_on``, at a given request) plays a server killed
and restarted: every open connection is reset, new ones are refused (the port is
closed), and after ``seconds`` it listens again on the same port. ``counts`` says what was injected, ``max_inflight`` how many
requests were in flight at most. Everything runs on one
asyncio loop in a daemon thread; the proxy keeps no state of its own beyond that.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

KINDS = ("throttle", "reset", "early_eof", "stall")
RECEIVE_BUFFER = 64 << 10  # bytes the proxy takes from a client before it stops reading
SLOW_DOWN = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>"
             b"<Message>Please reduce your request rate.</Message></Error>")


@dataclass
class Faults:
    """What the proxy injects, per request (probabilities in [0, 1], summing to <= 1).

    ``only(method, target)`` limits faults to the requests it accepts (e.g. the uploads of
    one rank's file); the others are relayed untouched.
    """

    throttle: float = 0.0
    reset: float = 0.0
    early_eof: float = 0.0
    stall: float = 0.0
    stall_seconds: float = 120.0
    retry_after: int = 1
    only: Callable[[str, str], bool] | None = None
    outage_on: Callable[[str, str], bool] | None = None
    """A request it accepts starts an ``outage`` of ``outage_seconds`` (that request is lost)."""
    outage_seconds: float = 2.0
    phase: float | None = None
    """Where a reset, stall or early EOF strikes: below 0.5 while the request arrives (at
    that fraction of twice its body), from 0.5 while the response goes out; None: at random."""

    def pick(self, rng: random.Random, method: str, target: str) -> str | None:
        if self.only is not None and not self.only(method, target):
            return None
        x = rng.random()
        for kind in KINDS:
            x -= getattr(self, kind)
            if x < 0:
                return kind
        return None


@dataclass
class _Request:
    method: str
    target: str
    head: bytes
    body: bytes = b""
    expect_continue: bool = False
    headers: dict[str, str] = field(default_factory=dict)


class _Dropped(Exception):
    """The client connection was dropped on purpose (a fault) or by the client."""


class FaultProxy:
    """The proxy; see the module docstring. ``endpoint`` once started."""

    def __init__(self, upstream: str, faults: Faults | None = None, seed: int = 0) -> None:
        host, port = upstream.rsplit("//", 1)[-1].rsplit(":", 1)
        self.upstream = (host, int(port))
        self.faults = faults or Faults()
        self.counts: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._clients: set[asyncio.StreamWriter] = set()
        self.port = 0
        self._inflight = 0
        self.max_inflight = 0  # most requests relayed at once

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ control
    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def stop(self) -> None:
        """Closes every connection, ends the relaying (stalls included) and the thread."""
        if not self._thread.is_alive():
            return
        self._call(self._close_all())
        self._call(self._cancel_tasks())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def outage(self, seconds: float) -> None:
        """Resets every connection and refuses new ones for ``seconds`` (returns at once)."""
        self._call(self._outage(seconds))

    async def _outage(self, seconds: float) -> None:
        self.counts["outage"] += 1
        await self._close_all()
        self._loop.call_later(seconds, lambda: asyncio.ensure_future(self._listen()))

    def _call(self, coro) -> None:  # noqa: ANN001 - a coroutine
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    async def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # a server's receive window, not loopback's many megabytes: a stall that stops
        # reading a body then blocks the client's sends, as it does across a network
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        sock.bind(("127.0.0.1", self.port))
        self._server = await asyncio.start_server(self._serve, sock=sock, limit=RECEIVE_BUFFER)
        self.port = sock.getsockname()[1]

    async def _cancel_tasks(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _close_all(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._clients):
            _reset(w)

    # ------------------------------------------------------------------ relaying
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._clients.add(writer)
        try:
            while True:
                req = await _read_head(reader)
                if req is None:
                    return
                self.counts["requests"] += 1
                self._inflight += 1
                self.max_inflight = max(self.max_inflight, self._inflight)
                down = self.faults.outage_on
                if down is not None and down(req.method, req.target):
                    self._inflight -= 1
                    await self._outage(self.faults.outage_seconds)
                    raise _Dropped
                kind = self.faults.pick(self._rng, req.method, req.target)
                if kind is not None:
                    self.counts[kind] += 1
                try:
                    await self._one(req, kind, reader, writer)
                finally:
                    self._inflight -= 1
        except (_Dropped, ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # a fault, the client leaving, or the proxy stopping
        finally:
            self._clients.discard(writer)
            if not writer.is_closing():
                writer.close()

    async def _one(self, req: _Request, kind: str | None, reader: asyncio.StreamReader,
                   writer: asyncio.StreamWriter) -> None:
        rng, f = self._rng, self.faults
        phase = rng.random() if f.phase is None else f.phase
        if req.expect_continue:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if kind in ("reset", "stall") and phase < 0.5:
            # before or while the request arrives: part of the body is read, then nothing
            await _read_body(reader, req, fraction=phase * 2)
            if kind == "stall":
                await asyncio.sleep(f.stall_seconds)
            _reset(writer)
            raise _Dropped
        await _read_body(reader, req)
        if kind == "throttle":
            writer.write(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                         b"Retry-After: %d\r\nContent-Length: %d\r\n\r\n%s"
                         % (f.retry_after, len(SLOW_DOWN), SLOW_DOWN))
            await writer.drain()
            return
        status_head, body = await self._forward(req)
        if kind == "reset":  # the server acted on the request; the client never hears back
            _reset(writer)
            raise _Dropped
        data = status_head + body
        # at least the last byte is held back: a response without a body is cut in its head
        cut = min(len(status_head) + int(max(0.0, phase - 0.5) * 2 * len(body)), len(data) - 1)
        if kind == "early_eof":
            writer.write(data[:cut])
            await writer.drain()
            writer.close()
            raise _Dropped
        if kind == "stall":
            writer.write(data[:cut])
            await writer.drain()
            await asyncio.sleep(f.stall_seconds)
            _reset(writer)
            raise _Dropped
        writer.write(data)
        await writer.drain()

    async def _forward(self, req: _Request) -> tuple[bytes, bytes]:
        """Relays ``req`` on a fresh upstream connection; the response head (rewritten for
        keep-alive) and body."""
        up_r, up_w = await asyncio.open_connection(*self.upstream, limit=1 << 20)
        try:
            up_w.write(req.head + req.body)
            await up_w.drain()
            raw = await up_r.read()
        finally:
            up_w.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        headers = [ln for ln in lines[1:] if ln.split(b":", 1)[0].strip().lower()
                   not in (b"connection", b"transfer-encoding", b"content-length")]
        original = _header(lines[1:], b"content-length")
        if _header(lines[1:], b"transfer-encoding") == b"chunked":
            body = _dechunk(body)
        length = original if req.method == "HEAD" and original is not None else str(len(body)).encode()
        if req.method == "HEAD":
            body = b""
        out = b"\r\n".join([lines[0], *headers, b"Content-Length: " + length]) + b"\r\n\r\n"
        return out, body


# ---------------------------------------------------------------------- HTTP framing
async def _read_head(reader: asyncio.StreamReader) -> _Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise
        return None
    lines = head[:-4].split(b"\r\n")
    method, target, _ = lines[0].decode("latin-1").split(" ", 2)
    headers = {}
    kept = [lines[0]]
    for ln in lines[1:]:
        k, _, v = ln.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
        if k.strip().lower() not in ("expect", "connection"):
            kept.append(ln)
    kept.append(b"Connection: close")
    return _Request(method, target, b"\r\n".join(kept) + b"\r\n\r\n",
                    expect_continue=headers.get("expect", "").lower() == "100-continue", headers=headers)


async def _read_body(reader: asyncio.StreamReader, req: _Request, fraction: float = 1.0) -> None:
    """Reads the request body (``fraction`` of it, for a fault striking mid-upload)."""
    if req.headers.get("transfer-encoding", "").lower() == "chunked":
        if fraction < 1.0:
            await reader.read(1 << 16)
            return
        req.body = await _read_chunked(reader)
        return
    n = int(req.headers.get("content-length", "0") or 0)
    want = n if fraction >= 1.0 else int(n * fraction)
    req.body = await reader.readexactly(want) if want else b""


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    """The raw bytes of a chunked body (relayed as they are, chunk framing included)."""
    out = bytearray()
    while True:
        line = await reader.readuntil(b"\r\n")
        out += line
        size = int(line.split(b";", 1)[0], 16)
        if size == 0:
            while True:  # trailers up to the empty line
                t = await reader.readuntil(b"\r\n")
                out += t
                if t == b"\r\n":
                    return bytes(out)
        out += await reader.readexactly(size + 2)


def _dechunk(data: bytes) -> bytes:
    out, pos = bytearray(), 0
    while True:
        end = data.index(b"\r\n", pos)
        size = int(data[pos:end].split(b";", 1)[0], 16)
        if size == 0:
            return bytes(out)
        out += data[end + 2:end + 2 + size]
        pos = end + 2 + size + 2


def _header(lines: list[bytes], name: bytes) -> bytes | None:
    for ln in lines:
        k, _, v = ln.partition(b":")
        if k.strip().lower() == name:
            return v.strip()
    return None


def _reset(writer: asyncio.StreamWriter) -> None:
    """Drops the connection with a TCP RST (SO_LINGER 0), as a crashed peer or a load
    balancer does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


def strike_once(match):  # noqa: ANN001, ANN201
    """A ``Faults.only`` (or ``outage_on``) predicate that strikes the first request
    ``match(method, target)`` accepts, and no other."""
    hits = []

    def only(method: str, target: str) -> bool:
        if not hits and match(method, target):
            hits.append(target)
            return True
        return False

    return only
