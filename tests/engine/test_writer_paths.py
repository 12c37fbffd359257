"""The write paths: direct I/O on disk, buffered fallback on tmpfs, the feeds (parallel
staging into images, bounce buffers), and a sink that is slow to take its first unit."""

from __future__ import annotations

import os
import tempfile
import threading
import time

import numpy as np
import pytest
import torch
from helpers import assert_same

import shardsafe
from shardsafe.api.checkpointer import Checkpointer
from shardsafe.comm import SingleProcessComm
from shardsafe.engine import cuda
from shardsafe.engine.buffers import BouncePool, HostBuffer
from shardsafe.engine.save.feeds import ImageFeed, PoolFeed
from shardsafe.engine.save.prepare import prepare
from shardsafe.engine.save.ends import Commit
from shardsafe.engine.save.request import SaveRequest
from shardsafe.engine.save.run import Pipeline, run
from shardsafe.engine.save.sources import Sources, copy_unit
from shardsafe.engine.save.units import FileUnits
from shardsafe.plan.flatten import flatten
from shardsafe.plan.layout import plan_file
from shardsafe.storage.local import LocalStorage


def _mixed_state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"big": torch.randn(3 << 20, generator=g),  # 12 MiB: spans units of 1 MiB
            "odd": torch.randn(12345, generator=g).to(torch.float64),
            "tiny": [torch.arange(i, dtype=torch.int16) for i in range(40)],
            "bf": torch.randn(77, generator=g).to(torch.bfloat16),
            "np": np.arange(1001, dtype=np.int8), "empty": torch.zeros(0, 5)}


@pytest.fixture
def shm_dir():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        yield d


def _kernel_allows_direct(directory: str) -> bool:
    probe = os.path.join(directory, "probe")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        return False
    finally:
        if os.path.exists(probe):
            os.remove(probe)
    os.close(fd)
    return True


@pytest.mark.parametrize("direct_env", ["1", "0"])
def test_tmpfs_saves_with_or_without_direct_io(shm_dir, monkeypatch, direct_env):
    # Older kernels refuse O_DIRECT on tmpfs, newer ones (6.6+) accept it; with
    # SHARDSAFE_DIRECT_IO=0 every write is buffered. All three must save the same bytes.
    monkeypatch.setenv("SHARDSAFE_DIRECT_IO", direct_env)
    w = LocalStorage().open_writer(os.path.join(shm_dir, "f"), 10)
    assert w.direct == (direct_env == "1" and _kernel_allows_direct(shm_dir))
    w.abort()
    state = _mixed_state()
    with Checkpointer(unit_size=1 << 20) as ckpt:
        ckpt.save(state, os.path.join(shm_dir, "sync"))
        ckpt.async_save(state, os.path.join(shm_dir, "async")).result()
    assert_same(shardsafe.load(os.path.join(shm_dir, "sync")), state)
    assert_same(shardsafe.load(os.path.join(shm_dir, "async")), state)
    a = open(os.path.join(shm_dir, "sync", "data-r00000-000.safetensors"), "rb").read()
    b = open(os.path.join(shm_dir, "async", "data-r00000-000.safetensors"), "rb").read()
    assert a == b


def test_disk_uses_direct_io_and_round_trips_unaligned_sizes(tmp_path):
    w = LocalStorage().open_writer(str(tmp_path / "probe"), 4096)
    direct = w.direct
    w.abort()
    if not direct:
        pytest.skip("the test directory's filesystem has no O_DIRECT")
    state = _mixed_state()
    with Checkpointer(unit_size=1 << 20) as ckpt:
        ckpt.save(state, str(tmp_path / "sync"))
        ckpt.async_save(state, str(tmp_path / "async"), staging="background").result()
    for name in ("sync", "async"):
        assert_same(shardsafe.load(str(tmp_path / name)), state)
    a = (tmp_path / "sync" / "data-r00000-000.safetensors").read_bytes()
    b = (tmp_path / "async" / "data-r00000-000.safetensors").read_bytes()
    assert a == b and len(a) % 4096 != 0  # identical files; truncated after padded direct writes


