"""Saves and loads through a store that throttles, resets, cuts responses short, stalls and
goes away: the fault-injecting proxy (tests/fault_proxy.py) in front of the moto server.

Every call either succeeds with the right values or raises a ``CheckpointError`` within
its deadline; a failed save commits nothing and leaves no multipart upload; the previous
checkpoint always loads. (The long form, 50 saves and 50 loads of 96 MiB and a 4-rank
job, is tests/storage/test_faults_stress.py.)
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import shardsafe  # noqa: E402
from shardsafe import CheckpointError, CheckpointTimeoutError  # noqa: E402
from shardsafe.errors import StorageRequestError  # noqa: E402
from shardsafe.storage import Deadline, storage_for  # noqa: E402
from shardsafe.storage.fsspec import FsspecStorage  # noqa: E402

from fault_proxy import Faults, strike_once  # noqa: E402

MiB = 1 << 20
SLACK = 10.0  # seconds past a deadline by which a call must have raised


def _state(seed: int, mib: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(mib * MiB // 8, generator=g), "b": torch.randn(mib * MiB // 8, generator=g),
            "table": np.arange(1000, dtype=np.int64) * seed, "step": seed, "name": f"run-{seed}"}


def _same(a: dict, b: dict) -> bool:
    return (torch.equal(a["w"], b["w"]) and torch.equal(a["b"], b["b"])
            and np.array_equal(a["table"], b["table"]) and (a["step"], a["name"]) == (b["step"], b["name"]))



def _committed(faulty, prefix: str) -> bool:  # noqa: ANN001
    return faulty.direct.filesystem().exists(f"{faulty.direct.bucket}/{prefix}/index.json")


def _uploads(faulty) -> list:  # noqa: ANN001
    return faulty.direct.filesystem().list_multipart_uploads(faulty.direct.bucket)


def test_saves_and_loads_through_throttling_resets_and_cut_responses(faulty_s3) -> None:  # noqa: ANN001
    loc = faulty_s3.loc
    faulty_s3.proxy.faults = Faults(throttle=0.15, reset=0.15, early_eof=0.15, retry_after=0)
    for i in range(2):
        url = f"{loc.url}/ckpt{i}"
        shardsafe.save(_state(i), url, storage_options=loc.storage_options, timeout=120)
        assert _same(shardsafe.load(url, storage_options=loc.storage_options, timeout=120), _state(i))
        if i:  # the previous checkpoint still loads
            assert _same(shardsafe.load(f"{loc.url}/ckpt{i - 1}", storage_options=loc.storage_options), _state(i - 1))
    counts = faulty_s3.proxy.counts
    assert min(counts["throttle"], counts["reset"], counts["early_eof"]) > 0, counts


def test_throttled_requests_wait_for_retry_after(faulty_s3) -> None:  # noqa: ANN001
    storage, root = storage_for(f"{faulty_s3.loc.url}/c", faulty_s3.loc.storage_options)
    hits = []

    def twice(method: str, target: str) -> bool:
        if method == "PUT" and len(hits) < 2:
            hits.append(target)
            return True
        return False

    faulty_s3.proxy.faults = Faults(throttle=1.0, retry_after=1, only=twice)
    t0 = time.monotonic()
    storage.publish(f"{root}/x", b"payload")
    assert time.monotonic() - t0 >= 2.0  # two SlowDowns of the same PUT, 1 s each
    assert faulty_s3.proxy.counts["throttle"] == 2 and storage.read(f"{root}/x") == b"payload"


def _small_parts(loc, path: str, **kw) -> tuple[FsspecStorage, str]:  # noqa: ANN001
    """The backend with small parts (8 MiB: more than the kernel buffers between client
    and proxy hold), so that multipart uploads happen at test sizes."""
    storage, root = storage_for(f"{loc.url}/{path}", loc.storage_options)
    return FsspecStorage(storage.fs, part_size=8 * MiB, max_concurrency=3, **kw), root


def test_an_upload_that_stalls_mid_body_is_cut_and_retried(faulty_s3, monkeypatch) -> None:  # noqa: ANN001
    """The server stops reading a part's body: aiohttp has no timeout for that; the stall
    watch cuts the connection and the part is sent again (hedging off: a duplicate would
    win first, test_faults_tail)."""
    monkeypatch.setenv("SHARDSAFE_HEDGE", "0")
    storage, root = _small_parts(faulty_s3.loc, "stall")
    data = np.random.default_rng(0).integers(0, 255, 17 * MiB, dtype=np.uint8)
    faulty_s3.proxy.faults = Faults(stall=1.0, stall_seconds=120, phase=0.05,
                                    only=strike_once(lambda m, t: m == "PUT" and "partNumber=2" in t))
    cut = storage._runner.watch.cut
    t0 = time.monotonic()
    storage.write(f"{root}/f", [memoryview(data)])
    assert time.monotonic() - t0 < 60 and faulty_s3.proxy.counts["stall"] == 1
    assert storage._runner.watch.cut > cut  # detected by the watch, not by a timeout elsewhere
    assert storage.read(f"{root}/f") == data.tobytes() and _uploads(faulty_s3) == []


def test_a_process_keeps_its_requests_in_flight_bounded(faulty_s3, monkeypatch) -> None:  # noqa: ANN001
    """Two files of three parts each, written at once with three parts in flight per file:
    never more than SHARDSAFE_STORE_REQUESTS requests reach the store together."""
    monkeypatch.setenv("SHARDSAFE_STORE_REQUESTS", "2")
    storage, root = _small_parts(faulty_s3.loc, "bounded")
    data = np.ones(17 * MiB, dtype=np.uint8)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda n: storage.write(f"{root}/{n}", [memoryview(data)]), "ab"))
    assert faulty_s3.proxy.max_inflight == 2 and faulty_s3.proxy.counts["requests"] >= 10
    assert storage.size(f"{root}/a") == storage.size(f"{root}/b") == data.size


def test_a_read_whose_response_stalls_is_retried(faulty_s3) -> None:  # noqa: ANN001
    storage, root = _small_parts(faulty_s3.loc, "read")
    data = np.random.default_rng(1).integers(0, 255, 12 * MiB, dtype=np.uint8)
    storage.write(f"{root}/f", [memoryview(data)])
    faulty_s3.proxy.faults = Faults(stall=1.0, stall_seconds=120, phase=0.8,
                                    only=strike_once(lambda m, t: m == "GET" and t.endswith("/f")))
    out = bytearray(11 * MiB)
    t0 = time.monotonic()
    storage.read_into(f"{root}/f", MiB, memoryview(out))
    assert time.monotonic() - t0 < 60 and faulty_s3.proxy.counts["stall"] == 1
    assert bytes(out) == data[MiB:12 * MiB].tobytes()


def test_a_stuck_multipart_upload_raises_at_the_deadline_and_is_aborted(faulty_s3) -> None:  # noqa: ANN001
    storage, root = _small_parts(faulty_s3.loc, "stuck", deadline=Deadline(4, rank=2, what="save"))
    data = np.zeros(17 * MiB, dtype=np.uint8)
    faulty_s3.proxy.faults = Faults(stall=1.0, stall_seconds=120, phase=0.3,
                                    only=lambda m, t: m == "PUT" and "partNumber=3" in t)
    t0 = time.monotonic()
    with pytest.raises(CheckpointTimeoutError) as e:
        storage.write(f"{root}/f", [memoryview(data)])
    assert time.monotonic() - t0 < 4 + SLACK
    assert (e.value.rank, e.value.file, e.value.request) == (2, f"{root}/f", "PUT part 3/3"), str(e.value)
    assert _uploads(faulty_s3) == []  # aborted, not left holding storage
    assert not faulty_s3.direct.filesystem().exists(f"{root}/f")


def test_an_async_save_stuck_past_its_deadline_raises_naming_rank_file_and_request(faulty_s3) -> None:  # noqa: ANN001
    """(A sync save's deadline: tests/storage/test_faults_ranks.py, on two ranks.)"""
    loc = faulty_s3.loc
    shardsafe.save(_state(1), f"{loc.url}/prev", storage_options=loc.storage_options)
    faulty_s3.proxy.faults = Faults(stall=1.0, stall_seconds=120, phase=0.3,
                                    only=lambda m, t: m == "PUT" and "/next/data-r" in t)
    t0 = time.monotonic()
    with pytest.raises(CheckpointTimeoutError) as e:
        h = shardsafe.async_save(_state(2), f"{loc.url}/next", storage_options=loc.storage_options, timeout=3)
        h.result(60)
    assert time.monotonic() - t0 < 3 + SLACK
    assert e.value.rank == 0 and "data-r00000-000" in e.value.file and e.value.request.startswith("PUT")
    assert "rank 0" in str(e.value) and "data-r00000-000" in str(e.value)
    faulty_s3.proxy.faults = Faults()
    assert not _committed(faulty_s3, "next")
    assert _same(shardsafe.load(f"{loc.url}/prev", storage_options=loc.storage_options), _state(1))


def test_a_request_out_of_attempts_raises_a_checkpoint_error(faulty_s3, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("SHARDSAFE_REQUEST_ATTEMPTS", "3")
    storage, root = storage_for(f"{faulty_s3.loc.url}/c", faulty_s3.loc.storage_options)
    faulty_s3.proxy.faults = Faults(throttle=1.0, retry_after=0, only=lambda m, t: m == "PUT")
    with pytest.raises(StorageRequestError) as e:
        storage.publish(f"{root}/index.json", b"{}")
    assert isinstance(e.value, CheckpointError) and isinstance(e.value, OSError)
    assert "failed 3 times (throttled (503 SlowDown)" in str(e.value) and e.value.file == f"{root}/index.json"
    assert "; the last error: OSError: [Errno 16] Please reduce your request rate." in str(e.value)
    assert f"(endpoint {faulty_s3.loc.storage_options['endpoint_url']})" in str(e.value)
    assert faulty_s3.proxy.counts["throttle"] == 3
    assert not faulty_s3.direct.filesystem().exists(f"{root}/index.json")


def test_a_save_carries_over_a_server_restart(faulty_s3) -> None:  # noqa: ANN001
    """The endpoint goes away as the data file goes up (every connection reset, new ones
    refused) and comes back on the same port 1.5 s later."""
    loc = faulty_s3.loc
    faulty_s3.proxy.faults = Faults(outage_seconds=1.5,
                                    outage_on=strike_once(lambda m, t: m == "PUT" and "data-r" in t))
    shardsafe.save(_state(3), f"{loc.url}/r", storage_options=loc.storage_options, timeout=60)
    assert faulty_s3.proxy.counts["outage"] == 1
    assert _same(shardsafe.load(f"{loc.url}/r", storage_options=loc.storage_options), _state(3))


def test_a_refused_first_request_fails_at_once_naming_the_endpoint(s3) -> None:  # noqa: ANN001
    import socket

    with socket.socket() as free:  # a port of 127.0.0.1 where nothing listens
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    wrong = {**s3.storage_options, "endpoint_url": f"http://127.0.0.1:{port}"}
    t0 = time.monotonic()
    with pytest.raises(StorageRequestError) as e:
        shardsafe.load(f"{s3.url}/ckpt", storage_options=wrong)
    assert time.monotonic() - t0 < 5  # not ten attempts of backoff
    text = str(e.value)
    assert "the connection was refused" in text and f"(endpoint http://127.0.0.1:{port})" in text
    assert "not retried, since it was the first request of the call" in text
    assert "endpoint_url right" in text
