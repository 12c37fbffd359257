"""docs/FORMAT.md cannot drift from the code: its worked example and dtype table are checked.

The example's Python snippet is run as written; the index it produces must equal the
doc's (apart from the clock and the library version), the doc's index checksum must be
right for the doc's own bytes, and every hexdump line must be the data file's bytes.
"""

from __future__ import annotations

import json
import os
import re

import pytest

torch = pytest.importorskip("torch")

from shardsafe.format.checksum import crc32c  # noqa: E402
from shardsafe.format.dtypes import DTYPES  # noqa: E402
from shardsafe.format.index.versions import decode_index, encode_index  # noqa: E402
from shardsafe.format.index.container import version_of  # noqa: E402

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "FORMAT.md")
VOLATILE = ("created", "library", "index_checksum")


def _doc() -> str:
    with open(DOC, encoding="utf-8") as f:
        return f.read()


def _block(marker: str) -> str:
    """The fenced code block that follows ``<!-- marker -->`` in the doc."""
    m = re.search(rf"<!-- {marker} -->\n```[a-z]*\n(.*?)\n```", _doc(), re.S)
    assert m, f"docs/FORMAT.md lost its {marker} block"
    return m.group(1)


def _compact(obj: dict) -> bytes:
    """The writer's encoding rule (section 4.1), applied to an object without its trailer."""
    body = {k: v for k, v in obj.items() if k != "index_checksum"}
    prefix = json.dumps(body, ensure_ascii=False, allow_nan=False,
                        separators=(",", ":"))[:-1].encode("utf-8")
    return prefix + b',"index_checksum":"crc32c:%08x"}\n' % crc32c(prefix)


@pytest.fixture
def written(tmp_path, monkeypatch) -> str:
    monkeypatch.chdir(tmp_path)
    # the doc's own snippet, run as a reader would copy it (trusted: it is this repository)
    exec(compile(_block("example-state"), "docs/FORMAT.md", "exec"), {})  # noqa: S102
    return str(tmp_path / "ckpt")


def test_example_index_is_what_the_code_writes(written: str) -> None:
    with open(os.path.join(written, "index.json"), "rb") as f:
        stored = f.read()
    # saves write format 4 (section 15); the example shows the same index in the v1 JSON form
    assert version_of(stored) == 4
    raw = encode_index(decode_index(stored), version=1)
    actual = json.loads(raw)
    documented = json.loads(_block("example-index"))
    assert {k: v for k, v in documented.items() if k not in VOLATILE} == \
        {k: v for k, v in actual.items() if k not in VOLATILE}
    assert list(documented) == list(actual)  # member order, index_checksum last
    assert actual["library"].startswith("shardsafe ")
    # the file is exactly the compact encoding of its own object, trailer included ...
    assert raw == _compact(actual)
    # ... so the doc's checksum, computed the same way for its `created`, must be right
    trailer = re.search(rb'"index_checksum":"(crc32c:[0-9a-f]{8})"}\n$', _compact(documented))
    assert documented["index_checksum"] == trailer.group(1).decode()
    assert decode_index(_compact(documented)).metadata == {"step": 7}


def test_example_hexdump_is_the_data_file(written: str) -> None:
    with open(os.path.join(written, "data-r00000-000.safetensors"), "rb") as f:
        data = f.read()
    lines = _block("example-hexdump").splitlines()
    assert int(lines[-1], 16) == len(data)  # hexdump's last line: the file size
    prev: bytes | None = None
    prev_end = 0
    for line in lines[:-1]:
        if line == "*":  # hexdump: the previous line repeats up to the next offset shown
            continue
        m = re.fullmatch(r"([0-9a-f]{8})  ([0-9a-f ]+?) +\|(.*)\|", line)
        assert m, f"not a hexdump -C line: {line!r}"
        off = int(m.group(1), 16)
        want = bytes.fromhex(m.group(2).replace(" ", ""))
        if off > prev_end:  # the region hidden behind "*"
            assert prev is not None and data[prev_end:off] == prev * ((off - prev_end) // len(prev))
        assert data[off:off + len(want)] == want, f"hexdump line at {off:#x} differs"
        prev, prev_end = want, off + len(want)
    assert prev_end == len(data)


def test_checksum_check_values_in_the_doc() -> None:
    doc = _doc()
    assert "is `e3069283`" in doc and crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes.fromhex("0000c03f000000c0")) == 0xA432A922
    assert crc32c(bytes.fromhex("010001")) == 0x374EB207
    assert crc32c(b"") == 0


def test_dtype_table_matches_the_code() -> None:
    section = _doc().split("## 8. Element types", 1)[1].split("## 9.", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| (\d+) \| ([^|]+) \| ([^|]+) \|", section, re.M)
    documented = {name: (int(size), code.strip().strip("`"), np_.strip().strip("`"))
                  for name, size, code, np_ in rows}
    actual = {d.name: (d.itemsize, d.safetensors or "—", d.numpy or "—") for d in DTYPES.values()}
    assert documented == actual
