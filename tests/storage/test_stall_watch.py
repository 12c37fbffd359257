"""storage.stall: a connection whose sends stop making progress is cut; a slow one or an
idle one is not. Real TCP sockets on 127.0.0.1, driven by a real asyncio transport."""

from __future__ import annotations

import asyncio
import socket
import time

from shardsafe.storage.stall import StallWatch


async def _connect(watch: StallWatch, port: int) -> tuple[asyncio.Transport, asyncio.Protocol]:
    loop = asyncio.get_running_loop()
    sock = watch((socket.AF_INET, socket.SOCK_STREAM, 0, "", ("127.0.0.1", port)))
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    lost = loop.create_future()

    class P(asyncio.Protocol):
        def connection_lost(self, exc: Exception | None) -> None:
            if not lost.done():
                lost.set_result(exc)

    transport, proto = await loop.create_connection(P, sock=sock)
    proto.lost = lost
    return transport, proto


def _server() -> socket.socket:
    srv = socket.create_server(("127.0.0.1", 0))
    srv.listen()
    return srv


def test_a_send_that_makes_no_progress_is_cut_and_the_transport_fails() -> None:
    async def main() -> None:
        watch = StallWatch(1.0)
        srv = _server()
        transport, proto = await _connect(watch, srv.getsockname()[1])
        (sock,) = list(watch._sockets)
        peer, _ = srv.accept()  # never reads: the window shuts and the sends block
        transport.write(b"x" * (32 << 20))
        while True:
            await asyncio.sleep(0.05)
            since = sock.blocked_since
            assert since is not None
            if watch.sweep():
                break
            assert time.monotonic() - since < 1.0 + 5
        assert time.monotonic() - since >= 1.0  # cut once stalled for the timeout, not sooner
        assert await asyncio.wait_for(proto.lost, 5) is not None  # the write fails: retried above
        assert watch.cut == 1
        peer.close()
        srv.close()

    asyncio.run(main())


def test_slow_progress_and_idle_connections_are_left_alone() -> None:
    async def main() -> None:
        watch = StallWatch(0.4)
        srv = _server()
        transport, proto = await _connect(watch, srv.getsockname()[1])
        peer, _ = srv.accept()
        peer.setblocking(False)
        transport.write(b"y" * (16 << 20))
        got = 0
        t0 = time.monotonic()
        while got < 16 << 20:  # the peer reads a little every 0.1 s: slow, but progress
            await asyncio.sleep(0.1)
            try:
                got += len(peer.recv(4 << 20))
            except BlockingIOError:
                pass
            assert watch.sweep() == 0
            assert time.monotonic() - t0 < 60
        await asyncio.sleep(0.6)  # everything sent: an idle connection is never cut
        assert watch.sweep() == 0 and not proto.lost.done()
        transport.close()
        peer.close()
        srv.close()

    asyncio.run(main())


def test_one_watch_per_timeout_with_a_stable_repr() -> None:
    """fsspec caches a filesystem per options: equal settings must give an equal token."""
    a, b = StallWatch.for_timeout(7.5), StallWatch.for_timeout(7.5)
    assert a is b and repr(a) == "StallWatch(7.5)" and StallWatch.for_timeout(8.0) is not a
