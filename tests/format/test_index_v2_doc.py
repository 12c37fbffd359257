"""docs/FORMAT.md section 11 cannot drift from the code: its v2 worked example is run and its
hexdump must be exactly the bytes the encoder writes (and decode back to the same index)."""

from __future__ import annotations

import os
import re
import struct

from shardsafe.format.index.versions import decode_index

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "FORMAT.md")


def _block(marker: str) -> str:
    with open(DOC, encoding="utf-8") as f:
        m = re.search(rf"<!-- {marker} -->\n```[a-z]*\n(.*?)\n```", f.read(), re.S)
    assert m, f"docs/FORMAT.md lost its {marker} block"
    return m.group(1)


def _hexdump_bytes(text: str) -> bytes:
    lines = text.splitlines()
    out = bytearray()
    for line in lines[:-1]:
        if line == "*":
            raise AssertionError("the example hexdump shows every line")
        m = re.fullmatch(r"([0-9a-f]{8})  ([0-9a-f ]+?) +\|(.*)\|", line)
        assert m, f"not a hexdump -C line: {line!r}"
        assert int(m.group(1), 16) == len(out)
        out += bytes.fromhex(m.group(2).replace(" ", ""))
    assert int(lines[-1], 16) == len(out)
    return bytes(out)


def _documented_run() -> dict:
    scope: dict = {}
    exec(compile(_block("v2-example-index"), "docs/FORMAT.md", "exec"), scope)  # noqa: S102
    return scope


def test_v2_example_hexdump_is_what_the_encoder_writes() -> None:
    scope = _documented_run()
    assert _hexdump_bytes(_block("v2-example-hexdump")) == scope["data"]


def test_v2_example_decodes_to_its_index() -> None:
    scope = _documented_run()
    decoded = decode_index(scope["data"])
    assert decoded.format_version == 2 and decoded.tensors == scope["index"].tensors


def test_v2_example_numbers_in_the_prose() -> None:
    data = _documented_run()["data"]
    _, version, hsize, jlen, clen = struct.unpack_from("<8sIIQQ", data)
    assert (version, hsize, jlen, clen, len(data)) == (2, 32, 765, 72, 876)
    assert 32 + jlen + (-jlen % 8) == 0x320
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    assert f"`data` is {len(data)} bytes" in doc and f"= `0x{struct.unpack('<I', data[-4:])[0]:08x}`" in doc


def test_v2_example_is_the_golden_index() -> None:
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    from test_index_v2 import _golden

    assert _documented_run()["data"] == _golden()
