"""The chunk table: every chunk of a checkpoint as numpy columns (every index version).

A ``ChunkTable`` holds one row per chunk, grouped by tensor (tensor 0's chunks first),
in int64 columns: data file id, absolute byte offset and byte length, plus the CRC32C of
every checksum block. Where each chunk sits inside its tensor is stored in one of two
forms:

* a **split** (``Split``): the tensor is cut along one dimension into parts of ``step``
  elements (the last may be shorter), part ``i`` in file ``file0 + i * file_stride``;
  that is FSDP's layout, and it costs one rule instead of a row of positions per chunk;
* **general**: the chunk's start and extent per dimension, kept for those tensors only in
  two flat arrays (``pos``, ``extent``; tensor ``t``'s part reshapes to ``(chunks, ndim)``).

``validate`` checks an untrusted table with vectorised numpy in time and memory linear in
its size; ``tensor_chunks`` gives one tensor's chunks as arrays (a view, no per-chunk
Python objects), which is what a load planner reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import attrgetter, getitem, is_not

import numpy as np

from ..blockfile import RAW, BlockCoding, check_coding
from ..sub_blocks import SubBlocks
from ..tiling import cover_problem
from .rules import bad

I64 = np.int64


@dataclass(frozen=True, slots=True)
class Split:
    """A tensor cut evenly along ``dim``: part ``i`` covers ``[i*step, min((i+1)*step, size))``.

    Attributes:
        dim: The dimension that is cut.
        step: Elements per part along ``dim`` (the last part may hold fewer).
        file0: Data file id of part 0.
        file_stride: Part ``i`` is in file ``file0 + i * file_stride`` (0: all in one file).
    """

    dim: int
    step: int
    file0: int
    file_stride: int


@dataclass(frozen=True, slots=True)
class TensorChunks:
    """The chunks of one tensor as arrays (rows ``start`` .. ``start + len(file)`` of the table).

    Attributes:
        start: Row of the first chunk in the table (index into its columns).
        pos: ``(chunks, ndim)`` start of each chunk in the global tensor.
        extent: ``(chunks, ndim)`` shape of each chunk.
        file: Data file id of each chunk.
        offset: Absolute byte offset of each chunk in its file.
        nbytes: Byte length of each chunk.
    """

    start: int
    pos: np.ndarray
    extent: np.ndarray
    file: np.ndarray
    offset: np.ndarray
    nbytes: np.ndarray


def num_blocks(nbytes: np.ndarray, block_size: int) -> np.ndarray:
    """Checksum blocks per chunk: ``max(1, ceil(nbytes / block_size))`` (a 0-byte chunk has one)."""
    if block_size & (block_size - 1) == 0:  # a power of two (what writers use): shift, don't divide
        out = nbytes + (block_size - 1)
        out >>= block_size.bit_length() - 1
        return np.maximum(out, 1, out=out)
    return np.maximum(1, -(-nbytes // block_size))


@dataclass(frozen=True, slots=True, eq=False)
class ChunkTable:
    """Every chunk of an index, columnar. Build with ``ChunkTable.build``.

    Attributes:
        shapes: Global shape of each tensor.
        itemsizes: Bytes per element of each tensor.
        splits: Each tensor's ``Split``, or None where its chunks are stored in general form.
        tensor_start: ``(tensors + 1,)`` first row of each tensor's chunks (last: row count).
        file, offset, nbytes: Per-chunk columns (int64).
        pos, extent: Flat starts / extents of the general tensors' chunks (int64).
        general_start: ``(tensors + 1,)`` where each tensor's part of ``pos``/``extent`` begins.
        checksums: CRC32C of every block (uint32), chunk by chunk.
        block_start: ``(rows + 1,)`` first checksum of each chunk.
        block_size: Checksum block size in bytes.
        coding: How each block is stored, when some chunk is compressed (else None).
        whole: Whether the chunks cover every tensor (False: a ``partial`` table).
        sub: The sub-block checksums of the chunks, where the index records them (not
            part of equality, like ``ChunkEntry.sub_checksums``).
    """

    shapes: tuple[tuple[int, ...], ...]
    itemsizes: np.ndarray
    splits: tuple[Split | None, ...]
    tensor_start: np.ndarray
    file: np.ndarray
    offset: np.ndarray
    nbytes: np.ndarray
    pos: np.ndarray
    extent: np.ndarray
    general_start: np.ndarray
    checksums: np.ndarray
    block_start: np.ndarray
    block_size: int
    coding: BlockCoding | None = None
    whole: bool = True
    sub: SubBlocks | None = None

    @property
    def num_chunks(self) -> int:
        return int(self.tensor_start[-1])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ChunkTable):
            return NotImplemented
        arrays = ("itemsizes", "tensor_start", "file", "offset", "nbytes", "pos", "extent",
                  "general_start", "checksums", "block_start")
        return (self.shapes == other.shapes and self.splits == other.splits
                and self.block_size == other.block_size and self.coding == other.coding
                and all(np.array_equal(getattr(self, a), getattr(other, a)) for a in arrays))

    def chunk_checksums(self, row: int) -> np.ndarray:
        """The block checksums of chunk ``row``."""
        return self.checksums[self.block_start[row] : self.block_start[row + 1]]

    def stored_nbytes(self) -> np.ndarray:
        """Bytes each chunk occupies in its file (``nbytes`` unless compressed)."""
        return self.nbytes if self.coding is None else self.coding.chunk_nbytes

    def chunk_coding(self, row: int) -> tuple[tuple[str, ...], np.ndarray, np.ndarray] | None:
        """Chunk ``row``'s (codec names, stored sizes, stored checksums) per block, or None
        when every block of it is stored raw (it then reads like an uncompressed chunk)."""
        cd = self.coding
        if cd is None:
            return None
        a, b = int(self.block_start[row]), int(self.block_start[row + 1])
        ids = cd.codec[a:b]
        if not ids.any() and cd.codecs[0] == RAW:
            return None
        names = tuple(cd.codecs[i] for i in ids.tolist())
        if all(n == RAW for n in names):
            return None
        return names, cd.stored[a:b], cd.checksums[a:b]

    def tensor_chunks(self, t: int) -> TensorChunks:
        """Tensor ``t``'s chunks as arrays (positions of a split tensor are computed here)."""
        a, b = int(self.tensor_start[t]), int(self.tensor_start[t + 1])
        shape, split = self.shapes[t], self.splits[t]
        if split is None:
            g0, g1 = int(self.general_start[t]), int(self.general_start[t + 1])
            pos = self.pos[g0:g1].reshape(b - a, len(shape))
            extent = self.extent[g0:g1].reshape(b - a, len(shape))
        else:
            pos, extent = split_boxes(shape, split, b - a)
        return TensorChunks(a, pos, extent, self.file[a:b], self.offset[a:b], self.nbytes[a:b])

    @staticmethod
    def build(shapes: Sequence[Sequence[int]], itemsizes: Sequence[int],
              splits: Sequence[Split | None], counts: Sequence[int], offset: np.ndarray,
              general_file: np.ndarray, pos: np.ndarray, extent: np.ndarray,
              checksums: np.ndarray, block_size: int, file_sizes: np.ndarray,
              data_starts: np.ndarray, name: Callable[[int], str] = str,
              coding: BlockCoding | None = None) -> ChunkTable:
        """Assembles and validates a table from its stored columns.

        ``offset`` and ``checksums`` cover every chunk; ``general_file``, ``pos`` and
        ``extent`` only the chunks of tensors without a split. File ids and byte lengths
        of split tensors are derived from their rule, byte lengths of the others from
        their extents. Shapes, splits and counts must have passed ``check_tensor_rows``.
        ``file_sizes``/``data_starts`` describe the data files (by id); ``name(t)`` names
        tensor ``t`` in errors.

        Checks: column lengths agree with the counts; general chunks lie inside their
        tensor, do not overlap and tile it; every chunk names a listed file and its bytes
        lie inside that file's data section without overlapping another chunk's; there is
        one checksum per block; with ``coding``, the rules of ``blockfile.check_coding``.

        Raises:
            CorruptCheckpointError: naming the first inconsistency found.
        """
        shapes_t = tuple(map(tuple, shapes))
        if not set(map(type, chain.from_iterable(shapes_t))) <= {int}:
            shapes_t = tuple(tuple(int(d) for d in s) for s in shapes)
        nt = len(shapes_t)
        if sum(int(c) for c in counts) != len(offset):  # Python ints: a forged count cannot wrap
            raise bad(f"{len(offset)} byte offsets for {sum(int(c) for c in counts)} chunks")
        counts_a = np.asarray(counts, dtype=I64).reshape(nt)
        tensor_start = np.zeros(nt + 1, dtype=I64)
        np.cumsum(counts_a, out=tensor_start[1:])
        is_split = np.fromiter(map(is_not, splits, repeat(None)), dtype=bool, count=len(splits)).reshape(nt)
        ndims = np.fromiter(map(len, shapes_t), dtype=I64, count=nt)
        general_start = np.zeros(nt + 1, dtype=I64)
        np.cumsum(np.where(is_split, 0, counts_a * ndims), out=general_start[1:])
        n = int(tensor_start[-1])
        rows_general = _rows_of(tensor_start, ~is_split)
        if len(offset) != n:
            raise bad(f"{len(offset)} byte offsets for {n} chunks")
        if len(general_file) != len(rows_general):
            raise bad(f"{len(general_file)} file ids for {len(rows_general)} general chunks")
        if len(pos) != general_start[-1] or len(extent) != general_start[-1]:
            raise bad(f"positions hold {len(pos)}/{len(extent)} values, the general chunks "
                      f"need {int(general_start[-1])}")
        file = np.empty(n, dtype=I64)
        nbytes = np.zeros(n, dtype=I64)
        file[rows_general] = general_file
        _fill_split_columns(shapes_t, itemsizes, splits, tensor_start, file, nbytes)
        table = ChunkTable(shapes_t, np.asarray(itemsizes, dtype=I64).reshape(nt), tuple(splits),
                           tensor_start, file, np.asarray(offset, dtype=I64),
                           nbytes, np.asarray(pos, dtype=I64), np.asarray(extent, dtype=I64),
                           general_start, np.asarray(checksums, dtype=np.uint32),
                           np.zeros(n + 1, dtype=I64), block_size, coding)
        _check_general(table, name)  # also fills the general chunks' nbytes
        blocks = num_blocks(nbytes, block_size)
        np.cumsum(blocks, out=table.block_start[1:])
        if int(table.block_start[-1]) != len(table.checksums):
            raise bad(f"{len(table.checksums)} checksums, the chunks have "
                      f"{int(table.block_start[-1])} blocks")
        if coding is not None:
            check_coding(coding, table.nbytes, table.block_start, table.tensor_start, table.file,
                         table.checksums, block_size, np.asarray(data_starts, dtype=I64), name)
        _check_byte_ranges(table, np.asarray(file_sizes, dtype=I64),
                           np.asarray(data_starts, dtype=I64), name)
        return table


    @staticmethod
    def partial(shapes: Sequence[Sequence[int]], itemsizes: np.ndarray, counts: np.ndarray, file: np.ndarray,
                offset: np.ndarray, nbytes: np.ndarray, pos: np.ndarray, extent: np.ndarray,
                checksums: np.ndarray, block_size: int, file_sizes: np.ndarray, data_starts: np.ndarray,
                name: Callable[[int], str] = str, coding: BlockCoding | None = None) -> ChunkTable:
        """A table of *some* chunks of an index (what a rank reads of a version 4 index):
        every tensor in general form (``pos``/``extent`` flat, row after row), ``counts``
        chunks per tensor, in each tensor's chunk order.

        Checks what ``build`` checks of a whole table's chunks, except that they cover
        their tensors: one checksum per block, the coding rules, every chunk's bytes
        inside its file's data section without overlapping another chunk's. The caller
        has checked that each chunk lies inside its tensor and that ``nbytes`` is its
        volume times the item size.

        Raises:
            CorruptCheckpointError: naming the first inconsistency found.
        """
        shapes_t = tuple(tuple(int(d) for d in s) for s in shapes)
        counts_a = np.asarray(counts, dtype=I64)
        tensor_start = np.concatenate([[0], np.cumsum(counts_a)]).astype(I64)
        ndims = np.fromiter(map(len, shapes_t), dtype=I64, count=len(shapes_t))
        general_start = np.concatenate([[0], np.cumsum(counts_a * ndims)]).astype(I64)
        block_start = np.concatenate([[0], np.cumsum(num_blocks(np.asarray(nbytes, dtype=I64), block_size))])
        if len(pos) != general_start[-1] or len(file) != tensor_start[-1] or block_start[-1] != len(checksums):
            raise bad(f"{len(checksums)} checksums and {len(pos)} positions for {int(tensor_start[-1])} chunks "
                      f"of {int(block_start[-1])} blocks and {int(general_start[-1])} positions")
        table = ChunkTable(shapes_t, np.asarray(itemsizes, dtype=I64), (None,) * len(shapes_t), tensor_start,
                           np.asarray(file, dtype=I64), np.asarray(offset, dtype=I64), np.asarray(nbytes, dtype=I64),
                           np.asarray(pos, dtype=I64), np.asarray(extent, dtype=I64), general_start,
                           np.asarray(checksums, dtype=np.uint32), block_start.astype(I64), block_size, coding,
                           whole=False)
        if coding is not None:
            check_coding(coding, table.nbytes, table.block_start, table.tensor_start, table.file,
                         table.checksums, block_size, np.asarray(data_starts, dtype=I64), name)
        _check_byte_ranges(table, np.asarray(file_sizes, dtype=I64), np.asarray(data_starts, dtype=I64), name)
        return table


