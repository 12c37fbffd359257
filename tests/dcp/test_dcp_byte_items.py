"""DCP's byte items through Writer and Reader: typed values on save; on load nothing from
the checkpoint is unpickled unless allow_pickle=True. Every forged input carries a pickle
that creates a sentinel file when unpickled: the sentinel never appears without
allow_pickle (and does with it, which shows the forged input was live)."""

from __future__ import annotations

import collections
import os
import random
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from forge_dcp import bytes_node, payload, random_record, rewrite, torch_bytes
from torch.distributed.checkpoint.api import CheckpointException

import shardsafe
from shardsafe.dcp import Reader, Writer


def _failure(info: pytest.ExceptionInfo) -> BaseException:
    (exc, _), = info.value.failures.values()
    return exc


def _refused(path: str, target: dict[str, Any], key: str) -> None:
    with pytest.raises(CheckpointException) as info:
        dcp.load(target, storage_reader=Reader(path))
    exc = _failure(info)
    assert isinstance(exc, shardsafe.CheckpointError) and repr(key) in str(exc), exc


def test_genuine_values_round_trip_typed_without_allow_pickle(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "ckpt")
    sd = {"w": torch.arange(6.0), "step": 7, "lr": 2.5e-4, "name": "run-1", "none": None,
          "sizes": {"a": torch.Size([2, 3]), "b": torch.Size([])}, "hist": [1, 2.5, "x"],
          "cfg": {"betas": (0.9, 0.95), "tags": ["a", "b"], "on": True}, "blob": b"\x00\x01",
          "od": collections.OrderedDict(x=1), "dt": torch.bfloat16}
    dcp.save(sd, storage_writer=Writer(path))
    got = shardsafe.load(path)  # typed values, not DCP's bytes
    assert type(got["step"]) is int and got["step"] == 7 and got["lr"] == 2.5e-4
    assert type(got["sizes"]["a"]) is torch.Size and got["sizes"]["a"] == torch.Size([2, 3])
    assert got["cfg"]["betas"] == (0.9, 0.95) and got["blob"] == b"\x00\x01" and got["dt"] is torch.bfloat16
    target = {"w": torch.zeros(6), "step": 0, "lr": 0.0, "name": "", "none": 1,
              "sizes": {"a": torch.Size([]), "b": torch.Size([1])}, "hist": [],
              "cfg": {"betas": (), "tags": [], "on": False}, "blob": b"",
              "od": collections.OrderedDict(x=0), "dt": torch.float32}  # DCP loads the target's keys
    dcp.load(target, storage_reader=Reader(path))
    for k in sd:
        if k != "w":
            assert target[k] == sd[k] and type(target[k]) is type(sd[k]), k
    assert type(target["sizes"]["a"]) is torch.Size and torch.equal(target["w"], sd["w"])
    # an in-place shardsafe.load restores step as an int, not as bytes
    inplace = {"w": torch.zeros(6), "step": 0}
    shardsafe.load(path, inplace, strict=False)
    assert inplace["step"] == 7 and type(inplace["step"]) is int


class _Custom:
    """A class PyTorch's restricted unpickler refuses."""

    def __init__(self) -> None:
        self.v = 3


def test_refused_values_are_kept_as_marked_pickles(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "ckpt")
    dcp.save({"w": torch.ones(2), "obj": _Custom(), "step": 1}, storage_writer=Writer(path))
    assert isinstance(shardsafe.load(path)["obj"], bytes)  # never unpickled by shardsafe
    _refused(path, {"w": torch.zeros(2), "obj": None, "step": 0}, "obj")
    target = {"w": torch.zeros(2), "obj": None, "step": 0}
    dcp.load(target, storage_reader=Reader(path, allow_pickle=True))
    assert isinstance(target["obj"], _Custom) and target["obj"].v == 3 and target["step"] == 1
    # a target without the pickled value loads without allow_pickle
    target = {"w": torch.zeros(2), "step": 0}
    dcp.load(target, storage_reader=Reader(path))
    assert target["step"] == 1


def test_pickle_in_a_shardsafe_save_bytes_value(tmp_path) -> None:  # noqa: ANN001
    sentinel = str(tmp_path / "SENTINEL")
    for n, record in enumerate([{"version": "1.0.0", "properties": {}},
                                {"byte_items": "typed", "pickles": ["extra"]},
                                {"byte_items": "typed", "pickles": []}]):
        path = str(tmp_path / f"ckpt{n}")
        shardsafe.save({"w": torch.ones(3), "extra": payload(sentinel)}, path, metadata={"dcp": record})
        _refused(path, {"w": torch.zeros(3), "extra": 0}, "extra")
        assert not os.path.exists(sentinel)
    dcp.load({"w": torch.zeros(3), "extra": 0}, storage_reader=Reader(path, allow_pickle=True))
    assert os.path.exists(sentinel)  # the forged input was live


def test_bytes_of_a_plain_shardsafe_save_are_values(tmp_path) -> None:  # noqa: ANN001
    sentinel, path = str(tmp_path / "SENTINEL"), str(tmp_path / "ckpt")
    raw = payload(sentinel)
    shardsafe.save({"extra": raw}, path)  # no DCP record: a bytes value, never DCP's pickle
    target = {"extra": 0}
    dcp.load(target, storage_reader=Reader(path))
    assert target["extra"] == raw and not os.path.exists(sentinel)


