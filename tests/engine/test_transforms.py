"""The transform conformance suite: every transform of the save pipeline passes the same tests.

As ``test_sinks.py`` does for sinks and ``test_placers.py`` for a load's placers, each test
runs against every transform kind (``KINDS``): the data file's ``Checksum`` and the block
file's ``Compress`` with each codec. Units come from a real feed, on two copy threads, in
whatever order they are ready; the transform must describe exactly the bytes the feed
handed it (every block's CRC32C, every coded block decoding to its raw bytes), leave the
unit's bytes as they were, and say what it is (``inline``, ``coded``) so that the pipeline
never asks for its class.
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


def _make(kind: str) -> tuple[FileUnits, Transform]:
    _, items = flatten(_state())
    if kind == "checksum":
        units = FileUnits(plan_file("f", items), UNIT, BLOCK)
        return units, Checksum(units, sub_size=16 << 10)
    if not codec.available():
        pytest.skip("zstandard is not installed (the compression extra)")
    units = FileUnits(block_layout("b", items, UNIT), UNIT, BLOCK)
    return units, Compress(units, kind, window=2)


def _run(units: FileUnits, transform: Transform) -> tuple[np.ndarray, dict[int, object]]:
    """Feeds every unit through ``transform`` on two copy threads; the image and the outputs by unit."""
    image = HostBuffer(units.plan.layout.size)
    feed = ImageFeed([image])
    outs: dict[int, object] = {}
    lock = threading.Lock()

    def emit(unit: Unit) -> None:
        before = bytes(unit.array)
        out = transform(unit)
        assert bytes(unit.array) == before, "a transform changed the unit's bytes"
        with lock:
            assert unit.k not in outs, f"unit {unit.k} emitted twice"
            outs[unit.k] = out

    feed.stage([_Stream(units)], emit, lambda: None, 2)
    return image.array.copy(), outs


@pytest.mark.parametrize("kind", KINDS)
def test_a_transform_says_what_it_is(kind: str) -> None:
    _, t = _make(kind)
    assert t.coded is (kind != "checksum") and isinstance(t.inline, bool)
    assert t.inline is (kind == "checksum")  # coding is costly: the transform pool runs it


@pytest.mark.parametrize("kind", KINDS)
def test_a_transform_describes_exactly_the_bytes_it_was_handed(kind: str) -> None:
    units, t = _make(kind)
    image, outs = _run(units, t)
    assert sorted(outs) == list(range(units.nunits))
    starts, stops = units.block_start.tolist(), units.block_stop.tolist()
    if isinstance(t, Checksum):
        sums = t.result().flat.tolist()
        assert sums == [crc32c(memoryview(image)[a:b]) for a, b in zip(starts, stops)]
        return
    seen = set()
    for out in outs.values():
        for b, coded in out:  # type: ignore[attr-defined]
            raw = memoryview(image)[starts[b] : stops[b]]
            back = bytearray(len(raw))
            codec.decode(coded.codec, memoryview(coded.data), memoryview(back))
            assert bytes(back) == bytes(raw), f"block {b} decodes to other bytes"
            assert coded.raw_crc == crc32c(raw) and coded.stored_crc == crc32c(memoryview(coded.data))
            seen.add(b)
    assert seen == set(range(units.nblocks_total)), "every block coded once"


def test_a_compressing_transform_codes_what_shrinks() -> None:
    units, t = _make("auto")
    _, outs = _run(units, t)
    codecs = {coded.codec for out in outs.values() for _, coded in out}  # type: ignore[attr-defined]
    assert codecs - {"raw"}, "bf16 weights of small magnitude shrink"
