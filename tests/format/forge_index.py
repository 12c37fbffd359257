"""Helpers for tests that edit a real index.json and re-seal it with a valid checksum."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from shardsafe.format.checksum import crc32c
from shardsafe.format.index import decode_index, encode_index


def v1_bytes(data: bytes) -> bytes:
    """Index bytes in the v1 JSON form (saves write v2; these tests forge v1 JSON). A v1
    index (perhaps one a test forged already) is returned as it is."""
    return data if data[:1] == b"{" else encode_index(decode_index(data), version=1)


def read_raw(ckpt: str) -> dict[str, Any]:
    """The parsed v1 JSON of ``ckpt/index.json`` without its checksum member."""
    with open(os.path.join(ckpt, "index.json"), "rb") as f:
        raw = json.loads(v1_bytes(f.read()))
    raw.pop("index_checksum")
    return raw


def seal(raw: Any) -> bytes:
    """Encodes ``raw`` like shardsafe does, with a correct trailing index checksum.

    The checksum is right, so whatever rejects the result is the validation, not the CRC.
    """
    text = json.dumps(raw, separators=(",", ":"), ensure_ascii=False)
    if not (isinstance(raw, dict) and raw):
        prefix = text.encode()  # not an object: append the trailer anyway
        return prefix + b',"index_checksum":"crc32c:%08x"}\n' % crc32c(prefix)
    prefix = text[:-1].encode("utf-8")
    return prefix + b',"index_checksum":"crc32c:%08x"}\n' % crc32c(prefix)


def reseal_text(sealed: bytes, old: bytes, new: bytes) -> bytes:
    """Replaces ``old`` with ``new`` in sealed index bytes (raw text, e.g. a NaN literal or
    invalid UTF-8 that json.dumps cannot produce) and recomputes the trailer checksum."""
    assert old in sealed
    text = sealed.replace(old, new, 1)
    body = text[: text.rindex(b',"index_checksum"')]
    return body + b',"index_checksum":"crc32c:%08x"}\n' % crc32c(body)


def write_raw(ckpt: str, raw: Any) -> None:
    with open(os.path.join(ckpt, "index.json"), "wb") as f:
        f.write(seal(raw))


def edited(raw: dict[str, Any], fn) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    fn(out)
    return out
