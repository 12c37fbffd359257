"""Index format version 4: the index in parts, so that each rank reads what it needs, once.

At 16,384 ranks a checkpoint has ~16 million chunks and a ~130 MB index, while a rank
restoring its own shard needs a few kilobytes of it. Version 4 stores what version 3
stores (decoding a whole version 4 index gives the ``ColumnarIndex`` of the version 3
index of the same checkpoint), laid out so that it can be read in parts (docs/FORMAT.md
section 15 is the byte-by-byte spec; ``v4_layout`` the offsets)::

    header      sizes, the number of parts, CRC32Cs
    global      what every rank needs: the tree, metadata, the tensor columns with each
                tensor's layout rule (version 3's), the positions of general chunks, the
                files per part, and the offset and checksums of every tensor stored as
                one chunk (with the rows of its files); zlib-compressed when large
    directory   per part: where it lies, its length and CRC32C
    parts       part k: the rows of the data files one rank wrote, and the offset and
                checksums of every chunk of a tensor with several chunks in those files

A reader takes the header and the global part (``v4_global.GlobalPart``), decides from
the layout rules which parts hold the chunks its targets overlap, and reads those
directory entries and parts by byte range (``GlobalPart.narrow``). This module writes
the whole index and reads it whole.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import replace
from typing import Any

import numpy as np

from ..blockfile import BlockCoding
from ..checksum import ALGORITHM, crc32c
from ..sub_blocks import SubBlocks, num_sub_blocks
from .chunk_table import ChunkTable, num_blocks
from .container import CODED_COLUMNS, stored_columns
from .model import ColumnarIndex
from .rules import JSON_VALUES_FLOOR, JSON_VALUES_PER_BYTE, bad, decode_files, encode_files, json_values
from .v3 import tensor_columns
from .v4_sub import PART_SUB, WHOLE_SUB
from .v4_global import GLOBAL_CODED, GLOBAL_COLUMNS, PART_COLUMNS, GlobalPart
from .v4_layout import (ENTRY, GLOBAL_HEAD, HEADER, MAGIC, PART_HEAD, RAW, VERSION, ZLIB, blocks_of, check_part,
                        describe, files_per_part, group_rows, max_inflated, pack_section, pad8, products, ranges)

__all__ = ["VERSION", "COMPRESS_MIN", "encode", "decode"]

COMPRESS_MIN = 4096  # the encoder compresses a global part of at least this many bytes
I64 = np.int64


# ----------------------------------------------------------------------------- encoding


def _global(index: ColumnarIndex, part_files: np.ndarray, whole: np.ndarray) -> bytes:
    """The global part's raw bytes (``whole``: the rows of the tensors stored as one chunk)."""
    ct = index.chunks
    dtypes, cols = tensor_columns(index.tensors, ct)
    general = stored_columns(ct)
    blocks = blocks_of(ct.block_start, whole)
    cols.update(file=general["file"], pos=general["pos"], extent=general["extent"], part_files=part_files,
                whole_offset=ct.offset[whole], whole_crc32c=ct.checksums[blocks])
    names = GLOBAL_COLUMNS
    if ct.sub is not None:
        cols[WHOLE_SUB] = ct.sub.rows(whole)
        names += (WHOLE_SUB,)
    if ct.coding is not None:
        cd = ct.coding
        cols.update(whole_codec=cd.codec[blocks], whole_stored=cd.stored[blocks],
                    whole_stored_crc32c=cd.checksums[blocks])
        names += GLOBAL_CODED
    body: dict[str, Any] = {
        "library": index.library, "created": index.created, "world_size": index.world_size,
        "checksum": ALGORITHM, "block_size": ct.block_size}
    if ct.sub is not None:
        body["sub_block_size"] = ct.sub.size
    body.update({"metadata": index.metadata, "files": len(index.files), "dtypes": dtypes,
                 "columns": describe(cols, names)})
    if ct.coding is not None:
        body["codecs"] = list(ct.coding.codecs)
    body["whole_files"] = [[i, *encode_files([index.files[i]])] for i in np.unique(ct.file[whole]).tolist()]
    body["tree"] = index.tree
    return pack_section(body, cols, GLOBAL_HEAD)


