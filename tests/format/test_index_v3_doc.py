"""docs/FORMAT.md section 14 cannot drift from the code: its v3 worked example is run and its
hexdump must be exactly the bytes the encoder writes (and decode back to the same index)."""

from __future__ import annotations

import struct

from test_index_v2_doc import _block, _hexdump_bytes

from shardsafe.format.index.versions import decode_index, encode_index

DOC_NUMBERS = (3, 32, 742, 144, 924)


def _documented_run() -> dict:
    scope: dict = {}
    exec(compile(_block("v3-example-index"), "docs/FORMAT.md", "exec"), scope)  # noqa: S102
    return scope


def test_v3_example_hexdump_is_what_the_encoder_writes() -> None:
    scope = _documented_run()
    assert _hexdump_bytes(_block("v3-example-hexdump")) == scope["data"]


def test_v3_example_decodes_to_the_index_of_its_v2_twin() -> None:
    scope = _documented_run()
    v3 = decode_index(scope["data"])
    v2 = decode_index(encode_index(scope["index"], version=2))
    assert v3.format_version == 3 and v3.tensors == scope["index"].tensors == v2.tensors
    assert v3.tree == v2.tree and v3.files == v2.files and v3.table == v2.table


def test_v3_example_numbers_in_the_prose() -> None:
    data = _documented_run()["data"]
    _, version, hsize, jlen, clen = struct.unpack_from("<8sIIQQ", data)
    assert (version, hsize, jlen, clen, len(data)) == DOC_NUMBERS
    assert 32 + jlen + (-jlen % 8) == 0x308
    from test_index_v2_doc import DOC

    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    assert f"`data` is {len(data)} bytes" in doc and f"= `0x{struct.unpack('<I', data[-4:])[0]:08x}`" in doc
