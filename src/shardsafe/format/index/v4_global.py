"""The global part of a v4 index, decoded: what every rank holds, and which parts it needs.

``GlobalPart.decode`` checks the header and the global part: the tensor columns (as
version 3 does), the positions of general chunks (inside their tensor, and tiling it
exactly once: the global part holds every chunk's box, so a reader of parts proves each
tensor's layout as a whole read does; a split rule tiles by construction), the files per
part, and the rows of the tensors stored as one chunk (each the whole tensor, one
checksum per block). ``parts_for`` answers which parts hold the chunks a set of regions
overlaps, from each tensor's layout rule alone. ``narrow`` turns the global part and
those parts into a ``ColumnarIndex`` that holds the chosen tensors' chunks they store:
its ``ChunkTable.partial`` is checked as a whole table's chunks are (inside their files,
no overlap, one checksum per block) but does not cover the tensors, and a load plans
and reads on it as on a whole index (docs/FORMAT.md section 15).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import tree
from ..blockfile import BlockCoding
from ..tiling import cover_problem
from .chunk_table import ChunkTable, Split, check_tensor_rows, num_blocks
from .container import CODED_COLUMNS, block_coding, column_views, widen
from .model import ColumnarIndex, TensorInfo
from ..sub_blocks import num_sub_blocks
from .rows import FileEntry
from .rules import MAX_NDIM, bad, check_int, decode_files, header_fields, tree_keys
from .v3 import TENSOR_COLUMNS, tensor_table
from .v4_sub import PART_SUB, WHOLE_SUB, check_sub_count, order_subs, runs_at, sub_size_of
from .v4_layout import (GLOBAL_HEAD, PART_HEAD, Header, check_part, open_section, products, ranges,
                        section_columns, whole_files_member)

GLOBAL_COLUMNS = TENSOR_COLUMNS + ("file", "pos", "extent", "part_files", "whole_offset", "whole_crc32c")
GLOBAL_CODED = ("whole_codec", "whole_stored", "whole_stored_crc32c")
PART_COLUMNS = ("offset", "crc32c")
I64 = np.int64
Region = tuple[int, Sequence[int], Sequence[int]]
"""``(tensor id, offsets, shape)``: a box of a tensor that a rank reads."""
Piece = tuple["Rows", np.ndarray, np.ndarray, "tuple[np.ndarray, ...] | None", "np.ndarray | None"]
"""Rows, their offsets, their block checksums, (compressed indexes) block coding and
(indexes with sub-blocks) sub-block checksums."""


@dataclass(frozen=True, slots=True, eq=False)
class Rows:
    """Chunk rows, numbered as in the whole index's chunk table (``tensor_start[t] + i``).

    Attributes:
        row: The row numbers, ascending.
        tensor: The tensor of each row.
        index: Each row's chunk number within its tensor.
    """

    row: np.ndarray
    tensor: np.ndarray
    index: np.ndarray


@dataclass(frozen=True, slots=True, eq=False)
class TensorLayout:
    """Per tensor, as arrays: what locates its chunks (from the tensor columns).

    Attributes:
        ndim, counts, itemsizes: Dimensions, chunks and bytes per element.
        shape, shape_at: Every tensor's dimensions, flat; ``(T + 1,)`` where each begins.
        tensor_start: ``(T + 1,)`` the first row of each tensor in the whole table.
        split, step, file0, stride: The split rule (``split`` False: general).
    """

    ndim: np.ndarray
    counts: np.ndarray
    itemsizes: np.ndarray
    shape: np.ndarray
    shape_at: np.ndarray
    tensor_start: np.ndarray
    split: np.ndarray
    dim: np.ndarray
    step: np.ndarray
    file0: np.ndarray
    stride: np.ndarray


@dataclass(frozen=True, slots=True, eq=False)
class GlobalPart:
    """A v4 index's header and global part, decoded and checked (``GlobalPart.decode``).

    Attributes:
        header: Where everything lies.
        fields: ``world_size``, ``created``, ``metadata``, ``library``.
        block_size: Checksum block size.
        tree: The state's structure tree.
        infos: Key path, kind, dtype and shape of every tensor.
        splits: Each tensor's ``Split`` rule, or None (general: positions stored).
        layout: The same per tensor, as arrays.
        general: The general tensors' chunks; ``file`` (their file ids) and the flat
            ``pos``/``extent`` (``general_at[t]``: where tensor ``t``'s begin) locate them.
        file_start: ``(P + 1,)`` the first file of each part.
        whole: The rows of the tensors stored as one chunk; ``whole_offset``, their block
            checksums ``whole_sums`` (``whole_blocks[j]``: where the ``j``-th one's begin)
            and, with compressed chunks, ``whole_coding`` (codec, stored size, stored CRC32C).
        whole_files: The rows of the files those lie in, by file id.
        codecs: Codec names of an index with compressed chunks (else None).
        sub_size: The sub-block size of an index that records sub-block checksums (else
            None); ``whole_subs`` those of the tensors stored as one chunk
            (``whole_sub_start[j]``: where the ``j``-th one's begin).
    """

    header: Header
    fields: dict[str, Any]
    block_size: int
    tree: tree.Node
    infos: tuple[TensorInfo, ...]
    splits: tuple[Split | None, ...]
    layout: TensorLayout
    general: Rows
    file: np.ndarray
    pos: np.ndarray
    extent: np.ndarray
    general_at: np.ndarray
    file_start: np.ndarray
    whole: Rows
    whole_offset: np.ndarray
    whole_sums: np.ndarray
    whole_blocks: np.ndarray
    whole_coding: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    whole_files: dict[int, FileEntry]
    codecs: tuple[str, ...] | None
    sub_size: int | None = None
    whole_subs: np.ndarray | None = None
    whole_sub_start: np.ndarray | None = None

    @property
    def num_parts(self) -> int:
        return len(self.file_start) - 1

    @property
    def num_files(self) -> int:
        return int(self.file_start[-1])

    def name(self, t: int) -> str:
        """Tensor ``t``'s key path, for messages."""
        return tree.render_path(self.infos[t].key)

    # ------------------------------------------------------------------ decoding

    @staticmethod
    def decode(head: bytes | memoryview) -> GlobalPart:
        """Checks and decodes the header and the global part in ``head`` (the index's
        first ``Header.head_size`` bytes, or more).

        Raises:
            CorruptCheckpointError: naming the first rule broken.
        """
        header = Header(head)
        raw, section = open_section(header.inflate(head), GLOBAL_HEAD, "global part", header.stored)
        if raw.get("checksum") != "crc32c":
            raise bad(f"unknown checksum algorithm {raw.get('checksum')!r}")
        block_size = check_int(raw.get("block_size"), "block_size", 4096, 1 << 40)
        num_files = check_int(raw.get("files"), "files", 0, 1 << 31)
        sub_size = sub_size_of(raw, block_size)
        views = column_views(raw.get("columns"), section, GLOBAL_COLUMNS + ((WHOLE_SUB,) if sub_size else ()),
                             GLOBAL_CODED)
        keys = tree_keys(raw.get("tree"), len(views["kind"]))  # the tree proves the tensor count
        cols = widen(views, _column_counts(views, header))
        kinds, dtypes, shapes, counts, itemsizes, splits = tensor_table(raw, cols)
        infos = tuple(map(TensorInfo, keys, kinds, dtypes, shapes))

        def name(t: int) -> str:
            return tree.render_path(keys[t])

        check_tensor_rows(shapes, splits, counts, num_files, name)
        part_files = cols["part_files"]
        if len(part_files) != header.parts or int(part_files.sum()) != num_files or (part_files == 0).any():
            raise bad(f"part_files lists {int(part_files.sum())} files in {len(part_files)} parts, the index has "
                      f"{num_files} files in {header.parts} (every part has a file)")
        layout = _layout(cols, counts, itemsizes, splits)
        general, at = _general(layout, cols, num_files, shapes, name)
        whole_t = np.flatnonzero(layout.counts == 1)
        whole = Rows(layout.tensor_start[whole_t], whole_t, np.zeros(len(whole_t), dtype=I64))
        _check_whole(whole_t, general, at, layout, cols, name)
        nbytes = products(layout.shape, layout.shape_at[whole_t], layout.ndim[whole_t]) * layout.itemsizes[whole_t]
        blocks = np.concatenate([[0], np.cumsum(num_blocks(nbytes, block_size))]).astype(I64)
        for c, n in {"whole_offset": len(whole_t), "whole_crc32c": int(blocks[-1])}.items():
            if len(cols[c]) != n:
                raise bad(f"column {c} holds {len(cols[c])} values, the tensors stored as one chunk need {n}")
        whole_files = whole_files_member(raw.get("whole_files"), num_files)
        _check_whole_files(whole_t, general, layout, cols["file"], whole_files, name)
        sub_start = None if sub_size is None else check_sub_count(cols[WHOLE_SUB], nbytes, sub_size, "global part")
        coding = block_coding(raw, {c[len("whole_"):]: cols[c] for c in GLOBAL_CODED if c in cols})
        if coding is not None and len(coding.codec) != int(blocks[-1]):
            raise bad(f"the global part's coding columns must hold one value per block ({int(blocks[-1])})")
        return GlobalPart(
            header, header_fields(raw), block_size, raw["tree"], infos, tuple(splits), layout, general,
            cols["file"], cols["pos"], cols["extent"], at,
            np.concatenate([[0], np.cumsum(part_files)]).astype(I64), whole, cols["whole_offset"],
            cols["whole_crc32c"], blocks, None if coding is None else (coding.codec, coding.stored, coding.checksums),
            whole_files, None if coding is None else coding.codecs, sub_size, cols.get(WHOLE_SUB), sub_start)

    # ------------------------------------------------------------------ which parts

    def parts_for(self, regions: Iterable[Region]) -> list[int]:
        """The parts holding chunks that overlap ``regions``, ascending (the tensors stored
        as one chunk are in the global part: they need none)."""
        lay = self.layout
        split: list[tuple[int, int, int]] = []  # (tensor, first and last element along the cut)
        files: list[np.ndarray] = []
        counts, is_split, dims = lay.counts.tolist(), lay.split.tolist(), lay.dim.tolist()
        for t, offsets, shape in regions:
            if counts[t] < 2 or min(shape, default=1) <= 0:
                continue
            if is_split[t]:
                d = dims[t]
                split.append((t, offsets[d], offsets[d] + shape[d] - 1))
                continue
            nd = len(shape)
            a, b = int(self.general_at[t]), int(self.general_at[t + 1])
            pos, ext = self.pos[a:b].reshape(-1, nd), self.extent[a:b].reshape(-1, nd)
            o, sh = np.asarray(offsets, dtype=I64), np.asarray(shape, dtype=I64)
            meets = (np.minimum(pos + ext, o + sh) > np.maximum(pos, o)).all(axis=1)
            g = int(np.searchsorted(self.general.row, lay.tensor_start[t]))
            files.append(self.file[g : g + counts[t]][meets])
        if split:
            t, first, last = (np.array(c, dtype=I64) for c in zip(*split))
            lo = first // lay.step[t]
            hi = np.minimum(lay.counts[t] - 1, last // lay.step[t])
            n = np.maximum(hi - lo + 1, 0)
            files.append(np.repeat(lay.file0[t], n) + np.repeat(lay.stride[t], n) * ranges(lo, hi + 1))
        if not files:
            return []
        found = np.unique(np.concatenate(files))
        return np.unique(np.searchsorted(self.file_start, found, side="right") - 1).tolist()

    def part_rows(self, k: int) -> Rows:
        """The rows part ``k`` holds: every chunk of a tensor with several chunks whose file
        is one of the part's, in row order."""
        fs, fe = int(self.file_start[k]), int(self.file_start[k + 1])
        lay = self.layout
        ts = np.flatnonzero(lay.split & (lay.counts > 1))
        f0, stride, count = lay.file0[ts], lay.stride[ts], lay.counts[ts]
        flat = stride == 0
        step = np.maximum(stride, 1)
        lo = np.where(flat, 0, np.maximum(0, -((f0 - fs) // step)))
        hi = np.where(flat, np.where((f0 >= fs) & (f0 < fe), count, 0), np.minimum(count, -((f0 - fe) // step)))
        hi = np.maximum(hi, lo)
        g = self.general
        keep = (lay.counts[g.tensor] > 1) & (self.file >= fs) & (self.file < fe)
        tensor = np.concatenate([np.repeat(ts, hi - lo), g.tensor[keep]])
        index = np.concatenate([ranges(lo, hi), g.index[keep]])
        row = lay.tensor_start[tensor] + index
        order = np.argsort(row, kind="stable")
        return Rows(row[order], tensor[order], index[order])

    # ------------------------------------------------------------------ narrowing

    def boxes(self, rows: Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Starts and extents (flat, row after row), file ids and byte lengths of ``rows``."""
        lay, t, i = self.layout, rows.tensor, rows.index
        nd = lay.ndim[t]
        at = np.concatenate([[0], np.cumsum(nd)]).astype(I64)
        ext = lay.shape[ranges(lay.shape_at[t], lay.shape_at[t] + nd)]
        pos = np.zeros_like(ext)
        file = np.empty(len(t), dtype=I64)
        cut = lay.split[t]
        j = np.flatnonzero(cut)
        if len(j):
            tj, ij = t[j], i[j]
            k = at[j] + lay.dim[tj]
            pos[k] = ij * lay.step[tj]
            ext[k] = np.minimum(lay.step[tj], ext[k] - pos[k])
            file[j] = lay.file0[tj] + ij * lay.stride[tj]
        j = np.flatnonzero(~cut)
        if len(j):
            tj, ij = t[j], i[j]
            src = ranges(self.general_at[tj] + ij * nd[j], self.general_at[tj] + (ij + 1) * nd[j])
            dst = ranges(at[j], at[j + 1])
            pos[dst], ext[dst] = self.pos[src], self.extent[src]
            file[j] = self.file[np.searchsorted(self.general.row, rows.row[j])]
        return pos, ext, file, products(ext, at[:-1], nd) * lay.itemsizes[t]

    def narrow(self, parts: Mapping[int, tuple[bytes | memoryview, tuple[int, int, int]]],
               tensors: Iterable[int] | None = None) -> ColumnarIndex:
        """The index restricted to the chunks of ``tensors`` (None: every tensor) that the
        global part and ``parts`` (part -> its bytes and directory entry) hold.

        Raises:
            CorruptCheckpointError: a part does not match its entry or breaks a rule.
        """
        chosen = np.zeros(len(self.infos), dtype=bool)
        chosen[np.fromiter(tensors, dtype=I64) if tensors is not None else slice(None)] = True
        pieces, files = [self._whole_piece(chosen)], dict(self.whole_files)
        for k in sorted(parts):
            data, entry = parts[k]
            check_part(data, k, entry)
            rows = self.part_rows(k)
            nbytes = self.boxes(rows)[3]
            nb = num_blocks(nbytes, self.block_size)
            raw, section = self.open_part(k, data)
            part_files = self.part_files(k, decode_files(raw.get("files")))
            ns = None if self.sub_size is None else num_sub_blocks(nbytes, self.sub_size)
            cols = self.part_columns(k, raw, section, len(rows.row), int(nb.sum()), None if ns is None else int(ns.sum()))
            keep = np.flatnonzero(chosen[rows.tensor])
            starts = np.concatenate([[0], np.cumsum(nb)]).astype(I64)
            blocks = ranges(starts[keep], starts[keep] + nb[keep])
            pieces.append((Rows(rows.row[keep], rows.tensor[keep], rows.index[keep]), cols["offset"][keep],
                           cols["crc32c"][blocks],
                           None if "codec" not in cols else tuple(cols[c][blocks] for c in CODED_COLUMNS),
                           None if ns is None else cols[PART_SUB][runs_at(ns, keep)]))
            for fid, f in part_files.items():
                if files.setdefault(fid, f) != f:
                    raise bad(f"data file {fid} is listed differently in part {k} and the global part")
        return self._assemble(pieces, files)

    def open_part(self, k: int, data: bytes | memoryview) -> tuple[dict[str, Any], memoryview]:
        """Part ``k``'s JSON (checked to name part ``k``) and its column bytes."""
        raw, section = open_section(data, PART_HEAD, f"part {k}")
        if type(raw.get("part")) is not int or raw["part"] != k:  # noqa: E721 - not a bool
            raise bad(f"part {k} says it is part {raw.get('part')!r}")
        return raw, section

    def part_columns(self, k: int, raw: dict[str, Any], section: memoryview, rows: int,
                     blocks: int, subs: int | None = None) -> dict[str, np.ndarray]:
        """Part ``k``'s columns, checked to hold ``rows`` chunks of ``blocks`` blocks in all
        (and ``subs`` sub-blocks, in an index that records them)."""
        names = PART_COLUMNS + ((PART_SUB,) if subs is not None else ()) + (
            CODED_COLUMNS if self.codecs is not None else ())
        counts = {n: rows if n == "offset" else subs if n == PART_SUB else blocks for n in names}
        return section_columns(raw.get("columns"), section, counts, f"part {k}")  # type: ignore[arg-type]

    def part_files(self, k: int, listed: Sequence[FileEntry]) -> dict[int, FileEntry]:
        """Part ``k``'s files by id, checked to be as many as ``part_files`` says."""
        fs = int(self.file_start[k])
        if len(listed) != int(self.file_start[k + 1]) - fs:
            raise bad(f"part {k} lists {len(listed)} files, part_files says {int(self.file_start[k + 1]) - fs}")
        return dict(zip(range(fs, fs + len(listed)), listed))

    def _whole_piece(self, chosen: np.ndarray) -> Piece:
        """The chosen tensors' rows that the global part holds."""
        keep = np.flatnonzero(chosen[self.whole.tensor])
        w = self.whole
        blocks = ranges(self.whole_blocks[keep], self.whole_blocks[keep + 1])
        coding = None if self.whole_coding is None else tuple(c[blocks] for c in self.whole_coding)
        subs = None
        if self.whole_subs is not None and self.whole_sub_start is not None:
            subs = self.whole_subs[ranges(self.whole_sub_start[keep], self.whole_sub_start[keep + 1])]
        return (Rows(w.row[keep], w.tensor[keep], w.index[keep]), self.whole_offset[keep], self.whole_sums[blocks],
                coding, subs)

    def _assemble(self, pieces: Sequence[Piece], files: dict[int, FileEntry]) -> ColumnarIndex:
        """The partial index of the rows of ``pieces``."""
        row = np.concatenate([p[0].row for p in pieces])
        order = np.argsort(row, kind="stable")
        rows = Rows(row[order], np.concatenate([p[0].tensor for p in pieces])[order],
                    np.concatenate([p[0].index for p in pieces])[order])
        pos, ext, file, nbytes = self.boxes(rows)
        nb = num_blocks(nbytes, self.block_size)  # in row order; each piece's blocks are in its own order
        nb_pieces = np.empty_like(nb)
        nb_pieces[order] = nb
        first = np.concatenate([[0], np.cumsum(nb_pieces)]).astype(I64)[:-1]
        block_order = ranges(first[order], first[order] + nb)
        sums = np.concatenate([p[2] for p in pieces])[block_order]
        coding = None
        if self.codecs is not None:
            coding = BlockCoding(self.codecs, *(np.concatenate([p[3][c] for p in pieces])[block_order]  # type: ignore[index]
                                                for c in range(3)))
        sub = None
        if self.sub_size is not None:
            nbytes_pieces = np.empty_like(nbytes)
            nbytes_pieces[order] = nbytes
            sub = order_subs(self.sub_size, [p[4] for p in pieces], nbytes_pieces, order, nbytes)  # type: ignore[misc]
        ids = np.unique(file)
        if len({files[f].name for f in ids.tolist()}) != len(ids):
            raise bad("duplicate or reserved data file name among the parts read")
        table = ChunkTable.partial(
            [i.shape for i in self.infos], self.layout.itemsizes, np.bincount(rows.tensor, minlength=len(self.infos)),
            np.searchsorted(ids, file), np.concatenate([p[1] for p in pieces])[order], nbytes, pos, ext, sums,
            self.block_size, np.array([files[f].size for f in ids.tolist()], dtype=I64),
            np.array([files[f].data_start for f in ids.tolist()], dtype=I64), self.name, coding)
        if sub is not None:
            table = replace(table, sub=sub)
        return ColumnarIndex(tree=self.tree, tensors=self.infos, files=tuple(files[f] for f in ids.tolist()),
                             chunks=table, **self.fields)


# ----------------------------------------------------------------------------- decoding helpers


def _column_counts(views: dict[str, np.ndarray], header: Header) -> dict[str, int]:
    """How many values each column of the global part must hold, from the tensor columns
    (as many values as the tree has tensors) and the header, before anything is widened:
    every chunk of a tensor with several chunks takes at least 5 bytes of the parts (an
    offset and a block checksum), so the parts' size bounds how many there are."""
    t = len(views["kind"])
    per_tensor = {c: t for c in ("kind", "dtype", "ndim", "chunks", "split")}
    tc = widen({c: views[c] for c in per_tensor}, per_tensor)
    ndim, chunks, split = tc["ndim"], tc["chunks"], tc["split"] > 0
    if t and (int(ndim.max()) > MAX_NDIM or int(chunks.max()) > 1 << 40):
        raise bad(f"a tensor has more than {MAX_NDIM} dimensions or 2^40 chunks")
    multi = chunks >= 2
    room = max(0, header.file_size - header.parts_start) // (1 + 4)
    if float(chunks[multi].sum(dtype=np.float64)) > room:
        raise bad(f"the tensors have {float(chunks[multi].sum(dtype=np.float64)):.0f} chunks stored in parts, "
                  f"the index's {header.file_size - header.parts_start} bytes of parts hold at most {room}")
    if len(views["part_files"]) != header.parts:
        raise bad(f"part_files lists the files of {len(views['part_files'])} parts, the index has {header.parts}")
    general = ~split
    boxes = int((chunks * ndim)[general].sum())
    return {**per_tensor, "shape": int(ndim.sum()), "split_step": int(split.sum()), "split_file0": int(split.sum()),
            "split_stride": int(split.sum()), "file": int(chunks[general].sum()), "pos": boxes, "extent": boxes,
            "part_files": header.parts, "whole_offset": int((chunks == 1).sum())}


def _layout(cols: dict[str, np.ndarray], counts: Sequence[int], itemsizes: Sequence[int],
            splits: Sequence[Split | None]) -> TensorLayout:
    """The per-tensor arrays of checked tensor columns."""
    n = len(splits)
    ndim = cols["ndim"]
    counts_a = np.asarray(counts, dtype=I64)
    split = cols["split"] > 0
    rule = {c: np.zeros(n, dtype=I64) for c in ("dim", "step", "file0", "stride")}
    rule["dim"][split] = cols["split"][split] - 1
    rule["step"][split], rule["file0"][split], rule["stride"][split] = (
        cols["split_step"], cols["split_file0"], cols["split_stride"])
    return TensorLayout(ndim, counts_a, np.asarray(itemsizes, dtype=I64), cols["shape"],
                  np.concatenate([[0], np.cumsum(ndim)]).astype(I64),
                  np.concatenate([[0], np.cumsum(counts_a)]).astype(I64), split, **rule)


def _general(lay: TensorLayout, cols: dict[str, np.ndarray], num_files: int, shapes: Sequence[tuple[int, ...]],
             name: Any) -> tuple[Rows, np.ndarray]:
    """The general tensors' chunks, checked (file ids listed, positions inside the tensor,
    the boxes of each tensor tiling it exactly once, as a whole read checks them), and
    ``(T + 1,)`` where each tensor's positions begin in ``pos``/``extent``."""
    gt = np.flatnonzero(~lay.split)
    per = np.zeros(len(lay.split), dtype=I64)
    per[gt] = lay.counts[gt] * lay.ndim[gt]
    at = np.concatenate([[0], np.cumsum(per)]).astype(I64)
    n = int(lay.counts[gt].sum())
    if len(cols["file"]) != n or len(cols["pos"]) != int(at[-1]) or len(cols["extent"]) != int(at[-1]):
        raise bad(f"columns file/pos/extent hold {len(cols['file'])}/{len(cols['pos'])}/{len(cols['extent'])} "
                  f"values, the general tensors' chunks need {n}/{int(at[-1])}/{int(at[-1])}")
    if n and int(cols["file"].max()) >= num_files:
        raise bad(f"a general chunk names file {int(cols['file'].max())} (there are {num_files})")
    tensor = np.repeat(gt, lay.counts[gt])
    index = ranges(np.zeros(len(gt), dtype=I64), lay.counts[gt])
    dims = lay.shape[ranges(np.repeat(lay.shape_at[gt], lay.counts[gt]),
                            np.repeat(lay.shape_at[gt] + lay.ndim[gt], lay.counts[gt]))]
    pos, ext = cols["pos"], cols["extent"]
    inside = (ext <= dims) & (pos <= dims - ext)
    if not inside.all():
        t = int(np.searchsorted(at, int(np.argmin(inside)), side="right")) - 1
        raise bad(f"tensor {name(t)}: a chunk lies outside shape {list(shapes[t])}")
    for t in gt[lay.counts[gt] > 1].tolist():  # a whole read's tiling rule, on every general tensor's boxes
        k, nd = int(lay.counts[t]), int(lay.ndim[t])
        problem = cover_problem(pos[at[t] : at[t + 1]].reshape(k, nd).astype(I64),
                                ext[at[t] : at[t + 1]].reshape(k, nd).astype(I64), shapes[t])
        if problem is not None:
            raise bad(f"tensor {name(t)}: {problem}")
    return Rows(lay.tensor_start[tensor] + index, tensor, index), at


def _check_whole(whole_t: np.ndarray, general: Rows, at: np.ndarray, lay: TensorLayout, cols: dict[str, np.ndarray],
                 name: Any) -> None:
    """The one chunk of a general tensor stored as one chunk is the whole tensor."""
    gw = np.flatnonzero(~lay.split[whole_t])
    if not len(gw):
        return
    t = whole_t[gw]
    flat = ranges(at[t], at[t + 1])
    dims = lay.shape[ranges(lay.shape_at[t], lay.shape_at[t + 1])]
    if cols["pos"][flat].any() or not np.array_equal(cols["extent"][flat], dims):
        first = next(int(x) for x in t.tolist() if cols["pos"][at[x] : at[x + 1]].any()
                     or not np.array_equal(cols["extent"][at[x] : at[x + 1]],
                                           lay.shape[lay.shape_at[x] : lay.shape_at[x + 1]]))
        raise bad(f"tensor {name(first)}: its one chunk is not the whole tensor")


def _check_whole_files(whole_t: np.ndarray, general: Rows, lay: TensorLayout, file: np.ndarray,
                       whole_files: dict[int, FileEntry], name: Any) -> None:
    """``whole_files`` lists exactly the files of the tensors stored as one chunk."""
    wfile = lay.file0[whole_t].copy()
    gw = np.flatnonzero(~lay.split[whole_t])
    if len(gw):
        wfile[gw] = file[np.searchsorted(general.row, lay.tensor_start[whole_t[gw]])]
    listed = np.fromiter(whole_files, dtype=I64, count=len(whole_files))
    missing = np.flatnonzero(~np.isin(wfile, listed))
    if len(missing):
        j = int(missing[0])
        raise bad(f"tensor {name(int(whole_t[j]))}: its one chunk lies in data file {int(wfile[j])}, "
                  "which whole_files does not list")
    extra = np.setdiff1d(listed, wfile)
    if len(extra):
        raise bad(f"whole_files lists data file {int(extra[0])}, which holds no tensor stored as one chunk")