def _parts(index: ColumnarIndex, part_files: np.ndarray, rows: np.ndarray, bounds: np.ndarray) -> list[bytes]:
    """Every part's bytes: the rows of its files and its chunks' offsets and checksums
    (``rows`` grouped by part, part ``k``'s at ``bounds[k]:bounds[k + 1]``). Each column
    has one element type in every part (the narrowest for the whole index), so a part's
    columns are slices of one buffer per column."""
    ct = index.chunks
    nb = ct.block_start[rows + 1] - ct.block_start[rows]
    blocks = blocks_of(ct.block_start, rows)
    cols = {"offset": ct.offset[rows], "crc32c": ct.checksums[blocks]}
    names = PART_COLUMNS
    per: dict[str, np.ndarray] = {"offset": np.ones(len(rows), dtype=I64), "crc32c": nb}  # values per row
    if ct.sub is not None:
        cols[PART_SUB] = ct.sub.rows(rows)
        per[PART_SUB] = ct.sub.start[rows + 1] - ct.sub.start[rows]
        names += (PART_SUB,)
    if ct.coding is not None:
        cd = ct.coding
        cols.update(codec=cd.codec[blocks], stored=cd.stored[blocks], stored_crc32c=cd.checksums[blocks])
        names += CODED_COLUMNS
    kinds = {n: d[0] for n, d in describe(cols, names).items()}
    bufs = [np.ascontiguousarray(cols[n], dtype=kinds[n]).tobytes() for n in names]
    sizes = [np.dtype(kinds[n]).itemsize for n in names]
    at = {n: np.concatenate([[0], np.cumsum(per.get(n, nb))])[bounds].tolist() for n in names}
    first = np.concatenate([[0], np.cumsum(part_files)]).tolist()
    esc = json.encoder.encode_basestring  # what json.dumps uses with ensure_ascii=False
    rows_json = [f'{{"name":{esc(f.name)},"size":{f.size},"data_start":{f.data_start},"rank":{f.rank}}}'
                 for f in index.files]
    out = []
    for k in range(len(part_files)):
        spans = [(at[n][k], at[n][k + 1]) for n in names]
        desc = ",".join(f'"{n}":["{kinds[n]}",{e - a}]' for n, (a, e) in zip(names, spans))
        text = (f'{{"part":{k},"files":[{",".join(rows_json[first[k] : first[k + 1]])}],'
                f'"columns":{{{desc}}}}}').encode("utf-8")
        pieces = [PART_HEAD.pack(len(text)), text, bytes(pad8(PART_HEAD.size + len(text)))]
        for buf, size, (a, e) in zip(bufs, sizes, spans):
            pieces += [buf[a * size : e * size], bytes(pad8((e - a) * size))]
        out.append(b"".join(pieces))
    return out


def _readable_compressed(raw: bytes, stored: int) -> bool:
    """Whether readers accept ``raw`` (a global part) stored as ``stored`` zlib bytes: it
    inflates within ``max_inflated`` and its JSON within ``rules.check_json_size``."""
    (n,) = GLOBAL_HEAD.unpack_from(raw)
    values = json_values(raw[GLOBAL_HEAD.size : GLOBAL_HEAD.size + n])
    return len(raw) <= max_inflated(stored) and values <= JSON_VALUES_FLOOR + JSON_VALUES_PER_BYTE * stored


def encode(index: ColumnarIndex, *, compress: bool | None = None) -> bytes:
    """The bytes of a version 4 index. Each run of consecutive data files written by one
    rank makes a part; the global part is zlib-compressed (level 9) when it holds at
    least ``COMPRESS_MIN`` bytes (``compress`` forces the choice)."""
    ct = index.chunks
    part_files = files_per_part(index.files)
    whole, rows, bounds = group_rows(ct.tensor_start, ct.file, part_files)
    raw = _global(index, part_files, whole)
    codec = ZLIB if (len(raw) >= COMPRESS_MIN if compress is None else compress) else RAW
    stored = zlib.compress(raw, 9) if codec == ZLIB else raw
    if codec == ZLIB and not _readable_compressed(raw, len(stored)):
        codec, stored = RAW, raw  # what compresses beyond the readers' bounds is stored as it is
    parts = _parts(index, part_files, rows, bounds)
    at = HEADER.size + len(stored) + pad8(len(stored)) + ENTRY.size * len(parts)
    entries = []
    for p in parts:
        entries.append(ENTRY.pack(at, len(p), crc32c(p)))
        at += len(p)
    head = HEADER.pack(MAGIC, VERSION, HEADER.size, at, len(stored), len(raw), len(parts), codec,
                       crc32c(stored), 0, 0)[: HEADER.size - 4]
    head += crc32c(head).to_bytes(4, "little")
    return b"".join([head, stored, b"\0" * pad8(len(stored)), *entries, *parts])


# ----------------------------------------------------------------------------- decoding


def _every_row(g: GlobalPart) -> tuple[np.ndarray, np.ndarray]:
    """The file id and byte length of every chunk row of the whole table."""
    lay = g.layout
    n = int(lay.tensor_start[-1])
    file, nbytes = np.empty(n, dtype=I64), np.empty(n, dtype=I64)
    ts = np.flatnonzero(lay.split & (lay.counts > 0))
    count = lay.counts[ts]
    rows = ranges(lay.tensor_start[ts], lay.tensor_start[ts + 1])
    local = rows - np.repeat(lay.tensor_start[ts], count)
    file[rows] = np.repeat(lay.file0[ts], count) + local * np.repeat(lay.stride[ts], count)
    size = lay.shape[lay.shape_at[ts] + lay.dim[ts]]  # the cut dimension's length
    inner = products(lay.shape, lay.shape_at[ts], lay.ndim[ts]) // np.maximum(size, 1) * lay.itemsizes[ts]
    nbytes[rows] = np.repeat(lay.step[ts] * inner, count)
    nbytes[lay.tensor_start[ts + 1] - 1] = (size - (count - 1) * lay.step[ts]) * inner  # the last part's
    _, _, gfile, gbytes = g.boxes(g.general)
    file[g.general.row], nbytes[g.general.row] = gfile, gbytes
    return file, nbytes


