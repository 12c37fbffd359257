"""A checkpoint written by the format-v1 writer (committed under tests/fixtures) still loads
bit-exactly, and with its index rewritten in every later version it loads the same."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys

import pytest

torch = pytest.importorskip("torch")

import shardsafe  # noqa: E402
from shardsafe.format.index.versions import decode_index, encode_index  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")
CKPT = os.path.join(FIXTURES, "v1_checkpoint")
sys.path.insert(0, FIXTURES)
from make_v1_checkpoint import fixture_state  # noqa: E402
from helpers import assert_same  # noqa: E402


def test_v1_fixture_is_v1() -> None:
    with open(os.path.join(CKPT, "index.json"), "rb") as f:
        raw = f.read()
    assert raw.startswith(b'{"format_version":1,')
    assert decode_index(raw).format_version == 1


def test_v1_fixture_loads_bit_exactly() -> None:
    assert_same(shardsafe.load(CKPT), fixture_state())


def test_v1_fixture_loads_bit_exactly_in_place() -> None:
    target = fixture_state()
    for t in target["model"].values():
        t.zero_()
    target["optim"][0]["exp_avg"].zero_()
    shardsafe.load(CKPT, target)
    assert_same(target, fixture_state())


@pytest.mark.parametrize("version", [2, 3, 4])
def test_v1_fixture_with_its_index_rewritten_loads_the_same(tmp_path, version: int) -> None:  # noqa: ANN001
    """Every version loads the same bytes, whole and in place (which reads a version 4
    index in parts and every earlier one whole)."""
    with open(os.path.join(CKPT, "index.json"), "rb") as f:
        v1 = decode_index(f.read())
    raw = encode_index(v1, version=version)
    back = decode_index(raw)
    assert back.format_version == version
    if version < 4:
        assert dataclasses.replace(back, format_version=1) == v1
    copy = tmp_path / "ckpt"
    shutil.copytree(CKPT, copy)
    (copy / "index.json").write_bytes(raw)
    assert_same(shardsafe.load(str(copy)), fixture_state())
    target = fixture_state()
    for t in target["model"].values():
        t.zero_()
    target["optim"][0]["exp_avg"].zero_()
    shardsafe.load(str(copy), target)
    assert_same(target, fixture_state())
