"""The write paths: direct I/O on disk, buffered fallback on tmpfs, gather writes, bounce
buffers, and whole-file writes for storages without ranged writes."""

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
from shardsafe.engine import cuda
from shardsafe.engine.buffers import BouncePool, HostBuffer
from shardsafe.engine.checkpointer import Checkpointer
from shardsafe.engine.staging import StageTask, copy_unit, host_sources, stage_files
from shardsafe.engine.units import FileUnits
from shardsafe.engine.writer import FileWrite
from shardsafe.format.checksum import crc32c
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


class WholeFileStorage(LocalStorage):
    """A backend with only whole-file writes, like an object store."""

    def open_writer(self, path, size):
        return None  # no ranged writes: the caller hands write() whole files


def _plan_and_units(state, unit):
    _, items = flatten(state)
    plan = plan_file("data.safetensors", items)
    return plan, FileUnits(plan, unit, 1 << 20)


def test_storage_without_ranged_writes_gets_the_whole_staged_file(tmp_path):
    plan, units = _plan_and_units(_mixed_state(), 1 << 20)
    buf = HostBuffer(plan.layout.size)
    fw = FileWrite(units, WholeFileStorage(), str(tmp_path / "f"), staged=buf)
    fw.start()
    stage_files([StageTask(units, buf.array, fw.unit_ready)])
    sums = fw.finish()
    data = (tmp_path / "f").read_bytes()
    assert data == bytes(buf.array)
    assert sum(map(len, sums)) == sum(units.nblocks)
    with pytest.raises(ValueError, match="ranged"):
        FileWrite(units, WholeFileStorage(), str(tmp_path / "g"), sources=host_sources(plan)).start()


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_parallel_staging_matches_serial_copy(threads):
    plan, units = _plan_and_units(_mixed_state(), 64 << 10)
    serial = np.zeros(plan.layout.size, dtype=np.uint8)
    src = host_sources(plan)
    for k in range(units.nunits):
        copy_unit(units, k, src, serial)
    seen: list[int] = []
    out = np.full(plan.layout.size, 0xAB, dtype=np.uint8)
    stage_files([StageTask(units, out, seen.append)], threads=threads)
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
    assert HostBuffer(4096, pin=True).pinned is False
    pytest.skip("no CUDA device: the pinned/side-stream path was only imported")


class _SlowFirstWrite(FileWrite):
    """A FileWrite whose unit-0 write job is handed to the pool late (another thread's
    ``unit_ready`` is still submitting it when the last unit becomes ready)."""

    def _submit(self, job):
        if job == ("write", 0):
            time.sleep(0.5)
        super()._submit(job)


def test_finish_waits_for_jobs_other_threads_are_still_submitting(tmp_path):
    state = {"a": torch.randn(300_000), "b": torch.randn(300_000)}  # blocks span 1 MiB units
    plan, units = _plan_and_units(state, 1 << 20)
    assert units.nunits > 2
    storage = LocalStorage()
    fw = _SlowFirstWrite(units, storage, str(tmp_path / "f"), sources=host_sources(plan),
                   bounce=BouncePool(1 << 20, 2))
    fw.start()
    late = threading.Thread(target=fw.unit_ready, args=(0,))
    late.start()
    time.sleep(0.05)  # unit 0 is marked ready; its write job is not submitted yet
    for k in range(1, units.nunits):
        fw.unit_ready(k)
    sums = fw.finish()
    late.join()
    data = (tmp_path / "f").read_bytes()
    img = np.zeros(plan.layout.size, dtype=np.uint8)
    for k in range(units.nunits):
        copy_unit(units, k, host_sources(plan), img)
    assert data == img.tobytes()  # unit 0 written before the file was closed
    for i, (off, n) in enumerate(zip(units.offsets.tolist(), units.nbytes.tolist())):
        want = [crc32c(data[off + j : min(off + j + (1 << 20), off + n)]) for j in range(0, n, 1 << 20)]
        assert sums[i] == want
