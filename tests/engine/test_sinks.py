"""The sink conformance suite: every sink of the save pipeline passes the same tests.

As fsspec's abstract tests do for its backends, each test runs against every sink kind
(``KINDS``): a data file with direct I/O on disk, on tmpfs and buffered; an upload to a
backend without ranged writes, and to a real S3 server; a replica's mirror of a save's
data file. Each kind is checked on its own (bytes exact, at a known or a late-known size;
a cancelled sink leaves no object; the caller's buffer is free once ``write`` returns, so
a budget bounds everything in flight) and inside a whole save (checksums exact, a
cancelled save leaves nothing, a failing sink's error reaches the caller).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import shardsafe
from shardsafe.cli import main as cli_main
from shardsafe.comm import SingleProcessComm
from shardsafe.engine.buffers import BouncePool, HostBuffer
from shardsafe.engine.commit import is_committed
from shardsafe.engine.save import replica as replica_mod
from shardsafe.engine.save.feeds import PoolFeed
from shardsafe.engine.save.prepare import prepare
from shardsafe.engine.save.ends import Commit
from shardsafe.engine.save.request import Replica, SaveRequest
from shardsafe.engine.save.run import Pipeline, run
from shardsafe.engine.save.sinks import FileSink, Sink, UploadSink, open_sink
from shardsafe.storage import LocalStorage, storage_for
from shardsafe.storage.local import LocalFileWriter

MiB = 1 << 20
UNIT = 1 << 20


class WholeFileStorage(LocalStorage):
    """A local backend without ranged writes, as an object store: whole files and streams only
    (a stream is written to a hidden name and renamed once complete, as an upload appears)."""

    def open_writer(self, path, size):  # noqa: ANN001, ANN201
        return None

    def write_stream(self, path, size, pieces):  # noqa: ANN001, ANN201
        tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".uploading")
        try:
            with open(tmp, "wb") as f:
                for piece in pieces:
                    f.write(piece)
                if size is not None and f.tell() != size:
                    raise ValueError(f"{path}: {f.tell()} bytes written, {size} expected")
            os.rename(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)


@dataclass
class Kind:
    """One sink kind: where its files go and how a sink of it is made."""

    name: str
    root: str  # a directory, or an s3:// prefix
    storage_options: dict | None = None
    storage: object = None  # the backend (default: the one the root's URL names)

    def backend(self) -> object:
        return self.storage or storage_for(self.root, self.storage_options)[0]

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def open(self, name: str, size: int, *, exact: bool = True) -> Sink:
        path = self.path(name)
        backend = self.backend()
        if self.name == "mirror":
            # a save's data file of ``size`` bytes with a 4096-byte header, mirrored into a
            # replica file whose header is a page longer: offsets are the save file's
            save_plan = _fake_plan(size, 4096)
            mine = _fake_plan(size, 8192)
            return _Shifted(replica_mod.MirrorSink(backend, path, mine, save_plan), 4096)
        spath = storage_for(path, self.storage_options)[1] if "://" in path else path
        return open_sink(backend, spath, size, exact=exact)

    def read(self, name: str) -> bytes:
        path = self.path(name)
        if self.name.startswith("upload-s3"):
            fs = self.backend().fs  # type: ignore[attr-defined]
            return fs.cat_file(storage_for(path, self.storage_options)[1])
        data = open(path, "rb").read()
        return data[8192:] if self.name == "mirror" else data  # (the replica's header)

    def exists(self, name: str) -> bool:
        path = self.path(name)
        if self.name.startswith("upload-s3"):
            return self.backend().exists(storage_for(path, self.storage_options)[1])  # type: ignore[attr-defined]
        return os.path.exists(path)


class _Layout:
    def __init__(self, size: int, start: int) -> None:
        self.size, self.data_start, self.header, self.offsets = size, start, b"H" * start, (start,)
        self.nbytes = (size - start,)


class _Plan:
    def __init__(self, size: int, start: int) -> None:
        self.name, self.items, self.layout = "x", (), _Layout(size, start)


def _fake_plan(data: int, header: int) -> _Plan:
    """A plan whose file is ``header`` bytes of header, then ``data`` bytes of data."""
    return _Plan(header + data, header)


class _Shifted:
    """A mirror seen at the data section's offsets (what the save's writes address)."""

    ordered = False

    def __init__(self, sink: replica_mod.MirrorSink, header: int) -> None:
        self.sink, self.header, self.path = sink, header, sink.path

    def write(self, offset, data, padded=None):  # noqa: ANN001, ANN201
        self.sink.write(offset + self.header, data, padded)

    def close(self, size):  # noqa: ANN001, ANN201
        self.sink.close(size + self.header)

    def abort(self):  # noqa: ANN201
        self.sink.abort()


KINDS = ["file-disk", "file-tmpfs", "file-buffered", "upload-local", "upload-s3", "mirror"]


@pytest.fixture(params=KINDS)
def kind(request, tmp_path) -> Iterator[Kind]:  # noqa: ANN001
    name = request.param
    if name == "file-tmpfs":
        if not os.path.isdir("/dev/shm"):
            pytest.skip("no /dev/shm")
        import tempfile

        with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
            yield Kind(name, d)
        return
    if name == "upload-s3":
        s3 = request.getfixturevalue("s3")
        yield Kind(name, f"{s3.url}/sinks", s3.storage_options)
        return
    storage = {"file-buffered": LocalStorage(direct_io=False), "upload-local": WholeFileStorage()}.get(name)
    yield Kind(name, str(tmp_path), storage=storage)


def _data(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _write_all(sink: Sink, data: np.ndarray, piece: int, *, shuffle: bool, garble: bool = False) -> None:
    """Writes ``data`` in pieces from one aligned buffer per piece (the last offered padded);
    with ``garble`` each buffer is overwritten once ``write`` returned."""
    spans = [(o, min(o + piece, data.size)) for o in range(0, data.size, piece)]
    if shuffle and not sink.ordered:
        random.Random(1).shuffle(spans)
    for a, b in spans:
        buf = HostBuffer(b - a)
        buf.array[:] = data[a:b]
        padded = buf.view(0, buf.capacity) if b == data.size else None
        sink.write(a, buf.view(0, b - a), padded)
        if garble:
            buf.array[:] = 0xEE
        buf.close()


@pytest.mark.parametrize("size", [0, 1, 4096, 3 * MiB + 12345])
def test_bytes_are_exact(kind: Kind, size: int) -> None:
    data = _data(size)
    sink = kind.open("f", size)
    _write_all(sink, data, 1 * MiB, shuffle=True)
    sink.close(size)
    assert kind.read("f") == data.tobytes()


def test_a_size_known_only_at_the_end(kind: Kind) -> None:
    if kind.name == "mirror":
        pytest.skip("a mirrored data file's size is known from its plan")
    data = _data(2 * MiB + 777, 1)
    sink = kind.open("f", 8 * MiB, exact=False)  # an upper bound, as for a block file
    _write_all(sink, data, 512 << 10, shuffle=False)
    sink.close(data.size)
    assert kind.read("f") == data.tobytes()


def test_the_callers_buffer_is_free_once_write_returns(kind: Kind) -> None:
    """A sink keeps nothing of a buffer after ``write``: the memory budget bounds every byte."""
    data = _data(3 * MiB, 2)
    sink = kind.open("f", data.size)
    _write_all(sink, data, 1 * MiB, shuffle=True, garble=True)
    sink.close(data.size)
    assert kind.read("f") == data.tobytes()


def test_a_cancelled_upload_leaves_no_object(kind: Kind) -> None:
    sink = kind.open("f", 4 * MiB)
    _write_all(sink, _data(2 * MiB, 3), 1 * MiB, shuffle=False)
    sink.abort()
    sink.abort()  # twice is harmless
    if isinstance(sink, UploadSink):
        assert not kind.exists("f")  # the upload was abandoned, not completed short


def test_a_short_file_is_refused(kind: Kind) -> None:
    if not kind.name.startswith("upload"):
        pytest.skip("a ranged file's size is set by close")
    sink = kind.open("f", 2 * MiB)
    _write_all(sink, _data(1 * MiB), 1 * MiB, shuffle=False)
    with pytest.raises((ValueError, OSError)):
        sink.close(2 * MiB)
    assert not kind.exists("f")


def test_ordered_sinks_refuse_writes_out_of_order(kind: Kind) -> None:
    sink = kind.open("f", 2 * MiB)
    if not sink.ordered:
        sink.abort()
        pytest.skip("ranged writes come in any order")
    buf = HostBuffer(MiB)
    with pytest.raises(ValueError, match="in order"):
        sink.write(MiB, buf.view(0, MiB))
    sink.abort()


# ----------------------------------------------------------------------------- inside a save
def _state() -> dict:
    g = torch.Generator().manual_seed(5)
    return {"big": torch.randn(3 * MiB // 4, generator=g), "bf": (torch.randn(MiB, generator=g) * 0.02).to(torch.bfloat16),
            "small": [torch.arange(i, dtype=torch.int16) for i in range(20)], "n": 7}


def _save_through(kind: Kind, state: dict, name: str, *, compression: str | None = None,
                  fail: Callable[[], None] | None = None) -> str:
    """Saves ``state`` through a pipeline whose every file is a sink of ``kind`` (a
    mirror kind saves locally and checks the replica); returns the checkpoint's path."""
    path = kind.path(name)
    storage, spath = storage_for(path, kind.storage_options)
    if kind.storage is not None:
        storage = kind.storage
    replicas = []
    if kind.name == "mirror":
        rep = Replica({"state": state}, kind.path(name + "-replica"))
        replicas = [rep]
    prep = prepare(SaveRequest(state=state, path=path, storage_options=kind.storage_options), SingleProcessComm(),
                   compression)
    prep.storage = storage
    preps = [replica_mod.prepare_replica(prep, r) for r in replicas]
    feed = PoolFeed(BouncePool(16 * MiB, 3))
    pipe = Pipeline(prep, preps, feed, Commit(prep), unit_size=16 * MiB, block_unit=16 * MiB, window=2)
    if fail is not None:
        pipe.stage = _failing(pipe.stage, fail)  # type: ignore[method-assign]
    for _ in run(pipe):
        pass
    if replicas:
        replicas[0].progress.handle.result()
        return kind.path(name + "-replica")
    return path


