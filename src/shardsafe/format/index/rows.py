"""The rows of an index as objects: data files, chunks and how compressed chunks are stored,
and the names a data file row may carry (docs/FORMAT.md sections 2, 12 and 13).

A leaf of ``format.index``: ``format.blockfile`` and the chunk table build on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .. import INDEX_NAME

# fullmatch, not match + "$": "$" also matches before a trailing newline
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# A reference (incremental saves, docs/FORMAT.md section 13): "<sibling directory>/<file>",
# both parts plain names as above, so neither can be "." or ".." nor hold a separator.
REFERENCE = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,127})/([A-Za-z0-9][A-Za-z0-9._-]{0,127})")
# A step made self-contained after a rollback (section 13, engine/detach.py) names a hard
# link of each file it referenced "ref<row>-<file>" (or "ref<row>.<ext>", "ref<row>.<n>"):
# like a reference, such a file also holds chunks of the step that wrote it.
LINK_PREFIX = "ref"
LINKED_FILE = re.compile(LINK_PREFIX + r"[0-9]{5}[-.].*")


@dataclass(frozen=True, slots=True)
class FileEntry:
    """A data file of the checkpoint (every index version lists the same members).

    Attributes:
        name: File name relative to the checkpoint directory (no separators).
        size: Exact size in bytes.
        data_start: Offset of the first data byte (end of the safetensors header).
        rank: The rank that wrote it.
    """

    name: str
    size: int
    data_start: int
    rank: int = 0

    @property
    def reference(self) -> tuple[str, str] | None:
        """``(sibling directory, file name)`` when this row references a data file of another
        checkpoint next to this one (an incremental save); None for the checkpoint's own file."""
        return split_reference(self.name)


def split_reference(name: str) -> tuple[str, str] | None:
    """``(directory, file)`` of a reference name ``<directory>/<file>``; None for a plain name."""
    m = REFERENCE.fullmatch(name)
    return (m.group(1), m.group(2)) if m else None


def valid_file_name(name: str) -> bool:
    """A data file name an index may list: a plain name, or a reference to a sibling's file."""
    if FILE_NAME.fullmatch(name):
        return True
    ref = split_reference(name)
    return ref is not None and ref[1] != INDEX_NAME


@dataclass(frozen=True, slots=True)
class StoredBlocks:
    """How a compressed chunk's checksum blocks are stored (docs/FORMAT.md section 12).

    The chunk's bytes in its file are its blocks' stored forms back to back, from the
    chunk's ``offset``; block ``i`` decodes to the ``i``-th ``block_size`` slice of the
    chunk's raw bytes.

    Attributes:
        codecs: Codec name of each block (``"raw"``: stored as is).
        sizes: Stored size of each block in bytes.
        checksums: CRC32C of each block's stored bytes (checked before decoding).
    """

    codecs: tuple[str, ...]
    sizes: tuple[int, ...]
    checksums: tuple[int, ...]

    @property
    def starts(self) -> tuple[int, ...]:
        """Where each block's stored bytes begin, relative to the chunk's offset."""
        out, pos = [], 0
        for n in self.sizes:
            out.append(pos)
            pos += n
        return tuple(out)

    @property
    def nbytes(self) -> int:
        """Stored bytes of the whole chunk."""
        return sum(self.sizes)


@dataclass(frozen=True, slots=True)
class ChunkEntry:
    """A contiguous, row-major block of a tensor stored in one data file.

    Attributes:
        file: Name of the data file holding the bytes.
        offset: Absolute byte offset of the chunk in that file.
        nbytes: Number of bytes (``prod(shape) * itemsize``).
        offsets: Position of the chunk in the global tensor, one entry per dimension.
        shape: Shape of the chunk.
        checksums: CRC32C of each ``block_size`` slice of the chunk's (decoded) bytes.
        stored: How the blocks are coded, for a compressed chunk; None for a chunk stored
            raw (its ``nbytes`` bytes at ``offset``).
        sub_checksums: CRC32C of each sub-block of the raw bytes (``format.sub_blocks``),
            where the index records them; empty otherwise. Not part of equality: an index
            says the same with or without them.
    """

    file: str
    offset: int
    nbytes: int
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    checksums: tuple[int, ...]
    stored: StoredBlocks | None = None
    sub_checksums: tuple[int, ...] = field(default=(), compare=False)

    @property
    def stored_nbytes(self) -> int:
        """Bytes the chunk occupies in its file."""
        return self.nbytes if self.stored is None else self.stored.nbytes
