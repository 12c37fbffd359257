"""A TCP proxy on 127.0.0.1 that limits bandwidth, to stand in for a network link in benchmarks.

Every byte in either direction, over all connections together, passes one pacing clock per
direction (``rate`` bytes per second each way), as on a shared link: a chunk of ``n``
bytes is forwarded only when the clock has advanced ``n / rate`` seconds past the previous
chunk. Threads: one accepting, two per connection (one per direction); all are daemons
and end with ``close()``.
"""

from __future__ import annotations

import socket
import threading
import time

CHUNK = 64 << 10


class _Pace:
    """A shared clock: ``take(n)`` returns when ``n`` more bytes fit under ``rate``."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.lock = threading.Lock()
        self.free_at = time.monotonic()

    def take(self, n: int) -> None:
        with self.lock:
            start = max(self.free_at, time.monotonic())
            self.free_at = start + n / self.rate
            wait = self.free_at - time.monotonic()
        if wait > 0:
            time.sleep(wait)


class ThrottledProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target`` at ``rate`` bytes/s in each direction."""

    def __init__(self, target: tuple[str, int], rate: float) -> None:
        self.target = target
        self.up, self.down = _Pace(rate), _Pace(rate)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.closed = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, name="shardsafe-bench-proxy", daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            self.conns += [client, server]
            for src, dst, pace in ((client, server, self.up), (server, client, self.down)):
                threading.Thread(target=self._pump, args=(src, dst, pace), daemon=True,
                                 name="shardsafe-bench-proxy-pump").start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, pace: _Pace) -> None:
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                pace.take(len(data))
                dst.sendall(data)
        except OSError:  # the other side went away
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        self.closed.set()
        self.listener.close()
        for c in self.conns:
            c.close()
