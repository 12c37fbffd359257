"""Golden bytes of the data-file layout: a safetensors header padded to a 4096-byte data start."""

from __future__ import annotations

import json
import struct

import pytest

from shardsafe.format.datafile import ALIGN, Slot, layout, parse_header, safetensors_header

SLOTS = [Slot("a", "float16", (3,)), Slot("b", "float64", (2,)), Slot("c", "bfloat16", (1,)),
         Slot("d", "complex32", (2,))]

GOLDEN_JSON = (b'{"__metadata__":{"format":"pt","writer":"shardsafe"},'
               b'"b":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},'
               b'"d":{"dtype":"U8","shape":[8],"data_offsets":[16,24]},'
               b'"a":{"dtype":"F16","shape":[3],"data_offsets":[24,30]},'
               b'"c":{"dtype":"BF16","shape":[1],"data_offsets":[30,32]}}')


def test_golden_header_and_offsets() -> None:
    lay = layout(SLOTS)
    # 8-byte little-endian length, the JSON, spaces up to the 4096-byte data start
    assert lay.header == struct.pack("<Q", ALIGN - 8) + GOLDEN_JSON + b" " * (ALIGN - 8 - len(GOLDEN_JSON))
    assert lay.header[:8] == b"\xf8\x0f\x00\x00\x00\x00\x00\x00"
    assert lay.data_start == 4096
    # offsets are given in slot order; the data section holds them largest itemsize first
    assert lay.offsets == (4096 + 24, 4096 + 0, 4096 + 30, 4096 + 16)
    assert lay.size == 4096 + 32


def test_empty_file() -> None:
    lay = layout([])
    text = b'{"__metadata__":{"format":"pt","writer":"shardsafe"}}'
    assert lay.header == struct.pack("<Q", 4088) + text + b" " * (4088 - len(text))
    assert lay.offsets == () and lay.size == 4096


def test_header_longer_than_a_page_rounds_up() -> None:
    slots = [Slot(f"tensor-with-a-rather-long-name-{i:04d}", "float32", (1,)) for i in range(60)]
    lay = layout(slots)
    assert lay.data_start % ALIGN == 0 and lay.data_start > ALIGN
    (n,) = struct.unpack("<Q", lay.header[:8])
    assert n == lay.data_start - 8
    assert lay.header.endswith(b" ")
    start, entries = parse_header(lay.header)
    assert start == lay.data_start and len(entries) == 61


@pytest.mark.parametrize("dtypes", [
    ["bool", "complex128", "int16", "float32", "uint64", "float8_e4m3fn"],
    ["uint8", "uint8", "int64"],
    ["complex64", "float4_e2m1fn_x2", "float8_e8m0fnu", "int32"],
])
def test_every_slot_is_aligned_to_its_itemsize_and_contiguous(dtypes: list[str]) -> None:
    from shardsafe.format.dtypes import lookup

    slots = [Slot(f"s{i}", d, (3, i + 1)) for i, d in enumerate(dtypes)]
    lay = layout(slots)
    spans = sorted((off, off + s.nbytes) for off, s in zip(lay.offsets, slots))
    assert spans[0][0] == lay.data_start and spans[-1][1] == lay.size  # no holes at either end
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))          # none in between
    for off, s in zip(lay.offsets, slots):
        assert (off - lay.data_start) % lookup(s.dtype).itemsize == 0
    _, entries = parse_header(lay.header)
    for off, s in zip(lay.offsets, slots):
        assert entries[s.name]["data_offsets"] == [off - lay.data_start, off - lay.data_start + s.nbytes]


def test_reserved_and_duplicate_slot_names_are_refused() -> None:
    with pytest.raises(ValueError):
        layout([Slot("__metadata__", "float32", (1,))])
    with pytest.raises(ValueError):
        layout([Slot("x", "float32", (1,)), Slot("x", "int8", (1,))])


@pytest.mark.parametrize("prefix", [b"", b"\x01\x00", struct.pack("<Q", 100) + b"{}",
                                    struct.pack("<Q", 2) + b"[]"])
def test_parse_header_rejects(prefix: bytes) -> None:
    with pytest.raises(ValueError):
        parse_header(prefix)


def test_header_is_valid_json_when_padding_is_stripped() -> None:
    lay = layout(SLOTS)
    assert json.loads(lay.header[8:].rstrip(b" ")) == json.loads(GOLDEN_JSON)


def test_safetensors_header_pads_the_data_section_to_the_alignment() -> None:
    tensors = [("w", "F32", (2, 3), 24), ("b", "U8", (5,), 5)]
    for align in (8, ALIGN):
        header = safetensors_header({"format": "pt"}, tensors, align)
        assert len(header) % align == 0
        start, entries = parse_header(header)
        assert start == len(header)
        assert entries == {"__metadata__": {"format": "pt"},
                           "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                           "b": {"dtype": "U8", "shape": [5], "data_offsets": [24, 29]}}
    assert len(safetensors_header({}, [], 8)) == 32  # 8-byte length + 19 bytes of JSON, padded
