"""Golden bytes of index.json and the round trip of a valid index."""

from __future__ import annotations

import pytest

from shardsafe.format.checksum import software_crc32c
from shardsafe.format.index.objects import Index, TensorEntry
from shardsafe.format.index.rows import ChunkEntry, FileEntry
from shardsafe.format.index.versions import decode_index, encode_index

DATA = "data-r00000-000.safetensors"

INDEX = Index(
    tree={"t": "dict", "k": ["w", 3], "v": [{"t": "tensor", "id": 0}, {"t": "float", "v": "nan"}]},
    tensors=(TensorEntry(("w",), "torch", "float32", (2,),
                         (ChunkEntry(DATA, 4096, 8, (0,), (2,), (0x12345678,)),)),),
    files=(FileEntry(DATA, 4104, 4096, 0),),
    block_size=16 << 20, created=1.5, library="shardsafe test")

GOLDEN_BODY = (
    b'{"format_version":1,"library":"shardsafe test","created":1.5,"world_size":1,'
    b'"checksum":"crc32c","block_size":16777216,"metadata":{},'
    b'"files":[{"name":"data-r00000-000.safetensors","size":4104,"data_start":4096,"rank":0}],'
    b'"tensors":[{"key":["w"],"kind":"torch","dtype":"float32","shape":[2],'
    b'"chunks":[{"file":"data-r00000-000.safetensors","offset":4096,"nbytes":8,"offsets":[0],'
    b'"shape":[2],"crc32c":["12345678"]}]}],'
    b'"tree":{"t":"dict","k":["w",3],"v":[{"t":"tensor","id":0},{"t":"float","v":"nan"}]}'
)
GOLDEN = GOLDEN_BODY + b',"index_checksum":"crc32c:f76813d4"}\n'


def test_golden_bytes() -> None:
    assert encode_index(INDEX) == GOLDEN


def test_trailer_is_crc32c_of_everything_before_it() -> None:
    assert software_crc32c(GOLDEN_BODY) == 0xF76813D4


def test_decode_golden_round_trips() -> None:
    assert decode_index(GOLDEN) == INDEX
    assert encode_index(decode_index(GOLDEN)) == GOLDEN


def test_non_ascii_keys_are_utf8() -> None:
    idx = Index(tree={"t": "dict", "k": ["größe"], "v": [{"t": "str", "v": "日本"}]},
                tensors=(), files=(), block_size=4096)
    raw = encode_index(idx)
    assert "größe".encode() in raw and "日本".encode() in raw
    assert decode_index(raw) == idx


def test_metadata_round_trips() -> None:
    idx = Index(tree={"t": "dict", "k": [], "v": []}, tensors=(), files=(), block_size=4096,
                metadata={"step": 7, "note": "x", "nested": {"a": [1, 2.5, None, True]}})
    assert decode_index(encode_index(idx)).metadata == idx.metadata


def test_metadata_must_be_json() -> None:
    idx = Index(tree={"t": "dict", "k": [], "v": []}, tensors=(), files=(), block_size=4096,
                metadata={"bad": float("nan")})
    with pytest.raises(ValueError):
        encode_index(idx)
