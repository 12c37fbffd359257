"""Whether the chunks of a tensor tile it: every element lies in exactly one chunk.

An untrusted index lists each tensor's chunks as boxes (start and extent per dimension).
``tiling_problem`` decides whether those boxes cover the tensor exactly once, in
O(n log n) numpy work for every layout a writer produces and for any forged layout up
to a fixed size, and refuses larger irregular layouts instead of spending more:

* a **grid** (per dimension the chunks' intervals partition the dimension, and every
  cell of the product appears once) is what DTensor placements, FSDP row splits and
  resharded saves produce, even with uneven intervals; it is checked per dimension;
* anything else is decided exactly by **signed corners**: the indicator of a box
  ``[a, b)`` is ``prod_d (H(x_d - a_d) - H(x_d - b_d))`` with ``H`` the unit step, a
  sum of ``2**k`` orthant indicators at its corners with signs ``(-1)**(upper corners)``.
  Orthant indicators at distinct points are linearly independent, so the boxes cover
  each element exactly once if and only if, at every corner point, their signed corner
  counts add up to those of the tensor's own box. That is a sort and a group-by of
  ``n * 2**k`` keys, ``k`` being the number of dimensions that some chunk cuts.

Dimensions that every chunk spans whole are dropped first: they change nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

I64 = np.int64
MAX_CUT_DIMS = 6  # the corner test builds 2**k keys per chunk
MAX_CORNERS = 1 << 22  # keys the corner test may build (about 100 MB at the peak)


def tiling_problem(pos: np.ndarray, extent: np.ndarray, shape: Sequence[int]) -> str | None:
    """Why the non-empty boxes ``pos``/``extent`` (``(n, ndim)`` int64) do not tile ``shape``
    exactly once, or None when they do.

    The caller has checked that every box lies inside the shape and that their volumes
    add up to the tensor's element count: a gap then implies an overlap, so the answer
    names an element covered twice or more, or a layout too irregular to check.
    """
    n, ndim = pos.shape
    if n < 2:
        return None
    size = np.asarray(shape, dtype=I64)
    cut = np.flatnonzero(~((pos == 0) & (extent == size)).all(axis=0))
    if len(cut) == 0:
        return f"{n} chunks each hold the whole tensor (they overlap)"
    p, e, s = pos[:, cut], extent[:, cut], size[cut]
    if _is_grid(p, e, s):
        return None
    k = len(cut)
    if k > MAX_CUT_DIMS or n << k > MAX_CORNERS:
        return (f"{n} chunks that are not a grid, cut along {k} dimensions, are too irregular to "
                f"check for overlaps (at most {MAX_CORNERS >> min(k, 62)} such chunks, "
                f"{MAX_CUT_DIMS} dimensions)")
    found = _first_miscovered(p, e, s)
    if found is None:
        return None
    at, times = found
    element = [0] * ndim
    for d, v in zip(cut.tolist(), at):
        element[d] = v
    if times == 0:  # the volumes add up, so another element is covered twice
        return f"chunks overlap and leave a gap: element {element} lies in 0 chunks"
    return f"chunks overlap: element {element} lies in {times} chunks"


def cover_problem(pos: np.ndarray, extent: np.ndarray, shape: Sequence[int]) -> str | None:
    """Why the boxes ``pos``/``extent`` (``(n, ndim)`` int64, each inside ``shape``) do not
    cover ``shape`` exactly once, or None when they do: their element counts must add up
    to the shape's, and then ``tiling_problem`` decides on the boxes themselves (equal
    volumes do not prove coverage: two copies of one half hold as many elements as both
    halves)."""
    n = len(pos)
    if not shape and n > 1:
        return f"{n} chunks of a scalar overlap"
    vol = np.prod(extent, axis=1, dtype=I64) if extent.shape[1] else np.ones(n, I64)
    numel = math.prod(shape)
    # each volume is <= numel <= 2^62; a float sum below 2^62 means the int64 one is exact
    held = int(vol.sum()) if float(vol.sum(dtype=np.float64)) < 2.0**62 else None
    if held != numel:
        return f"chunks hold {held if held is not None else 'over 2^62'} elements, shape needs {numel}"
    keep = vol > 0
    return tiling_problem(pos[keep], extent[keep], shape)


def _is_grid(p: np.ndarray, e: np.ndarray, s: np.ndarray) -> bool:
    """Per dimension the distinct starts partition ``[0, s)`` with each chunk spanning one
    interval, and the cells (one interval per dimension) are all distinct and all there."""
    n, k = p.shape
    cells = np.zeros(n, dtype=I64)
    count = 1
    for d in range(k):
        starts = np.unique(p[:, d])
        if starts[0] != 0:
            return False
        i = np.searchsorted(starts, p[:, d])
        lengths = np.diff(np.append(starts, s[d]))
        if not np.array_equal(e[:, d], lengths[i]):
            return False
        count *= len(starts)
        if count > n:
            return False
        cells *= len(starts)
        cells += i
    return bool((np.bincount(cells, minlength=n) == 1).all())  # n cells, each once


def _first_miscovered(p: np.ndarray, e: np.ndarray, s: np.ndarray) -> tuple[list[int], int] | None:
    """The lexicographically first element covered other than once and how often it is,
    or None when every element is covered once.

    Each box adds ``(-1)**|U|`` at its corner that takes the upper bound in the dimensions
    ``U``; the tensor's box subtracts the same. At the first point (in lexicographic
    order, hence minimal in the product order) where the sum is not zero, the coverage
    differs from the tensor's by exactly that sum, and the point lies inside the tensor
    (outside it no box covers anything).
    """
    n, k = p.shape
    lo_rank, hi_rank, values, bits = [], [], [], []
    for d in range(k):  # coordinates -> ranks, so that a corner packs into few bits
        v, inv = np.unique(np.concatenate([p[:, d], p[:, d] + e[:, d], [0, s[d]]]),
                           return_inverse=True)
        values.append(v)
        lo_rank.append(inv[:n].astype(I64))
        hi_rank.append(inv[n : 2 * n].astype(I64))
        bits.append(max(int(len(v) - 1).bit_length(), 1))
    words = _pack_layout(bits)
    upper = (np.arange(1 << k)[:, None] >> np.arange(k)[None, :]) & 1  # (subset, dim): upper bound?
    keys = []
    for dims in words:  # row m * n + i: corner m of box i
        acc = np.zeros((1 << k, n), dtype=I64)
        for d, shift in dims:
            acc |= np.where(upper[:, d, None] == 1, hi_rank[d] << shift, lo_rank[d] << shift)
        keys.append(acc.reshape(-1))
    sign = np.repeat(np.where(upper.sum(axis=1) % 2 == 1, -1, 1).astype(np.int32), n)
    box_keys, box_sign = _box_corners(values, words, k)
    keys = [np.concatenate([kw, bw]) for kw, bw in zip(keys, box_keys)]
    sign = np.concatenate([sign, box_sign])
    if len(keys) == 1:  # every sum is zero iff the +1 corners and the -1 corners are one multiset
        plus, minus = keys[0][sign > 0], keys[0][sign < 0]
        if len(plus) == len(minus) and np.array_equal(np.sort(plus), np.sort(minus)):
            return None
    order = np.lexsort(keys[::-1]) if len(keys) > 1 else np.argsort(keys[0], kind="stable")
    sorted_keys = [kw[order] for kw in keys]
    new = np.zeros(len(order), dtype=bool)
    new[0] = True
    for kw in sorted_keys:
        new[1:] |= kw[1:] != kw[:-1]
    starts = np.flatnonzero(new)
    sums = np.add.reduceat(sign[order], starts)
    wrong = np.flatnonzero(sums)
    if len(wrong) == 0:
        return None
    row = int(order[starts[wrong[0]]])
    at = [0] * k
    for w, dims in enumerate(words):
        for d, shift in dims:
            at[d] = int(values[d][int(keys[w][row]) >> shift & ((1 << bits[d]) - 1)])
    return at, 1 + int(sums[wrong[0]])


def _pack_layout(bits: list[int]) -> list[list[tuple[int, int]]]:
    """Dimensions in order, packed into 62-bit words: per word ``(dim, shift)``, the first
    dimension in the highest bits, so that comparing the words compares lexicographically."""
    words: list[list[tuple[int, int]]] = [[]]
    used = 0
    for d, b in enumerate(bits):
        if used + b > 62:
            words.append([])
            used = 0
        words[-1].append((d, b))
        used += b
    out = []
    for dims in words:  # shifts: the first dimension of a word ends up highest
        total, placed = sum(b for _, b in dims), []
        for d, b in dims:
            total -= b
            placed.append((d, total))
        out.append(placed)
    return out


def _box_corners(values: list[np.ndarray], words: list[list[tuple[int, int]]],
                 k: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Keys and negated signs of the tensor box's corners (ranks 0 and ``len(values) - 1``)."""
    keys = [np.zeros(1 << k, dtype=I64) for _ in words]
    sign = np.empty(1 << k, dtype=np.int32)
    for m in range(1 << k):
        sign[m] = 1 if bin(m).count("1") % 2 else -1
        for w, dims in enumerate(words):
            keys[w][m] = sum((len(values[d]) - 1 if m >> d & 1 else 0) << shift for d, shift in dims)
    return keys, sign
