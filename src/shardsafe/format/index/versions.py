"""Which index version a save writes, and reading and writing each version.

Saves write ``WRITE_VERSION``; every earlier version stays readable. ``decode`` reads the
bytes of any version into the ``ColumnarIndex`` they all decode into, ``decode_index``
into the ``Index`` of objects built from it on demand; ``encode_columnar`` writes a
``ColumnarIndex`` (what saves build), ``encode_index`` an ``Index`` built as objects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ...errors import CorruptCheckpointError
from .. import INDEX_NAME
from . import v1, v2, v3, v4
from .container import is_container, version_of
from .model import ColumnarIndex
from .objects import Index, from_columnar, to_columnar
from .rows import FileEntry

WRITE_VERSION = v4.VERSION
# the binary versions: each one's encoder and decoder (version 1 is JSON: ``v1``)
_ENCODERS: dict[int, Callable[[ColumnarIndex], bytes]] = {v2.VERSION: v2.encode, v3.VERSION: v3.encode,
                                                           v4.VERSION: v4.encode}
_DECODERS: dict[int, Callable[[bytes], ColumnarIndex]] = {v2.VERSION: v2.decode, v3.VERSION: v3.decode,
                                                           v4.VERSION: v4.decode}
READ_VERSIONS = (v1.VERSION, *_DECODERS)


def encode_columnar(index: ColumnarIndex, version: int = WRITE_VERSION) -> bytes:
    """The bytes of ``index`` in binary format ``version`` (the one saves write by default)."""
    if version not in _ENCODERS:
        raise ValueError(f"index format version {version} is not one this shardsafe writes "
                         f"from columns ({sorted(_ENCODERS)})")
    return _ENCODERS[version](index)


def encode_index(index: Index, version: int | None = None) -> bytes:
    """Serialises ``index`` to the bytes of ``index.json`` in format ``version``; the default
    is the index's own ``format_version`` (1 for indexes built as objects)."""
    version = version or index.format_version
    if version == v1.VERSION:
        return v1.encode(index)
    return encode_columnar(to_columnar(index), version)


def decode(data: bytes) -> tuple[ColumnarIndex, int]:
    """Parses and validates index bytes of any version this shardsafe reads; returns the
    decoded index and its version. Raises CorruptCheckpointError naming the problem."""
    if not is_container(data):
        return v1.decode(data), v1.VERSION
    version = version_of(data)
    if version not in _DECODERS:
        raise CorruptCheckpointError(f"unsupported index header (format_version {version}; this "
                                     f"shardsafe reads {', '.join(map(str, READ_VERSIONS))})", file=INDEX_NAME)
    return _DECODERS[version](data), version


def decode_index(data: bytes) -> Index:
    """``decode`` as an ``Index``: tensor entries and chunk objects are built when asked for."""
    return from_columnar(*decode(data))


def encode_renamed(index: Index, names: Sequence[str]) -> bytes:
    """The index bytes (the version saves write) of a decoded ``index`` with data file row
    ``i`` renamed to ``names[i]`` (the chunk table names files by row, so nothing else
    changes). The result is decoded once to check it: names must be valid and unique
    (FORMAT.md section 2)."""
    if index.table is None or index.infos is None or len(names) != len(index.files):
        raise ValueError("encode_renamed needs a decoded index and one name per data file")
    ci = ColumnarIndex(
        tree=index.tree, tensors=index.infos,
        files=tuple(FileEntry(n, f.size, f.data_start, f.rank) for n, f in zip(names, index.files)),
        chunks=index.table, world_size=index.world_size, created=index.created,
        metadata=index.metadata, library=index.library)
    data = encode_columnar(ci)
    decode(data)
    return data
