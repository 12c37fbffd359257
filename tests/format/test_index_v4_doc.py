"""docs/FORMAT.md section 15 cannot drift from the code: its v4 worked example is run, its
hexdump must be exactly the bytes the encoder writes, and the numbers of its prose must
be those bytes'."""

from __future__ import annotations

import struct

from test_index_v2_doc import DOC, _block, _hexdump_bytes

from shardsafe.format.checksum import crc32c
from shardsafe.format.index.versions import decode_index, encode_index


def _documented_run() -> dict:
    scope: dict = {}
    exec(compile(_block("v4-example-index"), "docs/FORMAT.md", "exec"), scope)  # noqa: S102
    return scope


def test_v4_example_hexdump_is_what_the_encoder_writes() -> None:
    scope = _documented_run()
    assert _hexdump_bytes(_block("v4-example-hexdump")) == scope["data"]


def test_v4_example_decodes_to_the_index_of_its_v3_twin() -> None:
    scope = _documented_run()
    v4 = decode_index(scope["data"])
    v3 = decode_index(encode_index(scope["index"], version=3))
    assert v4.format_version == 4 and v4.tensors == scope["index"].tensors == v3.tensors
    assert v4.tree == v3.tree and v4.files == v3.files and v4.table == v3.table


def test_v4_example_numbers_in_the_prose() -> None:
    data = _documented_run()["data"]
    _, version, hsize, size, stored, raw, parts, codec, gcrc, _, hcrc = struct.unpack_from("<8sIIQQQQIIII", data)
    assert (version, hsize, size, stored, raw, parts, codec) == (4, 64, len(data), 848, 848, 2, 0)
    entries = [struct.unpack_from("<QII", data, 0x390 + 16 * k) for k in range(2)]
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    section = doc[doc.index("## 15. Index format version 4") :]
    assert f"`data` is {len(data)} bytes" in section and f"`S` = `0x{size:x}` = {size}" in section
    assert f"CRC32C `0x{gcrc:08x}`" in section and f"CRC32C `0x{hcrc:08x}`" in section
    assert hcrc == crc32c(data[:60]) and gcrc == crc32c(data[64 : 64 + stored])
    assert entries == [(0x3B0, 192, entries[0][2]), (0x470, 168, entries[1][2])]
    for off, n, crc in entries:
        assert f"at `0x{off:x}`, {n} bytes, CRC32C `0x{crc:08x}`" in section
        assert crc == crc32c(data[off : off + n])
