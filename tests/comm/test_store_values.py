"""Store values stay at most 1 MB: longer messages travel in pieces through a real c10d store.

``comm.store_values`` is pure (table-driven below); ``StoreChannel`` applies it over a
real in-process c10d ``HashStore`` wrapped so that every value set is measured.
"""

from __future__ import annotations

import datetime
import os
import threading

import pytest

from shardsafe.comm import store_values
from shardsafe.comm.channel import announce, drain, gather, receive
from shardsafe.errors import CheckpointError

dist = pytest.importorskip("torch.distributed")
from shardsafe.comm.torch_comm import StoreChannel  # noqa: E402

MB = store_values.MAX_VALUE


@pytest.mark.parametrize("size,pieces", [(0, 1), (10, 1), (MB, 1), (MB + 1, 3), (3 * MB, 4), (3 * MB + 7, 5)])
def test_split_keeps_every_value_at_most_one_megabyte(size: int, pieces: int) -> None:
    value = os.urandom(size)
    pairs = store_values.split("k", value)
    assert len(pairs) == pieces and all(len(v) <= MB for _, v in pairs)
    assert pairs[-1][0] == "k"  # the key itself is set last: once it exists, the message is whole
    n = store_values.pieces_of(pairs[-1][1])
    if pieces == 1:
        assert n is None and pairs == [("k", value)]
    else:
        assert n == pieces - 1
        assert [k for k, _ in pairs[:-1]] == [store_values.piece_key("k", i) for i in range(n)]
        assert store_values.join("k", pairs[-1][1], [v for _, v in pairs[:-1]]) == value


def test_a_value_that_looks_like_a_header_is_never_taken_for_one() -> None:
    fake = store_values.MAGIC + bytes(16)
    pairs = store_values.split("k", fake)
    assert len(pairs) == 2 and store_values.pieces_of(pairs[1][1]) == 1
    assert store_values.join("k", pairs[1][1], [pairs[0][1]]) == fake


def test_missing_pieces_are_an_error() -> None:
    pairs = store_values.split("k", bytes(2 * MB + 1))
    with pytest.raises(CheckpointError, match="3 of 2000001"):
        store_values.join("k", pairs[-1][1], [v for _, v in pairs[:-2]])


class _Measured(dist.Store):
    """A c10d store that records the size of every value set through it."""

    def __init__(self, inner: dist.Store, sizes: list[int]) -> None:
        super().__init__()
        self.inner, self.sizes = inner, sizes

    def set(self, key: str, value: bytes) -> None:
        self.sizes.append(len(value))
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self.inner.multi_get(keys)

    def check(self, keys: list[str]) -> bool:
        return self.inner.check(keys)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        self.inner.wait(keys, timeout) if timeout is not None else self.inner.wait(keys)

    def delete_key(self, key: str) -> bool:
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        return self.inner.num_keys()


def test_store_channel_carries_long_messages_in_pieces_and_frees_them() -> None:
    sizes: list[int] = []
    store = _Measured(dist.HashStore(), sizes)
    a, b = StoreChannel(store, 0, 2), StoreChannel(store, 1, 2)
    big, small = os.urandom(2 * MB + 123), b"verdict"
    gather(b, "entries", big, timeout=5)
    got = gather(a, "entries", small, timeout=5)
    assert got == [small, big]
    assert max(sizes) <= MB and len(sizes) == 2 + 3  # the long message took 3 pieces and a header
    assert store.num_keys() == 0  # gather deletes what it read, pieces included
    # a long announced value, read by the other rank; an unread long value deleted unread
    announce_sizes = len(sizes)
    b_reads: list[bytes] = []
    t = threading.Thread(target=lambda: b_reads.append(receive(b, "decision", 5)))
    t.start()
    assert announce(a, "decision", big, [1], timeout=5)
    t.join()
    assert b_reads == [big] and max(sizes[announce_sizes:]) <= MB
    b.set("unread", big)
    list(drain(a, []))
    a.delete("unread")  # never fetched by this channel: its pieces go too
    assert store.num_keys() == 0