def _failing(stage: Callable[..., None], fail: Callable[[], None]) -> Callable[..., None]:
    def staged(threads):  # noqa: ANN001, ANN202
        stage(threads)
        fail()
    return staged


@pytest.mark.parametrize("compression", [None, "auto"])
def test_a_save_through_the_sink_verifies(kind: Kind, compression: str | None) -> None:
    """Every checksum of the index describes the bytes the sink stored (``verify``), and the
    state loads back bit for bit."""
    state = _state()
    path = _save_through(kind, state, f"ckpt-{compression}", compression=compression)
    opts = ["--storage-options", json.dumps(kind.storage_options)] if kind.storage_options else []
    assert cli_main(["verify", path, *opts]) == 0
    got = shardsafe.load(path, storage_options=kind.storage_options)
    got = got["state"] if kind.name == "mirror" else got
    assert torch.equal(got["big"], state["big"]) and torch.equal(got["bf"], state["bf"])
    assert all(torch.equal(a, b) for a, b in zip(got["small"], state["small"])) and got["n"] == 7


def test_a_cancelled_save_leaves_nothing(kind: Kind) -> None:
    def stop() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _save_through(kind, _state(), "cancelled", compression="zstd", fail=stop)
    if kind.name.startswith("upload-s3"):
        backend = kind.backend()
        assert backend.list(storage_for(kind.root, kind.storage_options)[1]) == []  # type: ignore[attr-defined]
        assert backend.incomplete_uploads(storage_for(kind.root, kind.storage_options)[1]) == []  # type: ignore[attr-defined]
    else:
        assert sorted(os.listdir(kind.root)) == []


