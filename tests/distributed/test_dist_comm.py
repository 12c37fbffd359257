"""shardsafe.comm: byte collectives and store channels on a real 3-rank gloo group."""

from __future__ import annotations

import threading
import time

import pytest

from shardsafe.comm import LocalChannel, SingleProcessComm, distributed_active, get_comm
from shardsafe.errors import CheckpointTimeoutError


def test_world_size_one_needs_no_process_group() -> None:
    assert not distributed_active()
    comm = get_comm()
    assert isinstance(comm, SingleProcessComm) and (comm.rank, comm.world_size) == (0, 1)
    assert comm.gather_bytes(b"x") == [b"x"] and comm.broadcast_bytes(b"y") == b"y"
    obj = {"a": (1, 2)}
    assert comm.gather(obj) == [obj] and comm.broadcast(obj) is obj
    assert comm.channel("ns").gather("k", b"v", timeout=1) == [b"v"]


def test_local_channel_gather_waits_for_every_rank_with_a_bound() -> None:
    shared: dict[str, bytes] = {}
    cond = threading.Condition()
    chans = [LocalChannel(r, 3, shared, cond) for r in range(3)]
    chans[1].gather("k", b"one", timeout=5)
    late = threading.Timer(0.2, lambda: chans[2].gather("k", b"two", timeout=5))
    late.start()
    assert chans[0].gather("k", b"zero", timeout=5) == [b"zero", b"one", b"two"]
    late.join()
    assert shared == {}  # gathered keys are deleted
    chans[1].gather("k2", b"one", timeout=5)
    t0 = time.monotonic()
    assert chans[0].gather("k2", b"zero", timeout=0.3) == [b"zero", b"one", None]  # rank 2 absent
    assert 0.3 <= time.monotonic() - t0 < 2
    assert chans[0].add("n", 2) == 2 and chans[1].add("n", 1) == 3 and chans[2].add("n", 0) == 3
    with pytest.raises(CheckpointTimeoutError):
        chans[0].get("absent", timeout=0.05)


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
