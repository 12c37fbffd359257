"""Helpers for tests that edit a real index.json and re-seal it with a valid checksum."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from shardsafe.format.checksum import crc32c
from shardsafe.format.index.versions import decode_index, encode_index


def v1_bytes(data: bytes) -> bytes:
    """Index bytes in the v1 JSON form (saves write v3; these tests forge v1 JSON). A v1
    index (perhaps one a test forged already) is returned as it is."""
    return data if data[:1] == b"{" else encode_index(decode_index(data), version=1)


def read_raw(ckpt: str) -> dict[str, Any]:
    """The parsed v1 JSON of ``ckpt/index.json`` without its checksum member."""
    with open(os.path.join(ckpt, "index.json"), "rb") as f:
        raw = json.loads(v1_bytes(f.read()))
    raw.pop("index_checksum")
    return raw


class _Token(str):
    """Literal JSON text in ``dumps``'s work stack (as opposed to a string value)."""


def dumps(value: Any) -> str:
    """``json.dumps(value, separators=(",", ":"), ensure_ascii=False)`` of dicts (string
    keys), lists and scalars, without recursion: forged indexes nest far deeper than
    Python's recursion limit lets ``json.dumps`` go."""
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, _Token):
            out.append(v)
        elif isinstance(v, (dict, list)):
            pairs = v.items() if isinstance(v, dict) else ((None, x) for x in v)
            seq: list[Any] = [_Token("{" if isinstance(v, dict) else "[")]
            for i, (k, x) in enumerate(pairs):
                seq += [_Token(",")] if i else []
                seq += [] if k is None else [_Token(json.dumps(k, ensure_ascii=False) + ":")]
                seq.append(x)
            seq.append(_Token("}" if isinstance(v, dict) else "]"))
            stack.extend(reversed(seq))
        else:
            out.append(json.dumps(v, ensure_ascii=False))
    return "".join(out)


def deep_copy(value: Any) -> Any:
    """``copy.deepcopy`` of dicts, lists and scalars, without recursion (see ``dumps``)."""
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    while stack:
        v, parent, key = stack.pop()
        if isinstance(v, dict):
            parent[key] = new = dict.fromkeys(v)
            stack.extend((x, new, k) for k, x in v.items())
        elif isinstance(v, list):
            parent[key] = new = [None] * len(v)
            stack.extend((x, new, i) for i, x in enumerate(v))
        else:
            parent[key] = v
    return root[0]


def seal(raw: Any) -> bytes:
    """Encodes ``raw`` like shardsafe does, with a correct trailing index checksum.

    The checksum is right, so whatever rejects the result is the validation, not the CRC.
    Any nesting depth works (``dumps``).
    """
    text = dumps(raw)
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