def test_buffered_storage_option_round_trips(tmp_path):
    w = LocalStorage(direct_io=False).open_writer(str(tmp_path / "f"), 5)
    assert not w.direct
    w.write_gather(0, [memoryview(b"ab"), memoryview(b""), memoryview(b"cde")])
    w.close()
    assert (tmp_path / "f").read_bytes() == b"abcde"


def _plan_and_units(state, unit):
    _, items = flatten(state)
    plan = plan_file("data.safetensors", items)
    return plan, FileUnits(plan, unit, 1 << 20)


class _Stream:
    """What a feed needs of a stream."""

    def __init__(self, units: FileUnits) -> None:
        self.units, self.sources = units, Sources(units.plan)

    def live(self) -> bool:
        return True


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("pooled", [False, True])
def test_parallel_staging_matches_serial_copy(threads, pooled):
    """Both feeds emit every unit once, complete, whatever the number of copy threads."""
    plan, units = _plan_and_units(_mixed_state(), 64 << 10)
    serial = np.zeros(plan.layout.size, dtype=np.uint8)
    stream = _Stream(units)
    for k in range(units.nunits):
        copy_unit(units, k, stream.sources, serial)
    seen: list[int] = []
    out = np.full(plan.layout.size, 0xAB, dtype=np.uint8)
    image = HostBuffer(plan.layout.size)
    feed = PoolFeed(BouncePool(64 << 10, 3)) if pooled else ImageFeed([image])

    def emit(unit):  # noqa: ANN001, ANN202
        seen.append(unit.k)
        out[unit.start : unit.stop] = unit.array
        feed.release(unit)

    feed.stage([stream], emit, lambda: None, threads)
    assert sorted(seen) == list(range(units.nunits))
    assert np.array_equal(out, serial)


def test_bounce_pool_never_exceeds_its_count():
    pool = BouncePool(4096, 2)
    a, b = pool.acquire(), pool.acquire()
    pool.release(a)
    assert pool.acquire() is a  # reused, not a third allocation
    pool.release(a)
    pool.release(b)
    pool.close()


def test_cuda_staging_imports_and_is_skipped_without_cuda(tmp_path):
    if cuda.available():
        t = torch.randn(1 << 20, device="cuda")
        expect = t.cpu()
        h = shardsafe.async_save({"t": t}, str(tmp_path / "c"))
        t.zero_()  # on the caller's stream, after async_save returned
        h.result()
        assert torch.equal(shardsafe.load(str(tmp_path / "c"))["t"], expect)
        return
    assert not cuda.available() and not cuda.pin(np.zeros(4096, dtype=np.uint8))
    assert HostBuffer(4096).pin_for(0) is False
    pytest.skip("no CUDA device: the pinned/side-stream path was only imported")


class _SlowFirst:
    """Wraps a sink: the write of the file's first unit is late (another unit's write is
    done and the feed has finished meanwhile)."""

    def __init__(self, sink) -> None:  # noqa: ANN001
        self.sink, self.path, self.ordered = sink, sink.path, sink.ordered

    def write(self, offset, data, padded=None):  # noqa: ANN001, ANN201
        if offset == 0:
            time.sleep(0.5)
        self.sink.write(offset, data, padded)

    def close(self, size):  # noqa: ANN001, ANN201
        self.sink.close(size)

    def abort(self):  # noqa: ANN201
        self.sink.abort()


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_the_commit_waits_for_a_late_first_write(tmp_path, compression):
    """The last unit is written, but the file is closed (and the checkpoint committed) only
    once the late first unit is in it too: its bytes and checksums are in the checkpoint."""
    state = {"a": torch.randn(300_000), "b": (torch.randn(1 << 20) * 0.02).to(torch.bfloat16)}
    path = str(tmp_path / "ckpt")
    prep = prepare(SaveRequest(state=state, path=path), SingleProcessComm(), compression)
    pipe = Pipeline(prep, [], PoolFeed(BouncePool(16 << 20, 3)), Commit(prep), unit_size=1 << 20,
                    block_unit=16 << 20, window=2)
    for s in pipe.streams:
        for t in s.targets:
            opener = t.opener
            t.opener = lambda name, size, exact, opener=opener: _SlowFirst(opener(name, size, exact))
    for _ in run(pipe):
        pass
    assert_same(shardsafe.load(path), state)