def _rows_of(tensor_start: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Row numbers of the chunks of the tensors selected by ``mask`` (ascending)."""
    if mask.all():
        return np.arange(int(tensor_start[-1]), dtype=I64)
    counts = np.diff(tensor_start)[mask]
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=I64)
    firsts = np.repeat(tensor_start[:-1][mask] - (np.cumsum(counts) - counts), counts)
    return firsts + np.arange(total, dtype=I64)


def split_boxes(shape: Sequence[int], split: Split, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Starts and extents ``(count, ndim)`` of the parts of a split tensor."""
    i = np.arange(count, dtype=I64)
    pos = np.zeros((count, len(shape)), dtype=I64)
    extent = np.tile(np.asarray(shape, dtype=I64), (count, 1))
    pos[:, split.dim] = i * split.step
    extent[:, split.dim] = np.minimum(split.step, shape[split.dim] - i * split.step)
    return pos, extent


def _fill_split_columns(shapes: Sequence[tuple[int, ...]], itemsizes: Sequence[int],
                        splits: Sequence[Split | None], tensor_start: np.ndarray,
                        file: np.ndarray, nbytes: np.ndarray) -> None:
    """File ids and byte lengths of every split tensor's chunks, vectorised over all of them.

    Every part holds ``step`` slices of the cut dimension except the last of each tensor,
    so the columns are one repeat per tensor plus one fix per tensor.
    """
    ts = [t for t, s in enumerate(splits) if s is not None]
    if not ts:
        return
    sel = np.asarray(ts, dtype=I64)
    mask = np.zeros(len(splits), dtype=bool)
    mask[sel] = True
    counts = np.diff(tensor_start)[sel]
    rows = _rows_of(tensor_start, mask)
    sp: list[Split] = [splits[t] for t in ts]  # type: ignore[misc]
    dim, step, file0, stride = (np.fromiter(v, dtype=I64, count=len(ts)) for v in
                                zip(*map(attrgetter("dim", "step", "file0", "file_stride"), sp)))
    sel_shapes = [shapes[t] for t in ts]
    # bytes of one slice of the cut dimension: product of the other dims times itemsize
    size = np.fromiter(map(getitem, sel_shapes, dim.tolist()), dtype=I64, count=len(ts))
    numel = np.fromiter(map(math.prod, sel_shapes), dtype=I64, count=len(ts))
    inner = numel // np.maximum(size, 1) * np.asarray(itemsizes, dtype=I64)[sel]
    local = np.arange(len(rows), dtype=I64)
    local -= np.repeat(np.cumsum(counts) - counts, counts)  # part number within its tensor
    if (stride == 1).all() and (file0 == 0).all():
        file[rows] = local
    else:
        file[rows] = np.repeat(file0, counts) + local * np.repeat(stride, counts)
    nbytes[rows] = np.repeat(step * inner, counts)
    last = np.cumsum(counts)[counts > 0] - 1  # the last part may be shorter
    has = counts > 0
    nbytes[rows[last]] = (size[has] - (counts[has] - 1) * step[has]) * inner[has]


def check_tensor_rows(shapes: Sequence[Sequence[int]], splits: Sequence[Split | None],
                      counts: Sequence[int], num_files: int, name: Callable[[int], str] = str) -> None:
    """Checks each split against its tensor: the rule must produce ``count`` non-empty parts
    in listed files. (Shapes are checked by the caller: at most 64 dims, each <= 2^62.)

    Raises:
        CorruptCheckpointError: naming the tensor whose rule is impossible.
    """
    checked: set[tuple[int, tuple[int, ...], int]] = set()  # splits are shared between tensors
    for t, (shape, split, count) in enumerate(zip(shapes, splits, counts)):
        if split is None:
            continue
        key = (id(split), tuple(shape), count)
        if key in checked:
            continue
        d, step, f0, fs = split.dim, split.step, split.file0, split.file_stride
        if not 0 <= d < len(shape) or not 1 <= step <= max(shape[d], 1) or shape[d] < 1:
            raise bad(f"tensor {name(t)}: split {[d, step]} does not fit shape {list(shape)}")
        if count != -(-shape[d] // step):
            raise bad(f"tensor {name(t)}: split into parts of {step} needs "
                      f"{-(-shape[d] // step)} chunks, the index says {count}")
        if f0 < 0 or fs < 0 or f0 + (count - 1) * fs >= num_files:
            raise bad(f"tensor {name(t)}: split names files beyond the {num_files} listed")
        checked.add(key)


def _general_shapes(table: ChunkTable, ts: Sequence[int]) -> np.ndarray:
    """The tensor's dimension sizes aligned with the flat ``pos``/``extent`` arrays."""
    parts = [np.tile(np.asarray(table.shapes[t], dtype=I64),
                     int(table.tensor_start[t + 1] - table.tensor_start[t])) for t in ts]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=I64)


def _check_general(table: ChunkTable, name: Callable[[int], str]) -> None:
    """General chunks lie inside their tensor and tile it exactly; fills their nbytes."""
    ts = [t for t, s in enumerate(table.splits) if s is None]
    gshape = _general_shapes(table, ts)
    pos, ext = table.pos, table.extent
    inside = (pos >= 0) & (ext >= 0) & (ext <= gshape) & (pos <= gshape - ext)
    if not inside.all():
        outside = int(np.argmin(inside))
        t = next(t for t in ts if table.general_start[t + 1] > outside)
        raise bad(f"tensor {name(t)}: a chunk lies outside shape {list(table.shapes[t])}")
    for t in ts:  # extents are bounded by the shape now, so products cannot overflow
        c = table.tensor_chunks(t)
        k = len(c.file)
        vol = np.prod(c.extent, axis=1, dtype=I64) if c.extent.shape[1] else np.ones(k, I64)
        table.nbytes[c.start : c.start + k] = vol * int(table.itemsizes[t])
        problem = cover_problem(c.pos, c.extent, table.shapes[t])
        if problem is not None:
            raise bad(f"tensor {name(t)}: {problem}")


def _check_byte_ranges(table: ChunkTable, sizes: np.ndarray, starts: np.ndarray,
                       name: Callable[[int], str]) -> None:
    """Files exist; non-empty chunks sit inside their file's data section and don't overlap."""
    file, off, nb = table.file, table.offset, table.stored_nbytes()
    if len(file) == 0:
        return

    def tensor_of(row: int) -> str:
        return name(int(np.searchsorted(table.tensor_start, row, side="right")) - 1)

    wrong = np.flatnonzero((file < 0) | (file >= len(sizes)) | (off < 0))
    if len(wrong):
        raise bad(f"tensor {tensor_of(int(wrong[0]))}: chunk names file id {int(file[wrong[0]])} "
                  f"or offset {int(off[wrong[0]])} (there are {len(sizes)} files)")
    nonempty = nb > 0  # an empty chunk reads nothing: its offset constrains nothing
    if nonempty.all():
        used, f, o, n = np.arange(len(nb), dtype=I64), file, off, nb
    else:
        used = np.flatnonzero(nonempty)
        f, o, n = file[used], off[used], nb[used]
    first = starts[f] if len(starts) and (starts != starts[0]).any() else (starts[0] if len(starts) else 0)
    outside = (o < first) | (n > sizes[f] - o)
    if outside.any():
        i = int(np.argmax(outside))
        raise bad(f"byte range of {tensor_of(int(used[i]))} [{int(o[i])}, +{int(n[i])}) lies outside "
                  f"the data section of file {int(f[i])}")
    # Disjoint intervals, sorted by start, are also sorted by end; conversely if the k-th
    # smallest start is >= the (k-1)-th smallest end for every k, no two intervals overlap
    # (each has positive length). Keys put each file in its own range: file * span + byte.
    span = int(sizes.max()) + 1
    if span * len(sizes) < (1 << 62):
        begin = f * span
        begin += o
        end = begin + n
        # in place (both are temporaries); stable = timsort/radix, which merges the ascending
        # runs that split tensors leave (part i in file i) instead of sorting from scratch
        begin.sort(kind="stable")
        end.sort(kind="stable")
        if bool((begin[1:] >= end[:-1]).all()):
            return
        del begin, end
    order = np.lexsort((o, f))  # an overlap (or huge keys): find the pair to name it
    f, o, n = f[order], o[order], n[order]
    clash = np.flatnonzero((f[1:] == f[:-1]) & (o[1:] < o[:-1] + n[:-1]))
    if len(clash):
        a, b = int(used[order[clash[0]]]), int(used[order[clash[0] + 1]])
        raise bad(f"byte range of {tensor_of(b)} in file {int(f[clash[0] + 1])} overlaps "
                  f"{tensor_of(a)}")


def detect_split(shape: Sequence[int], pos: np.ndarray, extent: np.ndarray,
                 file: np.ndarray) -> Split | None:
    """The ``Split`` that reproduces these chunks in this order, or None.

    A split needs every chunk full in all dimensions but one, chunk ``i`` starting at
    ``i * step`` there, the last ending at the edge, and files ``file0 + i * stride``.
    """
    k = len(file)
    if k == 0 or not shape or min(shape) < 0:
        return None
    if k == 1 and min(shape) >= 1:
        # one whole chunk (most tensors of a single-rank save): the loop below would find
        # Split(0, shape[0], file, 0); decided on plain lists, ~40x faster than that loop
        whole = not any(pos[0].tolist()) and extent[0].tolist() == list(shape)
        return Split(0, int(shape[0]), int(file[0]), 0) if whole else None
    for d in range(len(shape)):
        step = int(extent[0, d])
        if step < 1 or shape[d] < 1 or k != -(-shape[d] // step):
            continue
        want_pos, want_ext = split_boxes(shape, Split(d, step, 0, 0), k)
        if not (np.array_equal(pos, want_pos) and np.array_equal(extent, want_ext)):
            continue
        stride = int(file[1] - file[0]) if k > 1 else 0
        if stride >= 0 and np.array_equal(file, file[0] + stride * np.arange(k, dtype=I64)):
            return Split(d, step, int(file[0]), stride)
        return None
    return None
