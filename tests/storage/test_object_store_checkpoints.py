"""save / load on object stores: S3 (a real moto server through s3fs) and fsspec memory://."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import shardsafe  # noqa: E402
from shardsafe import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError  # noqa: E402
from shardsafe.engine.commit import is_committed, read_index  # noqa: E402
from shardsafe.engine.load.reader import ChunkReader, ReadJob  # noqa: E402
from shardsafe.storage import storage_for  # noqa: E402
from shardsafe.storage.fsspec import FsspecStorage  # noqa: E402


def _state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "model": {"w": torch.randn(64, 32, generator=g), "b": torch.zeros(32, dtype=torch.bfloat16)},
        "opt": {"step": 7, "lr": 0.1, "betas": (0.9, 0.999), "name": "adam", "flag": None},
        "table": np.arange(100, dtype=np.int64).reshape(10, 10),
    }


def _assert_same(a: dict, b: dict) -> None:
    assert torch.equal(a["model"]["w"], b["model"]["w"])
    assert torch.equal(a["model"]["b"], b["model"]["b"]) and b["model"]["b"].dtype == torch.bfloat16
    assert a["opt"] == b["opt"]
    assert np.array_equal(a["table"], b["table"])


def test_s3_save_load_round_trip(s3) -> None:  # noqa: ANN001
    url = s3.url + "/run1/ckpt"
    shardsafe.save(_state(), url, storage_options=s3.storage_options)
    _assert_same(_state(), shardsafe.load(url, storage_options=s3.storage_options))
    fs = s3.filesystem()
    names = sorted(os.path.basename(p) for p in fs.ls(f"{s3.bucket}/run1/ckpt"))
    assert names == ["data-r00000-000.safetensors", "index.json"]  # nothing temporary left


def test_s3_load_in_place(s3) -> None:  # noqa: ANN001
    url = s3.url + "/ckpt"
    shardsafe.save(_state(), url, storage_options=s3.storage_options)
    target = {"model": {"w": torch.empty(64, 32), "b": torch.empty(32, dtype=torch.bfloat16)},
              "opt": {"step": 0, "lr": 0.0, "betas": (0.0, 0.0), "name": "", "flag": None},
              "table": np.empty((10, 10), dtype=np.int64)}
    w = target["model"]["w"]
    shardsafe.load(url, target, storage_options=s3.storage_options)
    assert target["model"]["w"] is w
    _assert_same(_state(), target)


def test_s3_async_save_snapshots_state_and_commits(s3) -> None:  # noqa: ANN001
    url, opts = s3.url + "/async", s3.storage_options
    state = _state()
    handle = shardsafe.async_save(state, url, storage_options=opts)
    state["model"]["w"].add_(100.0)  # staging is done: changes after return are not saved
    state["opt"]["step"] = 8
    handle.result(timeout=120)
    assert handle.done()
    _assert_same(_state(), shardsafe.load(url, storage_options=opts))


def test_s3_async_save_failure_reaches_result(s3) -> None:  # noqa: ANN001
    url = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/ckpt"
    handle = shardsafe.async_save({"w": torch.ones(4)}, url, storage_options=s3.storage_options)
    with pytest.raises((OSError, CheckpointError)):
        handle.result(timeout=120)


def test_s3_client_errors_surface_as_os_error(s3, monkeypatch) -> None:  # noqa: ANN001
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    opts = {"endpoint_url": s3.endpoint, "skip_instance_cache": True}  # no credentials anywhere
    with pytest.raises(OSError, match="NoCredentialsError"):
        shardsafe.load(s3.url + "/ckpt", storage_options=opts)


def test_memory_url_round_trip() -> None:
    url = f"memory://shardsafe-{uuid.uuid4().hex}/ckpt"
    shardsafe.save(_state(), url)
    _assert_same(_state(), shardsafe.load(url))


def test_s3_overwrite_replaces_and_refuses_without_flag(s3) -> None:  # noqa: ANN001
    url, opts = s3.url + "/ckpt", s3.storage_options
    shardsafe.save({"x": torch.ones(3)}, url, storage_options=opts)
    with pytest.raises(CheckpointError, match="already exists"):
        shardsafe.save({"x": torch.zeros(3)}, url, storage_options=opts)
    shardsafe.save({"y": torch.full((5,), 2.0)}, url, overwrite=True, storage_options=opts)
    out = shardsafe.load(url, storage_options=opts)
    assert list(out) == ["y"] and torch.equal(out["y"], torch.full((5,), 2.0))


def test_s3_prefix_without_index_is_not_a_checkpoint(s3) -> None:  # noqa: ANN001
    url, opts = s3.url + "/ckpt", s3.storage_options
    shardsafe.save(_state(), url, storage_options=opts)
    s3.filesystem().rm_file(f"{s3.bucket}/ckpt/index.json")  # data objects without their commit record
    storage, path = storage_for(url, opts)
    assert storage.list(path) == ["data-r00000-000.safetensors"]
    assert not is_committed(storage, path)
    with pytest.raises(CheckpointNotFoundError):
        shardsafe.load(url, storage_options=opts)


def _flip_byte(fs, key: str, offset: int) -> None:  # noqa: ANN001
    data = bytearray(fs.cat_file(key))
    data[offset] ^= 0x01
    fs.pipe_file(key, bytes(data))


def test_s3_flipped_byte_is_detected_naming_file_and_key(s3) -> None:  # noqa: ANN001
    url, opts = s3.url + "/ckpt", s3.storage_options
    shardsafe.save(_state(), url, storage_options=opts)
    storage, path = storage_for(url, opts)
    entry = next(t for t in read_index(storage, path).tensors if t.key == ("model", "w"))
    chunk = entry.chunks[0]
    _flip_byte(s3.filesystem(), f"{s3.bucket}/ckpt/{chunk.file}", chunk.offset + 100)
    with pytest.raises(CorruptCheckpointError) as e:
        shardsafe.load(url, storage_options=opts)
    assert chunk.file in str(e.value) and "model.w" in str(e.value)


def test_s3_truncated_object_is_detected(s3) -> None:  # noqa: ANN001
    url, opts = s3.url + "/ckpt", s3.storage_options
    shardsafe.save(_state(), url, storage_options=opts)
    fs = s3.filesystem()
    key = f"{s3.bucket}/ckpt/data-r00000-000.safetensors"
    fs.pipe_file(key, fs.cat_file(key)[:-10])
    with pytest.raises(CorruptCheckpointError, match="truncated"):
        shardsafe.load(url, storage_options=opts)


def test_s3_flipped_index_byte_is_detected(s3) -> None:  # noqa: ANN001
    url, opts = s3.url + "/ckpt", s3.storage_options
    shardsafe.save(_state(), url, storage_options=opts)
    _flip_byte(s3.filesystem(), f"{s3.bucket}/ckpt/index.json", 30)
    with pytest.raises(CorruptCheckpointError, match="index"):
        shardsafe.load(url, storage_options=opts)


class _CountingStorage(FsspecStorage):
    """Records every ranged read (a real subclass talking to the real server, not a mock)."""

    def __init__(self, fs) -> None:  # noqa: ANN001
        super().__init__(fs)
        self.reads: list[tuple[str, int, int]] = []

    def read_into(self, path: str, offset: int, out: memoryview) -> None:
        self.reads.append((os.path.basename(path), offset, len(out)))
        super().read_into(path, offset, out)


def test_s3_load_reads_only_the_wanted_byte_ranges(s3) -> None:  # noqa: ANN001
    url, opts = s3.url + "/ckpt", s3.storage_options
    state = {"a": torch.arange(1000, dtype=torch.float32), "b": torch.ones(5000), "c": torch.zeros(7)}
    shardsafe.save(state, url, storage_options=opts)
    base, path = storage_for(url, opts)
    storage = _CountingStorage(base.fs)
    index = read_index(storage, path)
    entry = next(t for t in index.tensors if t.key == ("b",))
    out = np.empty(entry.nbytes, dtype=np.uint8)
    ChunkReader(storage, path, index).run([ReadJob(entry, out, (0,), entry.shape)])
    chunk = entry.chunks[0]
    assert storage.reads == [(chunk.file, chunk.offset, chunk.nbytes)]
    assert np.array_equal(out.view(np.float32), np.ones(5000, dtype=np.float32))


_CHILD = """
import json, sys, torch, shardsafe
opts = json.loads(sys.argv[2])
state = {"w": torch.ones(int(sys.argv[3]) // 4)}
print("staged", flush=True)
shardsafe.save(state, sys.argv[1], storage_options=opts)
print("saved", flush=True)
"""


def test_s3_crash_mid_upload_leaves_no_committed_checkpoint(s3, subprocess_env, capsys) -> None:  # noqa: ANN001
    opts = s3.storage_options
    run = s3.url + "/run"
    shardsafe.save({"w": torch.full((4,), 1.0)}, run + "/step_00000001", storage_options=opts)
    fs = s3.filesystem()
    child = subprocess.Popen([sys.executable, "-c", _CHILD, run + "/step_00000002", json.dumps(opts),
                              str(320 << 20)], env=subprocess_env, stdout=subprocess.PIPE)
    s3.kill_during_upload(child)
    assert child.returncode == -signal.SIGKILL
    assert b"saved" not in child.stdout.read()
    uploads = fs.list_multipart_uploads(s3.bucket)
    assert [u["Key"] for u in uploads] == ["run/step_00000002/data-r00000-000.safetensors"]
    storage, path = storage_for(run, opts)
    committed = [n for n in storage.list(path) if is_committed(storage, storage.join(path, n))]
    assert committed == ["step_00000001"]
    with pytest.raises(CheckpointNotFoundError):
        shardsafe.load(run + "/step_00000002", storage_options=opts)
    assert torch.equal(shardsafe.load(run + "/step_00000001", storage_options=opts)["w"],
                       torch.full((4,), 1.0))
    # the killed save could not abort its upload: `shardsafe gc` lists it, then aborts it
    from shardsafe.cli import main

    gc = ["gc", run, "--min-age", "0", "--storage-options", json.dumps(opts)]
    assert main([*gc, "--dry-run"]) == 0
    assert (f"would delete unfinished upload {s3.bucket}/run/step_00000002/data-r00000-000.safetensors "
            f"(upload id {uploads[0]['UploadId']}, started ") in capsys.readouterr().out
    assert fs.list_multipart_uploads(s3.bucket) != []
    assert main(gc) == 0 and fs.list_multipart_uploads(s3.bucket) == []


@pytest.mark.parametrize("how", ["sync", "async"])
def test_s3_compressed_round_trip_and_verify(s3, how) -> None:  # noqa: ANN001
    from shardsafe.cli._listing import checkpoints_at
    from shardsafe.cli.verify import verify_checkpoint

    url = f"{s3.url}/cz-{how}/ckpt"
    state = _state()
    state["model"]["big"] = (torch.randn(512, 256) * 0.02).to(torch.bfloat16)  # 256 KiB: compressed
    if how == "sync":
        shardsafe.save(state, url, storage_options=s3.storage_options, compression="auto")
    else:
        shardsafe.async_save(state, url, storage_options=s3.storage_options, compression="auto").result()
    names = sorted(os.path.basename(p) for p in s3.filesystem().ls(f"{s3.bucket}/cz-{how}/ckpt"))
    assert names == ["data-r00000-000.blocks", "data-r00000-000.safetensors", "index.json"]
    got = shardsafe.load(url, storage_options=s3.storage_options)
    _assert_same(state, got)
    assert torch.equal(got["model"]["big"], state["model"]["big"])
    storage, path = storage_for(url, s3.storage_options)
    (entry,) = checkpoints_at(storage, path)
    assert verify_checkpoint(storage, entry, "ckpt") == []
    big = next(t for t in read_index(storage, path).tensors if t.key == ("model", "big"))
    assert big.chunks[0].stored is not None
