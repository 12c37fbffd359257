"""Writer and loader agree on valid strings: what loads saves again; lone surrogates neither load nor save."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest
import torch

import shardsafe
from shardsafe.errors import CorruptCheckpointError

# the tests/format helpers re-seal a forged index with a correct checksum
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "format"))
from forge_index import read_raw, reseal_text, seal  # noqa: E402

TRICKY = ["", "\x00", "\uffff", "\U0001f600", "\u2028\u2029", "a\\ud800", "\\\\udc00", "é" * 3, "\ud7ff\ue000"]


@pytest.mark.parametrize("text", TRICKY, ids=[ascii(t) for t in TRICKY])
def test_strings_that_load_save_again(tmp_path, text: str) -> None:
    state = {text: text, "nested": {"k": [text, (text,)]}, "key": {(text, 1): pathlib.PurePosixPath("p" + text)}}
    shardsafe.save(state, str(tmp_path / "a"), metadata={"note": text})
    got = shardsafe.load(str(tmp_path / "a"))
    assert got == state
    shardsafe.save(got, str(tmp_path / "b"), metadata={"note": text})  # and back out again
    assert shardsafe.load(str(tmp_path / "b")) == state


LONE = [
    ("value", lambda s: {"v": s}),
    ("key", lambda s: {s: 1}),
    ("tuple key", lambda s: {"d": {(s,): 1}}),
    ("set member", lambda s: {"v": {s}}),
    ("path", lambda s: {"v": pathlib.PurePosixPath(s)}),
]


@pytest.mark.parametrize(("make", "surrogate"), [(m, s) for _, m in LONE for s in ("\ud800", "x\udfff")],
                         ids=[f"{n}-{i}" for n, _ in LONE for i in (0, 1)])
def test_lone_surrogates_are_refused_on_save(tmp_path, make, surrogate: str) -> None:
    with pytest.raises(TypeError, match="surrogate"):
        shardsafe.save(make(surrogate), str(tmp_path / "c"))
    assert os.listdir(tmp_path) == []


def test_lone_surrogate_in_metadata_is_refused_on_save(tmp_path) -> None:
    with pytest.raises(ValueError):
        shardsafe.save({"a": 1}, str(tmp_path / "c"), metadata={"m": "\udc80"})
    assert os.listdir(tmp_path) == []


def _write(ckpt: str, data: bytes) -> None:
    with open(os.path.join(ckpt, "index.json"), "wb") as f:
        f.write(data)


PLACES = [
    ("str value", lambda raw: raw["tree"]["v"].__setitem__(0, {"t": "str", "v": "MARK"})),
    ("dict key", lambda raw: raw["tree"]["k"].__setitem__(0, "MARK")),
    ("tensor key", lambda raw: (raw["tensors"][0].__setitem__("key", ["MARK"]),
                                raw["tree"]["k"].__setitem__(1, "MARK"))),
    ("metadata", lambda raw: raw["metadata"].__setitem__("m", "MARK")),
    ("library", lambda raw: raw.__setitem__("library", "MARK")),
]


@pytest.mark.parametrize("escape", [b"\\ud800", b"\\uDC00", b"\\ud83d\\ud83d", b"\\\\\\ud800"])
@pytest.mark.parametrize(("edit",), [(e,) for _, e in PLACES], ids=[n for n, _ in PLACES])
def test_lone_surrogates_are_refused_on_load(tmp_path, edit, escape: bytes) -> None:
    ckpt = str(tmp_path / "c")
    shardsafe.save({"s": "x", "w": torch.ones(2)}, ckpt)
    raw = read_raw(ckpt)
    edit(raw)
    _write(ckpt, reseal_text(seal(raw), b"MARK", escape))
    with pytest.raises(CorruptCheckpointError, match="surrogate"):
        shardsafe.load(ckpt)


def test_an_escaped_surrogate_pair_from_another_writer_loads_and_saves_again(tmp_path) -> None:
    ckpt = str(tmp_path / "c")
    shardsafe.save({"s": "x"}, ckpt)
    raw = read_raw(ckpt)
    raw["tree"]["v"][0]["v"] = "MARK"
    _write(ckpt, reseal_text(seal(raw), b"MARK", b"\\ud83d\\ude00 \\\\ud800"))
    got = shardsafe.load(ckpt)
    assert got == {"s": "\U0001f600 \\ud800"}
    shardsafe.save(got, str(tmp_path / "again"))
    assert shardsafe.load(str(tmp_path / "again")) == got
