"""A moto S3 server on loopback in a subprocess, for benchmarks and the test suite.

``start`` runs ``python -m moto.server`` on a free 127.0.0.1 port and waits until it
answers; ``stop`` ends it. Needs the ``moto[server]`` package (extra ``dev``).
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import IO

from ..comm import free_loopback_port
from .processes import child_env

START_TIMEOUT = 90.0  # moto imports slowly on a busy 2-core machine


def start(out: IO[bytes] | int = subprocess.DEVNULL, attempts: int = 3,
          timeout: float = START_TIMEOUT) -> tuple[subprocess.Popen, str] | None:
    """The running server process and its ``http://127.0.0.1:<port>``, or None if it
    did not start in ``attempts`` tries (the free port can be taken between probe and bind).

    The server logs every request to ``out``: a file, never an unread pipe (which would
    fill and block it).
    """
    env = child_env(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    for _ in range(attempts):
        port = free_loopback_port()
        endpoint = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
        if _ready(proc, endpoint, timeout):
            return proc, endpoint
        stop(proc)
    return None


def stop(proc: subprocess.Popen) -> None:
    """Ends the server (terminate, then kill if it lingers)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _ready(proc: subprocess.Popen, endpoint: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # the server answered
        except OSError:  # URLError, ConnectionError and TimeoutError are OSErrors
            time.sleep(0.2)
    return False
