"""One conformance suite for every storage backend: local POSIX, fsspec memory://, and S3.

S3 runs against a real moto server through the real s3fs client (tests/s3_server.py).
A new backend joins by adding a case to the ``backend`` fixture.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pytest

from shardsafe.storage import LocalStorage, Storage, storage_for
from shardsafe.storage.fsspec import FsspecStorage

MiB = 1 << 20


@dataclass
class Backend:
    name: str
    storage: Storage
    root: str  # an empty directory/prefix owned by the test
    ranged: bool  # open_writer gives a ranged writer (False: whole files only, via write)

    def path(self, *parts: str) -> str:
        return self.storage.join(self.root, *parts)


@pytest.fixture(params=["local", "memory", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path) -> Iterator[Backend]:  # noqa: ANN001
    if request.param == "local":
        yield Backend("local", LocalStorage(), str(tmp_path / "root"), ranged=True)
        return
    if request.param == "memory":
        url = f"memory://shardsafe-conformance-{uuid.uuid4().hex}"
        storage, root = storage_for(url)
        yield Backend("memory", storage, root, ranged=False)
        storage.delete(root)
        return
    s3 = request.getfixturevalue("s3")
    storage, root = storage_for(s3.url + "/root", s3.storage_options)
    # the smallest part size S3 allows, so multipart uploads and split reads happen at test sizes
    yield Backend("s3", FsspecStorage(storage.fs, part_size=5 * MiB, max_concurrency=3), root,
                  ranged=False)


def _write(b: Backend, name: str, *chunks: bytes) -> str:
    p = b.path(name)
    b.storage.makedirs(b.root)
    b.storage.write(p, [memoryview(c) for c in chunks])
    return p


def _protocol_methods() -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(Storage).items()
            if not name.startswith("_") and callable(member)}


def test_implements_every_protocol_method_with_its_signature(backend: Backend) -> None:
    """isinstance() on a Protocol only checks names; the engine calls these with keywords
    (``exchange=``, ``sync=``), so every parameter must be there under the same name."""
    methods = _protocol_methods()
    assert {"open_writer", "write", "publish", "read_into", "rename", "sync_dir"} <= set(methods)
    for name, want in methods.items():
        got = inspect.signature(getattr(backend.storage, name))  # bound: no self
        want_params = [(p.name, p.kind) for p in want.parameters.values() if p.name != "self"]
        assert [(p.name, p.kind) for p in got.parameters.values()] == want_params, (name, got)
    assert type(backend.storage.atomic_rename) is bool
    # only a file system renames atomically; object stores must say they cannot
    assert backend.storage.atomic_rename == (backend.name == "local")


def test_open_writer_writes_disjoint_ranges_from_several_threads(backend: Backend) -> None:
    """What the engine relies on: a ranged writer, or None and whole files through write()."""
    s = backend.storage
    s.makedirs(backend.root)
    data = np.random.default_rng(1).integers(0, 256, 3 * 4096 + 123, dtype=np.uint8).tobytes()
    p = backend.path("ranged")
    w = s.open_writer(p, len(data))
    assert (w is not None) == backend.ranged
    if w is None:  # object stores: the whole file goes through write
        s.write(p, [memoryview(data)])
        assert s.read(p) == data
        return
    assert isinstance(w.direct, bool)
    spans = [(0, 4096), (8192, 12288), (4096, 8192)]
    with ThreadPoolExecutor(3) as pool:  # the caller's threads: the backend starts none
        list(pool.map(lambda r: w.write_at(r[0], memoryview(data)[r[0] : r[1]]), spans))
    tail = memoryview(data)[12288:]
    w.write_gather(12288, [tail[:23], tail[23:23], tail[23:]])
    w.close()
    assert s.read(p) == data
    assert s.size(p) == len(data)


def test_open_writer_truncates_padding_and_abort_leaves_no_durable_promise(backend: Backend) -> None:
    s = backend.storage
    s.makedirs(backend.root)
    p = backend.path("padded")
    w = s.open_writer(p, 5)
    if not backend.ranged:
        assert w is None
        return
    w.write_at(0, memoryview(b"abcde" + b"\0" * 4091))  # padded to the alignment, like staging does
    w.close()
    assert s.read(p) == b"abcde"
    w = s.open_writer(backend.path("aborted"), 10)
    w.write_at(0, memoryview(b"0123456789"))
    w.abort()  # closes without syncing; the caller deletes the file
    s.delete(backend.path("aborted"))
    assert not s.exists(backend.path("aborted"))


def test_write_stream_writes_pieces_in_order_and_stops_on_error(backend: Backend) -> None:
    data = np.random.default_rng(3).integers(0, 256, 12 * MiB + 5, dtype=np.uint8).tobytes()
    p = backend.path("streamed")
    backend.storage.makedirs(backend.root)
    pieces = (memoryview(data)[i : i + 4 * MiB] for i in range(0, len(data), 4 * MiB))
    backend.storage.write_stream(p, len(data), pieces)
    assert backend.storage.size(p) == len(data) and backend.storage.read(p) == data

    def failing():  # noqa: ANN202
        yield memoryview(data)[: 6 * MiB]
        raise OSError("source went away")

    with pytest.raises(OSError, match="source went away"):
        backend.storage.write_stream(backend.path("broken"), len(data), failing())
    with pytest.raises(ValueError, match="expected"):
        backend.storage.write_stream(backend.path("short"), len(data), iter([memoryview(data)[:10]]))


@pytest.mark.parametrize("size", [0, 3 * MiB, 12 * MiB + 5])
def test_write_stream_of_a_size_known_only_at_the_end(backend: Backend, size: int) -> None:
    # a block file being coded: on S3 one PUT below two parts, else a multipart upload
    data = np.random.default_rng(4).integers(0, 256, size, dtype=np.uint8).tobytes()
    p = backend.path(f"unsized-{size}")
    backend.storage.makedirs(backend.root)
    pieces = (memoryview(data)[i : i + 3 * MiB] for i in range(0, len(data), 3 * MiB))
    backend.storage.write_stream(p, None, pieces)
    assert backend.storage.size(p) == size and backend.storage.read(p) == data


def test_write_concatenates_buffers_and_read_returns_them(backend: Backend) -> None:
    p = _write(backend, "f", b"hello", b"", b" world")
    assert backend.storage.read(p) == b"hello world"
    assert backend.storage.size(p) == 11


def test_write_replaces_longer_content(backend: Backend) -> None:
    p = _write(backend, "f", b"x" * 1000)
    _write(backend, "f", b"short")
    assert backend.storage.read(p) == b"short"
    assert backend.storage.size(p) == 5


def test_empty_file(backend: Backend) -> None:
    p = _write(backend, "empty")
    assert backend.storage.read(p) == b""
    assert backend.storage.size(p) == 0
    backend.storage.read_into(p, 0, memoryview(bytearray(0)))


def test_read_into_reads_a_byte_range(backend: Backend) -> None:
    data = bytes(range(256)) * 4
    p = _write(backend, "f", data)
    out = bytearray(100)
    backend.storage.read_into(p, 300, memoryview(out))
    assert bytes(out) == data[300:400]


def test_read_into_past_the_end_raises_eof(backend: Backend) -> None:
    p = _write(backend, "f", b"0123456789")
    with pytest.raises(EOFError):
        backend.storage.read_into(p, 5, memoryview(bytearray(10)))


def test_missing_file_raises_file_not_found(backend: Backend) -> None:
    missing = backend.path("nope")
    with pytest.raises(FileNotFoundError):
        backend.storage.read(missing)
    with pytest.raises(FileNotFoundError):
        backend.storage.size(missing)
    assert not backend.storage.exists(missing)


def test_publish_is_readable_and_replaces(backend: Backend) -> None:
    backend.storage.makedirs(backend.root)
    p = backend.path("index.json")
    backend.storage.publish(p, b'{"a": 1}')
    backend.storage.publish(p, b'{"b": 2}')
    assert backend.storage.read(p) == b'{"b": 2}'
    assert backend.storage.list(backend.root) == ["index.json"]  # no temporaries left behind


def test_exists_for_files_and_directories(backend: Backend) -> None:
    backend.storage.makedirs(backend.path("sub"))
    backend.storage.write(backend.path("sub", "f"), [memoryview(b"1")])
    assert backend.storage.exists(backend.path("sub"))
    assert backend.storage.exists(backend.path("sub", "f"))
    assert not backend.storage.exists(backend.path("su"))


def test_list_is_sorted_and_one_level_deep(backend: Backend) -> None:
    s = backend.storage
    for d in ("b", "a", "ab"):
        s.makedirs(backend.path(d))
        s.write(backend.path(d, "x"), [memoryview(b"1")])
    s.makedirs(backend.path("a", "deep"))
    s.write(backend.path("a", "deep", "y"), [memoryview(b"2")])
    s.write(backend.path("file"), [memoryview(b"3")])
    assert s.list(backend.root) == ["a", "ab", "b", "file"]
    assert s.list(backend.path("a")) == ["deep", "x"]
    assert s.list(backend.path("missing")) == []
    assert s.list(backend.path("file")) == []  # a file is not a directory


def test_delete_file_directory_and_missing(backend: Backend) -> None:
    s = backend.storage
    for d in ("a", "ab"):
        s.makedirs(backend.path(d, "deep"))
        s.write(backend.path(d, "deep", "x"), [memoryview(b"1")])
        s.write(backend.path(d, "y"), [memoryview(b"2")])
    s.delete(backend.path("a", "y"))
    assert s.list(backend.path("a")) == ["deep"]
    s.delete(backend.path("a"))
    assert not s.exists(backend.path("a"))
    assert s.read(backend.path("ab", "deep", "x")) == b"1"  # a sibling sharing the prefix survives
    s.delete(backend.path("a"))  # already gone: no error
    s.delete(backend.path("never-existed"))


def test_large_write_and_split_read_round_trip(backend: Backend) -> None:
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 256, n, dtype=np.uint8) for n in (7 * MiB + 3, 1, 6 * MiB - 11)]
    whole = np.concatenate(parts)
    p = _write(backend, "big", *[a.tobytes() for a in parts])
    assert backend.storage.size(p) == whole.size
    out = np.empty(12 * MiB, dtype=np.uint8)  # spans several 5 MiB read pieces
    backend.storage.read_into(p, 777, memoryview(out))
    assert np.array_equal(out, whole[777 : 777 + out.size])
    if backend.name == "s3":  # a multipart upload leaves an ETag ending in "-<number of parts>"
        etag = backend.storage.fs.info(p)["ETag"].strip('"')
        assert etag.endswith("-3"), etag


def test_rename_follows_atomic_rename(backend: Backend) -> None:
    s = backend.storage
    src, dst = backend.path("src"), backend.path("dst")
    s.makedirs(src)
    s.write(s.join(src, "f"), [memoryview(b"1")])
    if s.atomic_rename:
        s.makedirs(dst)
        s.write(s.join(dst, "f"), [memoryview(b"2")])
        s.rename(src, dst, exchange=True)
        assert s.read(s.join(dst, "f")) == b"1" and s.read(s.join(src, "f")) == b"2"
    else:
        with pytest.raises(OSError, match="no atomic rename"):
            s.rename(src, dst)


def test_makedirs_and_sync_dir_are_harmless(backend: Backend) -> None:
    s = backend.storage
    s.makedirs(backend.path("d", "e"))
    s.makedirs(backend.path("d", "e"))
    s.write(backend.path("d", "e", "f"), [memoryview(b"1")])
    s.sync_dir(backend.path("d", "e"))
    assert s.read(backend.path("d", "e", "f")) == b"1"


def test_sibling_file_resolves_next_to_the_checkpoint(backend: Backend) -> None:
    backend.storage.makedirs(backend.path("step_1"))
    backend.storage.write(backend.path("step_1", "data.bin"), [memoryview(b"referenced")])
    ckpt = backend.path("step_2")
    for path in (ckpt, ckpt + "/"):  # a trailing slash names the same checkpoint
        got = backend.storage.sibling_file(path, "step_1", "data.bin")
        assert backend.storage.read(got) == b"referenced"


def test_is_directory_and_is_link(backend: Backend) -> None:
    s = backend.storage
    s.makedirs(backend.path("d"))
    s.write(backend.path("d", "f"), [memoryview(b"1")])
    assert s.is_directory(backend.path("d")) and s.is_directory(backend.path("d") + "/")
    assert not s.is_directory(backend.path("d", "f"))
    assert not s.is_directory(backend.path("missing"))
    assert not s.is_link(backend.path("d")) and not s.is_link(backend.path("d", "f"))
    if backend.name == "local":  # only a file system has links and FIFOs
        import os

        os.symlink(backend.path("d"), backend.path("link"))
        os.mkfifo(backend.path("fifo"))
        assert s.is_link(backend.path("link")) and s.is_link(backend.path("link") + "/")
        assert not s.is_directory(backend.path("link")) and not s.is_directory(backend.path("fifo"))
        assert not s.is_link(backend.path("fifo"))
