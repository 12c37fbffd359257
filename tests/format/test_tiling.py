"""``format.tiling``: the one check that a tensor's chunks cover it exactly once.

Property tests compare it with a brute-force coverage count on small tensors, for
random grids, random non-grid tilings (guillotine cuts) and forgeries made from them;
timing tests build the layouts that made the former sweep quadratic.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsafe.format.tiling import MAX_CORNERS, tiling_problem

I64 = np.int64


def _coverage(pos: np.ndarray, ext: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    count = np.zeros(shape, dtype=np.int64)
    for p, e in zip(pos.tolist(), ext.tolist()):
        count[tuple(slice(a, a + n) for a, n in zip(p, e))] += 1
    return count


@st.composite
def _guillotine(draw: st.DrawFn) -> tuple[tuple[int, ...], list[tuple[list[int], list[int]]]]:
    """A tensor shape and a tiling of it by recursive cuts (a grid only by chance)."""
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(1, 6)) for _ in range(ndim))
    boxes, todo = [], [([0] * ndim, list(shape))]
    while todo:
        p, e = todo.pop()
        cuttable = [d for d in range(ndim) if e[d] > 1]
        if not cuttable or len(boxes) + len(todo) > 40 or not draw(st.booleans()):
            boxes.append((p, e))
            continue
        d = draw(st.sampled_from(cuttable))
        at = draw(st.integers(1, e[d] - 1))
        todo.append((p, e[:d] + [at] + e[d + 1:]))
        todo.append((p[:d] + [p[d] + at] + p[d + 1:], e[:d] + [e[d] - at] + e[d + 1:]))
    return shape, boxes


def _arrays(boxes: list[tuple[list[int], list[int]]], ndim: int) -> tuple[np.ndarray, np.ndarray]:
    pos = np.array([p for p, _ in boxes], dtype=I64).reshape(len(boxes), ndim)
    ext = np.array([e for _, e in boxes], dtype=I64).reshape(len(boxes), ndim)
    return pos, ext


def _agrees_with_brute_force(pos: np.ndarray, ext: np.ndarray, shape: tuple[int, ...]) -> None:
    count = _coverage(pos, ext, shape)
    assert int(count.sum()) == math.prod(shape)  # the precondition tiling_problem states
    problem = tiling_problem(pos, ext, shape)
    if (count == 1).all():
        assert problem is None
        return
    assert problem is not None and "overlap" in problem
    # the named element really is covered the number of times the message says
    words = problem.split("element ")[1]
    element = tuple(int(x) for x in words[1 : words.index("]")].split(",") if x.strip())
    times = int(words.split(" lies in ")[1].split(" ")[0])
    assert count[element] == times != 1


@settings(max_examples=300, deadline=None)
@given(_guillotine(), st.randoms(use_true_random=False))
def test_tilings_and_forgeries_agree_with_a_coverage_count(case, rnd) -> None:
    _tiling_and_forgery(case, rnd)


@pytest.mark.stress
@settings(max_examples=20_000, deadline=None)
@given(_guillotine(), st.randoms(use_true_random=False))
def test_tilings_and_forgeries_agree_with_a_coverage_count_long(case, rnd) -> None:
    _tiling_and_forgery(case, rnd)


def _tiling_and_forgery(case, rnd) -> None:  # noqa: ANN001
    shape, boxes = case
    ndim = len(shape)
    pos, ext = _arrays(boxes, ndim)
    order = list(range(len(boxes)))
    rnd.shuffle(order)
    _agrees_with_brute_force(pos[order], ext[order], shape)
    if len(boxes) < 2:
        return
    # forge: move one box somewhere else inside the tensor (same volume, so the element
    # count still adds up), or swap the extents of two boxes of equal volume
    forged_pos = pos.copy()
    i = rnd.randrange(len(boxes))
    for d in range(ndim):
        forged_pos[i, d] = rnd.randint(0, shape[d] - int(ext[i, d]))
    _agrees_with_brute_force(forged_pos, ext, shape)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_uneven_grids_and_grids_with_a_cell_twice(data) -> None:
    ndim = data.draw(st.integers(1, 4))
    shape = tuple(data.draw(st.integers(1, 7)) for _ in range(ndim))
    cuts = [sorted({0, s, *data.draw(st.lists(st.integers(1, max(s - 1, 1)), max_size=3))} - {s + 1})
            for s in shape]
    cells = np.stack(np.meshgrid(*[np.arange(len(c) - 1) for c in cuts], indexing="ij"), -1).reshape(-1, ndim)
    pos = np.array([[cuts[d][i] for d, i in enumerate(c)] for c in cells.tolist()], dtype=I64).reshape(-1, ndim)
    ext = np.array([[cuts[d][i + 1] - cuts[d][i] for d, i in enumerate(c)] for c in cells.tolist()],
                   dtype=I64).reshape(-1, ndim)
    keep = ext.min(axis=1) > 0
    pos, ext = pos[keep], ext[keep]
    assert tiling_problem(pos, ext, shape) is None
    same = [j for j in range(1, len(pos)) if np.array_equal(ext[j], ext[0])]
    if same:  # cell 0 twice, one cell of the same extent missing
        j = data.draw(st.sampled_from(same))
        forged = pos.copy()
        forged[j] = pos[0]
        _agrees_with_brute_force(forged, ext, shape)


def _strips_and_cells(n: int) -> tuple[np.ndarray, np.ndarray]:
    """n-1 full-height column strips and the last column as n single cells: no grid."""
    strips, cells = np.arange(n - 1, dtype=I64), np.arange(n, dtype=I64)
    pos = np.concatenate([np.stack([0 * strips, strips], 1), np.stack([cells, 0 * cells + n - 1], 1)])
    ext = np.concatenate([np.stack([0 * strips + n, 0 * strips + 1], 1), np.ones((n, 2), dtype=I64)])
    return pos, ext


def test_layouts_that_made_the_sweep_quadratic_are_checked_fast() -> None:
    pos, ext = _strips_and_cells(20_000)
    t = time.perf_counter()
    assert tiling_problem(pos, ext, (20_000, 20_000)) is None
    ext = ext.copy()
    ext[0, 1] = 2  # strip 0 now covers column 1 too, and no cell is left in the last column
    strips = slice(0, 19_999)
    assert "element [0, 1] lies in 2 chunks" in tiling_problem(pos[strips], ext[strips], (20_000, 20_000))
    assert time.perf_counter() - t < 2


def test_a_gap_is_named_as_a_gap() -> None:
    # [1, 3) twice on [0, 4): the first element covered other than once is the uncovered 0
    problem = tiling_problem(np.array([[1], [1]], dtype=I64), np.array([[2], [2]], dtype=I64), (4,))
    assert problem == "chunks overlap and leave a gap: element [0] lies in 0 chunks"


def test_irregular_150x150_grid_is_fast() -> None:
    rng = np.random.default_rng(0)
    cuts = [np.concatenate([[0], np.sort(rng.choice(np.arange(1, 10_000), 149, replace=False)), [10_000]])
            for _ in range(2)]
    i, j = np.meshgrid(np.arange(150), np.arange(150), indexing="ij")
    pos = np.stack([cuts[0][i.ravel()], cuts[1][j.ravel()]], 1)
    ext = np.stack([np.diff(cuts[0])[i.ravel()], np.diff(cuts[1])[j.ravel()]], 1)
    t = time.perf_counter()
    assert tiling_problem(pos, ext, (10_000, 10_000)) is None
    assert time.perf_counter() - t < 0.5


def test_layouts_too_costly_to_check_are_refused() -> None:
    # no grid, and every one of 8 dimensions cut by some chunk: 256 corners per chunk
    pos = np.array([[0] * 8, [1] + [0] * 7, [1] * 8], dtype=I64)
    ext = np.array([[1] + [2] * 7, [1] * 8, [1] * 8], dtype=I64)
    assert "too irregular" in tiling_problem(pos, ext, (2,) * 8)
    m = (MAX_CORNERS >> 3) + 1  # a non-grid 2-D layout of 2m - 1 chunks, 4 corners each
    pos, ext = _strips_and_cells(m)
    assert len(pos) << 2 > MAX_CORNERS
    assert "too irregular" in tiling_problem(pos, ext, (m, m))


@pytest.mark.parametrize("k", [1, 3, 6])
def test_whole_dimensions_do_not_count(k: int) -> None:
    # chunks cut along dimension 0 only, with k whole dimensions around it
    shape = (4,) + (3,) * k
    pos = np.array([[0] + [0] * k, [2] + [0] * k], dtype=I64)
    ext = np.array([[2] + [3] * k, [2] + [3] * k], dtype=I64)
    assert tiling_problem(pos, ext, shape) is None
    pos[1, 0] = 1
    ext[0, 0] = 3  # inside the shape, 1 + 2 rows ... but row 1 twice: not exactly once
    ext[1, 0] = 1
    assert "element [1" in tiling_problem(pos, ext, shape)
