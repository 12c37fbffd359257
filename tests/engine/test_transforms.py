"""The transform conformance suite: every transform of the save pipeline passes the same tests.

As ``test_sinks.py`` does for sinks and ``test_placers.py`` for a load's placers, each test
runs against every transform kind (``KINDS``): the data file's ``Checksum`` and the block
file's ``Compress`` with each codec. Units come from a real feed, on two copy threads, in
whatever order they are ready; the transform must describe exactly the bytes the feed
handed it (every block's CRC32C; a block file whose every block, read back from what the
transform wrote through its output, decodes to its raw bytes), leave the unit's bytes as
they were, give a unit back once if it is ``coded`` (the pipeline writes and gives back
the others), and say what it is (``inline``, ``coded``) so that the pipeline never asks
for its class.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from shardsafe.engine.buffers import HostBuffer
from shardsafe.engine.save.assembly import block_layout
from shardsafe.engine.save.feeds import ImageFeed, Unit
from shardsafe.engine.save.sources import Sources
from shardsafe.engine.save.transforms import Checksum, Compress, Transform
from shardsafe.engine.save.units import FileUnits
from shardsafe.format import codec
from shardsafe.format.blockfile import MAGIC
from shardsafe.format.checksum import crc32c
from shardsafe.plan.flatten import flatten
from shardsafe.plan.layout import plan_file

BLOCK = 64 << 10
UNIT = 4 * BLOCK
KINDS = ["checksum", "auto", "zstd"]


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return {"w": torch.randn(300_000, generator=g), "h": (torch.randn(70_001, generator=g) * 0.02).to(torch.bfloat16),
            "i": torch.randint(0, 9, (5000,), generator=g, dtype=torch.int8), "e": torch.zeros(0),
            "s": torch.tensor(1.5)}


class _Stream:
    """What a feed needs of a stream."""

    def __init__(self, units: FileUnits) -> None:
        self.units, self.sources = units, Sources(units.plan)

    def live(self) -> bool:
        return True


class _Output:
    """A block file's parts as bytes in memory (what the pipeline's sinks would get)."""

    def __init__(self) -> None:
        self.parts: dict[int, bytearray] = {}
        self.names: dict[int, str] = {}
        self.lock = threading.Lock()

    def open_part(self, part: int, name: str, bound: int) -> None:
        with self.lock:
            self.parts[part], self.names[part] = bytearray(bound), name

    def write(self, part: int, offset: int, data: memoryview, padded: memoryview | None, done) -> None:  # noqa: ANN001
        with self.lock:
            self.parts[part][offset : offset + len(data)] = data
        done()


class _Released:
    """The units a transform gave back (a coded transform gives each back once)."""

    def __init__(self) -> None:
        self.ks: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, unit: Unit) -> None:
        with self.lock:
            self.ks.append(unit.k)


def _make(kind: str) -> tuple[FileUnits, Transform, _Output, _Released]:
    _, items = flatten(_state())
    out, released = _Output(), _Released()
    if kind == "checksum":
        units = FileUnits(plan_file("f", items), UNIT, BLOCK)
        return units, Checksum(units, sub_size=16 << 10), out, released
    if not codec.available():
        pytest.skip("zstandard is not installed (the compression extra)")
    units = FileUnits(block_layout("b", items, UNIT), UNIT, BLOCK)
    return units, Compress(units, kind, 2, out, lambda k: f"b-{k:03d}", released), out, released


def _run(units: FileUnits, transform: Transform) -> np.ndarray:
    """Feeds every unit through ``transform`` on two copy threads, as the pipeline does; the image."""
    image = HostBuffer(units.plan.layout.size)
    feed = ImageFeed([image])
    seen: set[int] = set()
    lock = threading.Lock()

    def emit(unit: Unit) -> None:
        before = bytes(unit.array)
        transform(unit)
        assert bytes(unit.array) == before, "a transform changed the unit's bytes"
        with lock:
            assert unit.k not in seen, f"unit {unit.k} emitted twice"
            seen.add(unit.k)

    feed.stage([_Stream(units)], emit, lambda: None, 2)
    assert seen == set(range(units.nunits))
    return image.array.copy()


@pytest.mark.parametrize("kind", KINDS)
def test_a_transform_says_what_it_is(kind: str) -> None:
    _, t, _, _ = _make(kind)
    assert t.coded is (kind != "checksum") and isinstance(t.inline, bool)
    assert t.inline is (kind == "checksum")  # coding is costly: the transform pool runs it


@pytest.mark.parametrize("kind", KINDS)
def test_a_transform_describes_exactly_the_bytes_it_was_handed(kind: str) -> None:
    units, t, out, released = _make(kind)
    image = _run(units, t)
    starts, stops = units.block_start.tolist(), units.block_stop.tolist()
    raws = [memoryview(image)[a:b] for a, b in zip(starts, stops)]
    result = t.result()
    t.close()
    if not t.coded:
        assert result.flat.tolist() == [crc32c(r) for r in raws]
        assert released.ks == [] and out.parts == {}, "the pipeline writes and gives back an uncoded unit"
        return
    assert sorted(released.ks) == list(range(units.nunits)), "a coded transform gives every unit back once"
    stored = []  # every block in file order: (codec, its bytes in the file, raw CRC32C, stored CRC32C)
    for k, f in enumerate(result):
        data = memoryview(bytes(out.parts[k][: f.size]))
        assert out.names[k] == f.name and bytes(data[: len(MAGIC)]) == MAGIC
        for i, pos in enumerate(f.offsets):
            for cid, n, raw_crc, stored_crc in zip(f.codec[i], f.stored[i], f.sums[i], f.stored_sums[i]):
                name = codec.CODECS[cid]
                n = n if name != "raw" else len(raws[len(stored)])  # a raw block is stored at its size
                stored.append((name, data[pos : pos + n], raw_crc, stored_crc))
                pos += n
    assert len(stored) == len(raws), "every block stored once"
    for b, ((name, block, raw_crc, stored_crc), raw) in enumerate(zip(stored, raws)):
        back = bytearray(len(raw))
        codec.decode(name, block, memoryview(back))
        assert bytes(back) == bytes(raw), f"block {b} decodes to other bytes"
        assert raw_crc == crc32c(raw) and (name == "raw" or stored_crc == crc32c(block))


def test_a_compressing_transform_codes_what_shrinks() -> None:
    units, t, _, _ = _make("auto")
    _run(units, t)
    files = t.result()
    t.close()
    assert {codec.CODECS[c] for f in files for row in f.codec for c in row} - {"raw"}, \
        "bf16 weights of small magnitude shrink"
