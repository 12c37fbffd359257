"""``StoreChannel`` over a real TCPStore: channels share this process's connections to the store.

A collective save opens several channels (planning, commit, retention); each used to make a
connection of its own, and a connect now and then stalled the store's server for seconds.
Connections are now borrowed per operation and given back, a new one made only while every
one is busy (a blocking wait holds its own), and one whose wait timed out is dropped.
"""

from __future__ import annotations

import datetime
import threading
import time

import pytest

dist = pytest.importorskip("torch.distributed")

from shardsafe.comm import free_loopback_port  # noqa: E402
from shardsafe.comm.channel import gather  # noqa: E402
from shardsafe.comm.torch_comm import StoreChannel, _connections  # noqa: E402


@pytest.fixture()
def store():  # noqa: ANN201
    s = dist.TCPStore("127.0.0.1", free_loopback_port(), 2, True, timeout=datetime.timedelta(seconds=10),
                      wait_for_workers=False)
    yield s


def test_channels_reuse_one_connection(store) -> None:  # noqa: ANN001
    for save in range(20):  # a channel per save, as a job of many saves makes
        a, b = (StoreChannel(store, r, 2, prefix=f"save{save}/") for r in (0, 1))
        gather(b, "chunks", b"R1", timeout=5)
        assert gather(a, "chunks", b"R0", timeout=5) == [b"R0", b"R1"]
    assert len(_connections(store).idle) == 1  # every operation borrowed the same one
    assert StoreChannel(store, 0, 2, prefix="x/").wait(["never"], 0.01) == [False]  # polled after the wait


def test_a_blocking_wait_holds_its_own_connection_and_a_timed_out_one_is_dropped(store) -> None:  # noqa: ANN001
    ch = StoreChannel(store, 0, 2, prefix="w/")
    pool = _connections(store)
    got: list[list[bool]] = []
    waiter = threading.Thread(target=lambda: got.append(ch.wait(["late"], 10)))
    waiter.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    ch.set("other", b"1")  # does not wait behind the blocking wait
    assert time.monotonic() - t0 < 2
    ch.set("late", b"1")
    waiter.join(10)
    assert got == [[True]] and len(pool.idle) == 2  # two were in use at once; both given back
    before = len(pool.idle)
    assert ch.wait(["never"], 0.3) == [False]
    assert len(pool.idle) == before - 1  # the timed-out connection is dropped (the check's is given back)