def test_a_failing_sink_reaches_the_caller(kind: Kind, monkeypatch) -> None:
    def full(self, *args, **kwargs):  # noqa: ANN001, ANN202
        raise OSError(28, "No space left on device")

    if kind.name.startswith("upload"):
        cls = type(kind.backend())
        monkeypatch.setattr(cls, "write_stream", full)
    else:
        monkeypatch.setattr(LocalFileWriter, "write_at", full)
    if kind.name == "mirror":  # the replica fails alone; the save commits
        state, path = _state(), kind.path("failing")
        prep = prepare(SaveRequest(state=state, path=path), SingleProcessComm(), None)
        rep = Replica({"state": state}, kind.path("failing-replica"))
        pipe = Pipeline(prep, [replica_mod.prepare_replica(prep, rep)], PoolFeed(BouncePool(16 * MiB, 3)),
                        Commit(prep), unit_size=16 * MiB, block_unit=16 * MiB, window=2)
        with pytest.raises(OSError, match="No space left"):  # the save's own file fails as well
            for _ in run(pipe):
                pass
        with pytest.raises(OSError, match="No space left") as e:
            rep.progress.handle.result()
        assert "failing-replica" in str(e.value)
        return
    with pytest.raises(OSError, match="No space left") as e:
        _save_through(kind, _state(), "failing")
    assert "data-r00000-000" in str(e.value)  # the error names the file
    assert not is_committed(kind.backend(), storage_for(kind.path("failing"), kind.storage_options)[1])


def test_sinks_are_what_open_sink_makes() -> None:
    """``open_sink`` picks the sink by the backend: ranged writes, else an upload stream."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        a = open_sink(LocalStorage(), os.path.join(d, "a"), 10)
        b = open_sink(WholeFileStorage(), os.path.join(d, "b"), 10)
        assert isinstance(a, FileSink) and isinstance(b, UploadSink) and b.ordered and not a.ordered
        a.abort()
        b.abort()
