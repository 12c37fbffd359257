"""References to data files of sibling checkpoints (incremental saves, FORMAT.md section 13)."""

from __future__ import annotations

import pytest

from shardsafe.errors import CorruptCheckpointError
from shardsafe.format.index.objects import Index, TensorEntry
from shardsafe.format.index.rows import ChunkEntry, FileEntry
from shardsafe.format.index.versions import decode_index, encode_index
from shardsafe.format.index.rows import split_reference, valid_file_name

OWN = "data-r00000-000.safetensors"
REF = "step_00000010/data-r00000-000.safetensors"


def _index(ref_name: str = REF) -> Index:
    return Index(
        tree={"t": "dict", "k": ["base", "adapter"], "v": [{"t": "tensor", "id": 0}, {"t": "tensor", "id": 1}]},
        tensors=(TensorEntry(("base",), "torch", "float32", (4,), (ChunkEntry(ref_name, 4096, 16, (0,), (4,), (7,)),)),
                 TensorEntry(("adapter",), "torch", "float32", (2,), (ChunkEntry(OWN, 4096, 8, (0,), (2,), (9,)),))),
        files=(FileEntry(OWN, 4104, 4096, 0), FileEntry(ref_name, 4160, 4096, 0)),
        block_size=16 << 20)


@pytest.mark.parametrize("version", [1, 2])
def test_reference_rows_round_trip(version: int) -> None:
    index = _index()
    got = decode_index(encode_index(index, version=version))
    assert [f.name for f in got.files] == [OWN, REF]
    assert got.files[1].reference == ("step_00000010", OWN) and got.files[0].reference is None
    assert got.tensors[0].chunks[0].file == REF


def test_an_own_file_and_a_reference_may_share_a_base_name() -> None:
    # the step's own data-r00000-000 and the one of step 10 are different files
    assert {f.name for f in _index().files} == {OWN, REF}


@pytest.mark.parametrize("name", ["../x", "a/../b", "a/b/c", "/a/b", "a//b", ".a/b", "a/.b", "a/",
                                  "/b", "a\\b", "a/index.json", "a/b\n", "..", "a/ b"])
def test_forged_reference_names_are_refused(name: str) -> None:
    assert not valid_file_name(name)
    with pytest.raises(CorruptCheckpointError, match="plain file names"):
        decode_index(encode_index(_index(name), version=2))


def test_split_reference() -> None:
    assert split_reference(OWN) is None
    assert split_reference(REF) == ("step_00000010", OWN)
    assert split_reference("a/b/c") is None