def test_pickle_in_a_writer_checkpoints_byte_item(tmp_path) -> None:  # noqa: ANN001
    sentinel, path = str(tmp_path / "SENTINEL"), str(tmp_path / "ckpt")
    dcp.save({"w": torch.ones(3), "step": 5, "blob": b"ok"}, storage_writer=Writer(path))
    rewrite(path, leaves={"step": bytes_node(payload(sentinel))})
    _refused(path, {"w": torch.zeros(3), "step": 0, "blob": b""}, "step")
    rewrite(path, leaves={"step": {"t": "int", "v": 5}, "blob": bytes_node(payload(sentinel))})
    target = {"w": torch.zeros(3), "step": 0, "blob": b""}
    dcp.load(target, storage_reader=Reader(path))  # named in the record as a bytes value: served as bytes
    assert target["blob"] == payload(sentinel) and not os.path.exists(sentinel)
    dcp.load({"w": torch.zeros(3), "step": 0}, storage_reader=Reader(path))
    assert not os.path.exists(sentinel)


def test_pickle_in_the_dcp_record(tmp_path) -> None:  # noqa: ANN001
    sentinel, path = str(tmp_path / "SENTINEL"), str(tmp_path / "ckpt")
    text = payload(sentinel).decode("latin-1")
    dcp.save({"w": torch.ones(3), "step": 5}, storage_writer=Writer(path))
    for record in [text, [text], {"version": text}, {"properties": text}, {"properties": {"w": text}},
                   {"byte_items": text}, {"byte_items": "typed", "pickles": text},
                   {"byte_items": "typed", "pickles": [], "bytes": [text], "x": text}]:
        rewrite(path, metadata={"dcp": record})
        with pytest.raises(shardsafe.CorruptCheckpointError, match="DCP record"):
            Reader(path).read_metadata()
        # DCP turns any read_metadata error into its "metadata is None" AssertionError,
        # with the reader's message
        with pytest.raises(CheckpointException, match="DCP record"):
            dcp.load({"w": torch.zeros(3), "step": 0}, storage_reader=Reader(path))
    assert not os.path.exists(sentinel)


@pytest.mark.parametrize("record", [[1, 2], 7, {"properties": [1]}, {"properties": 3},
                                    {"properties": {"w": "requires_grad"}},
                                    {"properties": {"w": ["requires_grad"]}},
                                    {"properties": {"w": {"requires_grad": 1}}}])
def test_read_metadata_refuses_malformed_records(tmp_path, record: Any) -> None:  # noqa: ANN001
    """Lists, ints and strings where the record has objects: CorruptCheckpointError from
    read_metadata itself (not an AttributeError surfacing in DCP as "metadata is None")."""
    path = str(tmp_path / "ckpt")
    shardsafe.save({"w": torch.ones(3)}, path, metadata={"dcp": record})
    with pytest.raises(shardsafe.CorruptCheckpointError, match="DCP record"):
        Reader(path).read_metadata()


def test_old_writer_checkpoints_keep_loading(tmp_path) -> None:  # noqa: ANN001
    """A checkpoint as earlier Writers made it (DCP's bytes as bytes values, a record with
    only version and properties): refused by name, loaded with allow_pickle=True."""
    path = str(tmp_path / "ckpt")
    old_record = {"version": "1.0.0", "properties": {}}
    shardsafe.save({"w": torch.ones(3), "step": torch_bytes(41)}, path, metadata={"dcp": old_record})
    _refused(path, {"w": torch.zeros(3), "step": 0}, "step")
    target = {"w": torch.zeros(3), "step": 0}
    dcp.load(target, storage_reader=Reader(path, allow_pickle=True))
    assert target["step"] == 41 and torch.equal(target["w"], torch.ones(3))


def test_random_forged_records_run_nothing(tmp_path) -> None:  # noqa: ANN001
    sentinel, base = str(tmp_path / "SENTINEL"), str(tmp_path / "base")
    dcp.save({"w": torch.ones(3), "step": 5, "lr": 0.5}, storage_writer=Writer(base))
    rng = random.Random(33)
    for case in range(40):
        path = str(tmp_path / f"c{case}")
        os.makedirs(path)
        for f in os.listdir(base):
            with open(os.path.join(base, f), "rb") as src, open(os.path.join(path, f), "wb") as dst:
                dst.write(src.read())
        leaves = {rng.choice(["step", "lr"]): bytes_node(payload(sentinel))} if rng.random() < 0.7 else {}
        rewrite(path, metadata={"dcp": random_record(rng, sentinel, ["w", "step", "lr"])}, leaves=leaves)
        try:
            Reader(path).read_metadata()
        except shardsafe.CheckpointError:
            continue
        try:
            dcp.load({"w": torch.zeros(3), "step": 0, "lr": 0.0}, storage_reader=Reader(path))
        except CheckpointException as e:
            for exc, _ in e.failures.values():
                assert isinstance(exc, shardsafe.CheckpointError), (case, exc)
        assert not os.path.exists(sentinel), case
    assert not os.path.exists(sentinel)