def decode(data: bytes) -> ColumnarIndex:
    """Parses and validates a whole version 4 index; raises CorruptCheckpointError naming
    the problem. Everything is checked as for version 3 (``ChunkTable.build``), and each
    part, its directory entry and the global part's file rows against each other."""
    g = GlobalPart.decode(data)
    h = g.header
    if len(data) != h.file_size:
        raise bad(f"index is {len(data)} bytes, its header says {h.file_size} (truncated?)")
    view = memoryview(data)
    entries = h.entries(view[h.directory : h.parts_start], 0)
    at = h.parts_start
    for k, (off, n, _) in enumerate(entries):
        if off != at:
            raise bad(f"directory: part {k} begins at {off}, the parts before it end at {at}")
        at += n
    if at != h.file_size:
        raise bad(f"the parts end at {at}, the index at {h.file_size}")
    file, nbytes = _every_row(g)
    whole, rows, bounds = group_rows(g.layout.tensor_start, file, np.diff(g.file_start))
    block_start = np.concatenate([[0], np.cumsum(num_blocks(nbytes, g.block_size))]).astype(I64)
    offset = np.empty(len(file), dtype=I64)
    sums = np.empty(int(block_start[-1]), dtype=np.uint32)
    coded = [np.empty(len(sums), dtype=I64) for _ in CODED_COLUMNS] if g.codecs is not None else []
    offset[whole] = g.whole_offset
    blocks = blocks_of(block_start, whole)
    sums[blocks] = g.whole_sums
    for c, col in zip(coded, g.whole_coding or ()):
        c[blocks] = col
    nb = block_start[rows + 1] - block_start[rows]
    block_at = np.concatenate([[0], np.cumsum(nb)])[bounds].tolist()
    row_at = bounds.tolist()
    sub_start = sub_at = None
    if g.sub_size is not None:
        sub_start = np.concatenate([[0], np.cumsum(num_sub_blocks(nbytes, g.sub_size))]).astype(I64)
        sub_at = np.concatenate([[0], np.cumsum(sub_start[rows + 1] - sub_start[rows])])[bounds].tolist()
    listed: list[Any] = []
    cols: dict[str, list[np.ndarray]] = {}
    for k, entry in enumerate(entries):
        part = view[entry[0] : entry[0] + entry[1]]
        check_part(part, k, entry)
        raw, section = g.open_part(k, part)
        if not isinstance(raw.get("files"), list):
            raise bad(f"part {k}: files must be a list")
        listed.append(raw["files"])
        for n, c in g.part_columns(k, raw, section, row_at[k + 1] - row_at[k], block_at[k + 1] - block_at[k],
                                   None if sub_at is None else sub_at[k + 1] - sub_at[k]).items():
            cols.setdefault(n, []).append(c)
    files = decode_files([f for part in listed for f in part])  # one check: every name once
    at = 0
    for k, part in enumerate(listed):
        g.part_files(k, files[at : at + len(part)])
        at += len(part)
    blocks = blocks_of(block_start, rows)
    if cols:
        offset[rows] = np.concatenate(cols["offset"])
        sums[blocks] = np.concatenate(cols["crc32c"])
        for c, name in zip(coded, CODED_COLUMNS):
            c[blocks] = np.concatenate(cols[name])
    for fid, f in g.whole_files.items():
        if files[fid] != f:
            raise bad(f"data file {fid} is listed differently in the global part and in its part")
    sub = None
    if sub_start is not None:
        subs = np.empty(int(sub_start[-1]), dtype=np.uint32)
        subs[ranges(sub_start[whole], sub_start[whole + 1])] = g.whole_subs
        if cols:
            subs[ranges(sub_start[rows], sub_start[rows + 1])] = np.concatenate(cols[PART_SUB])
        sub = SubBlocks(g.sub_size, subs, sub_start)
    table = ChunkTable.build(
        [i.shape for i in g.infos], g.layout.itemsizes.tolist(), g.splits, g.layout.counts.tolist(), offset,
        g.file, g.pos, g.extent, sums, g.block_size, np.array([f.size for f in files], dtype=I64),
        np.array([f.data_start for f in files], dtype=I64), g.name,
        None if g.codecs is None else BlockCoding(g.codecs, coded[0], coded[1], coded[2].astype(np.uint32)))
    if sub is not None:
        table = replace(table, sub=sub)
    return ColumnarIndex(tree=g.tree, tensors=g.infos, files=tuple(files), chunks=table, **g.fields)
