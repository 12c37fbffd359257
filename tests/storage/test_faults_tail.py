"""Requests that stall behind the fault proxy cost seconds, not ``SHARDSAFE_STALL_TIMEOUT``:
a ranged GET and a multipart part upload are hedged after the learned delay, and a GET
that stops sending is cut at the stall limit learned from the store's recent requests
(the fixed timeout here is 30 s)."""

from __future__ import annotations

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import shardsafe  # noqa: E402
from shardsafe.storage import storage_for  # noqa: E402
from shardsafe.storage.fsspec import FsspecStorage  # noqa: E402

from fault_proxy import Faults, strike_once  # noqa: E402

MiB = 1 << 20



def test_a_load_whose_data_read_stalls_is_hedged(faulty_s3, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("SHARDSAFE_STALL_TIMEOUT", "30")
    loc = faulty_s3.loc
    state = {"w": torch.randn(24 * MiB // 4, generator=torch.Generator().manual_seed(3)), "step": 3}
    url = f"{loc.url}/hedged"
    shardsafe.save(state, url, storage_options=loc.storage_options, timeout=60)
    faulty_s3.proxy.faults = Faults(stall=1.0, stall_seconds=120, phase=0.3,
                                    only=strike_once(lambda m, t: m == "GET" and "/data" in t))
    t0 = time.monotonic()
    out = shardsafe.load(url, storage_options=loc.storage_options, timeout=60)
    assert time.monotonic() - t0 < 15 and faulty_s3.proxy.counts["stall"] == 1
    assert torch.equal(out["w"], state["w"]) and out["step"] == 3


def test_a_stalled_read_is_cut_at_the_learned_limit(faulty_s3, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("SHARDSAFE_STALL_TIMEOUT", "30")
    monkeypatch.setenv("SHARDSAFE_HEDGE", "0")
    storage, root = storage_for(f"{faulty_s3.loc.url}/learned", faulty_s3.loc.storage_options)
    data = np.random.default_rng(2).integers(0, 255, 16 * MiB, dtype=np.uint8)
    storage.write(f"{root}/f", [memoryview(data)])
    small = bytearray(4096)
    for i in range(10):  # the store's usual waits are learned
        storage.read_into(f"{root}/f", i * 4096, memoryview(small))
    assert storage._runner.tail.policy.stall_limit(storage._runner.tail.tracker) < 5
    faulty_s3.proxy.faults = Faults(stall=1.0, stall_seconds=120, phase=0.8,
                                    only=strike_once(lambda m, t: m == "GET" and t.endswith("/f")))
    out = bytearray(16 * MiB)
    t0 = time.monotonic()
    storage.read_into(f"{root}/f", 0, memoryview(out))
    assert time.monotonic() - t0 < 15 and faulty_s3.proxy.counts["stall"] == 1
    assert bytes(out) == data.tobytes()


def test_a_part_upload_that_stalls_is_hedged_and_leaves_no_part_behind(faulty_s3, monkeypatch) -> None:  # noqa: ANN001
    """The store stops reading part 2's body: its duplicate, sent once the part is far
    slower than its siblings, completes the upload long before the 30 s stall limit; the
    object holds the right bytes and no unfinished upload is left."""
    monkeypatch.setenv("SHARDSAFE_STALL_TIMEOUT", "30")
    storage, root = storage_for(f"{faulty_s3.loc.url}/hedged-up", faulty_s3.loc.storage_options)
    storage = FsspecStorage(storage.fs, part_size=8 * MiB, max_concurrency=3)
    data = np.random.default_rng(4).integers(0, 255, 41 * MiB, dtype=np.uint8)
    faulty_s3.proxy.faults = Faults(stall=1.0, stall_seconds=120, phase=0.05,
                                    only=strike_once(lambda m, t: m == "PUT" and "partNumber=2" in t))
    hedges = storage._runner.tail.budget.hedges
    t0 = time.monotonic()
    storage.write(f"{root}/f", [memoryview(data)])
    assert time.monotonic() - t0 < 15 and faulty_s3.proxy.counts["stall"] == 1
    assert storage._runner.tail.budget.hedges > hedges
    assert storage.read(f"{root}/f") == data.tobytes()
    assert faulty_s3.direct.filesystem().list_multipart_uploads(faulty_s3.direct.bucket) == []
