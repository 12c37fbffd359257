"""shardsafe.comm: byte collectives and store channels on a real 3-rank gloo group."""

from __future__ import annotations

import threading
import time

import pytest

from shardsafe.comm import LocalChannel, SingleProcessComm, distributed_active, get_comm
from shardsafe.comm.channel import announce, gather, get, missing_ranks, receive
from shardsafe.errors import CheckpointTimeoutError


def test_world_size_one_needs_no_process_group() -> None:
    assert not distributed_active()
    comm = get_comm()
    assert isinstance(comm, SingleProcessComm) and (comm.rank, comm.world_size) == (0, 1)
    assert comm.gather_bytes(b"x") == [b"x"] and comm.broadcast_bytes(b"y") == b"y"
    obj = {"a": (1, 2)}
    assert comm.gather(obj) == [obj] and comm.broadcast(obj) is obj
    assert gather(comm.channel("ns"), "k", b"v", timeout=1) == [b"v"]


def test_local_channel_gather_waits_for_every_rank_with_a_bound() -> None:
    shared: dict[str, bytes] = {}
    cond = threading.Condition()
    chans = [LocalChannel(r, 3, shared, cond) for r in range(3)]
    gather(chans[1], "k", b"one", timeout=5)
    late = threading.Timer(0.2, lambda: gather(chans[2], "k", b"two", timeout=5))
    late.start()
    assert gather(chans[0], "k", b"zero", timeout=5) == [b"zero", b"one", b"two"]
    late.join()
    assert shared == {}  # gathered keys are deleted
    gather(chans[1], "k2", b"one", timeout=5)
    t0 = time.monotonic()
    got = gather(chans[0], "k2", b"zero", timeout=0.3)
    assert got == [b"zero", b"one", None] and missing_ranks(got) == [2]  # rank 2 never sent
    assert 0.3 <= time.monotonic() - t0 < 2
    with pytest.raises(CheckpointTimeoutError):
        get(chans[0], "absent", timeout=0.05)


def test_announce_waits_until_every_reader_has_the_verdict() -> None:
    shared: dict[str, bytes] = {}
    cond = threading.Condition()
    chans = [LocalChannel(r, 3, shared, cond) for r in range(3)]
    got: list[bytes] = []
    readers = [threading.Thread(target=lambda c=c: got.append(receive(c, "v", timeout=5)))
               for c in chans[1:]]
    for t in readers:
        t.start()
    assert announce(chans[0], "v", b"ok", [1, 2], timeout=5)
    for t in readers:
        t.join()
    assert got == [b"ok", b"ok"] and shared == {}
    assert not announce(chans[0], "w", b"ok", [1], timeout=0.1)  # nobody reads: bounded


def test_collectives_and_background_store_gather_on_three_ranks(cluster) -> None:  # noqa: ANN001
    results = cluster[1][("comm", 3)]
    for rank, r in enumerate(results):
        assert r["gather_ok"], rank
        assert r["bcast"] == "hellohellohello"
        assert r["json"] == {"x": [1, 2.5, None, "s"]}
        assert r["allreduce"] == 150.0  # training collectives ran while the thread gathered
        assert 0.5 <= r["timeout"] < 3.0
    assert results[0]["jgather"] == [{"r": 0}, {"r": 1}, {"r": 2}]
    assert results[0]["bg_gather"] == ["rank0", "rank1", "rank2"]
    assert results[1]["jgather"] is None and results[1]["bg_gather"] is None
