"""LocalStorage specifics the shared conformance suite does not see: segments, alignment, fs quirks."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

from shardsafe.engine.buffers import HostBuffer
from shardsafe.storage import local
from shardsafe.storage.local import LocalStorage


def _payload(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("direct_io", [True, False])
@pytest.mark.parametrize("sizes", [[0], [1], [4096], [4095, 1, 4096], [10000, 3, 8192 * 3 + 5], [0, 0, 7]])
def test_write_concatenates_buffers(tmp_path, direct_io: bool, sizes: list[int]) -> None:
    s = LocalStorage(direct_io=direct_io)
    parts = [_payload(n, i) for i, n in enumerate(sizes)]
    path = str(tmp_path / "f")
    s.write(path, [memoryview(p) for p in parts])
    assert open(path, "rb").read() == b"".join(parts)
    assert s.size(path) == sum(sizes)


def test_many_segments_written_in_order(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(local, "SEGMENT", 8192)  # force many concurrent segments on a small file
    buf = HostBuffer(8192 * 9 + 100)             # page-aligned: the O_DIRECT path where allowed
    buf.array[:] = np.frombuffer(_payload(buf.nbytes), dtype=np.uint8)
    tail = _payload(777, 1)
    path = str(tmp_path / "f")
    LocalStorage().write(path, [buf.view(0, buf.nbytes), memoryview(tail)])
    assert open(path, "rb").read() == buf.array.tobytes() + tail
    buf.close()


def test_unaligned_view_of_an_aligned_buffer(tmp_path) -> None:
    buf = HostBuffer(3 * 4096)
    buf.array[:] = np.frombuffer(_payload(buf.nbytes), dtype=np.uint8)
    path = str(tmp_path / "f")
    LocalStorage().write(path, [buf.view(1, 3 * 4096 - 1)])  # address and length unaligned
    assert open(path, "rb").read() == buf.array[1:-1].tobytes()
    buf.close()


def test_rewrite_truncates(tmp_path) -> None:
    s = LocalStorage()
    path = str(tmp_path / "f")
    s.write(path, [memoryview(b"x" * 10000)])
    s.write(path, [memoryview(b"short")])
    assert open(path, "rb").read() == b"short"


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no tmpfs at /dev/shm")
def test_tmpfs_without_direct_io_support() -> None:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        buf = HostBuffer(2 * 4096)
        buf.array[:] = 7
        path = os.path.join(d, "f")
        LocalStorage().write(path, [buf.view(0, buf.nbytes)])
        assert open(path, "rb").read() == b"\x07" * 8192
        buf.close()


def test_read_into_and_eof(tmp_path) -> None:
    s = LocalStorage()
    path = str(tmp_path / "f")
    data = _payload(5000)
    s.write(path, [memoryview(data)])
    out = bytearray(100)
    s.read_into(path, 4900, memoryview(out))
    assert bytes(out) == data[4900:]
    out = np.zeros(10, dtype=np.float32)  # typed buffers are read as bytes
    s.read_into(path, 0, memoryview(out))
    assert out.tobytes() == data[:40]
    with pytest.raises(EOFError, match="f"):
        s.read_into(path, 4990, memoryview(bytearray(11)))
    s.read_into(path, 5000, memoryview(bytearray(0)))  # an empty read at the end is fine


def test_publish_is_whole_and_leaves_no_temporaries(tmp_path) -> None:
    s = LocalStorage()
    path = str(tmp_path / "index.json")
    s.publish(path, b"first")
    s.publish(path, b"second")
    assert open(path, "rb").read() == b"second"
    assert os.listdir(tmp_path) == ["index.json"]


def test_rename_exchange_swaps_directories(tmp_path) -> None:
    s = LocalStorage()
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x").write_text("A")
    (b / "x").write_text("B")
    s.rename(str(a), str(b), exchange=True)
    assert (a / "x").read_text() == "B" and (b / "x").read_text() == "A"


def test_rename_never_replaces_a_non_empty_directory_or_a_file(tmp_path) -> None:
    s = LocalStorage()
    src = tmp_path / "src"
    src.mkdir()
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_text("k")
    f = tmp_path / "file"
    f.write_text("f")
    with pytest.raises(OSError):
        s.rename(str(src), str(full))
    with pytest.raises(OSError):
        s.rename(str(src), str(f))
    assert (full / "keep").read_text() == "k" and f.read_text() == "f"


def test_list_exists_delete(tmp_path) -> None:
    s = LocalStorage()
    d = tmp_path / "d"
    s.makedirs(str(d / "sub"))
    s.makedirs(str(d / "sub"))  # idempotent
    (d / "b").write_text("1")
    (d / "a").write_text("1")
    assert s.list(str(d)) == ["a", "b", "sub"]
    assert s.list(str(tmp_path / "absent")) == [] and s.list(str(d / "a")) == []
    assert s.exists(str(d / "sub")) and s.exists(str(d / "a")) and not s.exists(str(d / "zz"))
    s.delete(str(d / "absent"))  # no error
    s.delete(str(d / "a"))
    assert s.list(str(d)) == ["b", "sub"]
    s.delete(str(d))
    assert not d.exists()


def test_delete_does_not_follow_symlinks(tmp_path) -> None:
    s = LocalStorage()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("p")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    os.symlink(outside, ckpt / "link")
    s.delete(str(ckpt))
    assert (outside / "precious").read_text() == "p"
    link = tmp_path / "link2"
    os.symlink(outside, link)
    s.delete(str(link))
    assert not link.exists() and (outside / "precious").exists()


def test_sync_dir_and_missing(tmp_path) -> None:
    s = LocalStorage()
    s.sync_dir(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        s.size(str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError):
        s.read(str(tmp_path / "absent"))


def test_sibling_file_refuses_a_symlinked_or_missing_directory(tmp_path) -> None:  # noqa: ANN001
    from shardsafe.errors import CorruptCheckpointError

    s = LocalStorage()
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "plain").write_bytes(b"")
    ckpt = str(tmp_path / "step_2")
    assert s.sibling_file(ckpt, "real", "f") == str(tmp_path / "real" / "f")
    for name in ("link", "plain"):
        with pytest.raises(CorruptCheckpointError, match="not a directory"):
            s.sibling_file(ckpt, name, "f")
    with pytest.raises(FileNotFoundError):
        s.sibling_file(ckpt, "absent", "f")
