"""Decoding cost stays linear in the index: forged indexes with correct checksums, built
at the sizes of the attacks, are decoded or refused quickly and in bounded memory.

Time bounds are generous (several times the measured time on a loaded 2-core machine;
the attack-sized inputs decode in a child process whose CPU time is measured, so other
processes on the machine don't count); a decoder that is quadratic in the index, or
that builds the whole tree before checking its depth, exceeds them by far on these inputs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from shardsafe.errors import CorruptCheckpointError
from shardsafe.format.index import versions as fmt
from shardsafe.format.checksum import crc32c

from v2_forge import one_tensor_v2


def _seal(body: dict) -> bytes:
    prefix = json.dumps(body, separators=(",", ":"))[:-1].encode()
    return prefix + b',"index_checksum":"crc32c:%08x"}\n' % crc32c(prefix)


def _body(tensors: list, tree: dict, file_size: int = 1 << 40) -> dict:
    return {"format_version": 1, "library": "forged", "created": 0.0, "world_size": 1, "checksum": "crc32c",
            "block_size": 1 << 30, "metadata": {},
            "files": [{"name": "d", "size": file_size, "data_start": 8, "rank": 0}],
            "tensors": tensors, "tree": tree}


def _chunk(offset: int, offsets: list, shape: list) -> dict:
    n = 1
    for s in shape:
        n *= s
    return {"file": "d", "offset": offset, "nbytes": n, "offsets": offsets, "shape": shape, "crc32c": ["00000000"]}


def _one_tensor(chunks: list, shape: list) -> bytes:
    tree = {"t": "dict", "k": ["w"], "v": [{"t": "tensor", "id": 0}]}
    return _seal(_body([{"key": ["w"], "kind": "numpy", "dtype": "uint8", "shape": shape, "chunks": chunks}], tree))


def _strips_and_cells(n: int, widen_first: bool = False) -> bytes:
    """A valid tiling that is no grid: n-1 full-height column strips, the last column as
    n single cells. A sweep along the rows compares every cell with every strip
    (quadratic). ``widen_first``: strip 0 also covers column 1 and the cells are left
    out, so the element counts still add up but column 1 is held twice."""
    chunks, off = [], 8
    for i in range(n - 1):
        chunks.append(_chunk(off, [0, i], [n, 2 if widen_first and i == 0 else 1]))
        off += n * (2 if widen_first and i == 0 else 1)
    for j in range(0 if widen_first else n):
        chunks.append(_chunk(off, [j, n - 1], [1, 1]))
        off += 1
    return _one_tensor(chunks, [n, n])


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def test_grid_of_16000_chunks_decodes_fast() -> None:
    n = 126  # 126 x 126 = 15,876 chunks, about 2 MB of index
    chunks = [_chunk(8 + (i * n + j) * 4, [i * 2, j * 2], [2, 2]) for i in range(n) for j in range(n)]
    data = _one_tensor(chunks, [2 * n, 2 * n])
    assert len(data) > 1_400_000
    assert _timed(lambda: fmt.decode_index(data)) < 10


def test_overlapping_grid_cells_are_still_refused() -> None:
    chunks = [_chunk(8, [0, 0], [2, 2]), _chunk(12, [0, 0], [2, 2]), _chunk(16, [2, 0], [2, 2]),
              _chunk(20, [2, 2], [2, 2])]  # (0,0) twice, (0,2) never: counts add up, no grid
    with pytest.raises(CorruptCheckpointError, match="overlap"):
        fmt.decode_index(_one_tensor(chunks, [4, 4]))


def test_irregular_tiling_of_16000_chunks_is_checked_fast() -> None:
    data = _strips_and_cells(8000)
    assert len(data) > 1_500_000
    assert _timed(lambda: fmt.decode_index(data)) < 10
    data = _strips_and_cells(8000, widen_first=True)
    t = time.perf_counter()
    with pytest.raises(CorruptCheckpointError, match=r"element \[0, 1\] lies in 2 chunks"):
        fmt.decode_index(data)
    assert time.perf_counter() - t < 10


def test_small_irregular_tiling_is_accepted() -> None:
    fmt.decode_index(_strips_and_cells(40))
    with pytest.raises(CorruptCheckpointError, match="overlap"):
        fmt.decode_index(_strips_and_cells(40, widen_first=True))


def _strips_and_cells_v2(n: int, widen_first: bool = False) -> bytes:
    """``_strips_and_cells`` as a v2 index (columns: a few bytes per chunk)."""
    strips, cells = np.arange(n - 1), np.arange(0 if widen_first else n)
    pos = np.concatenate([np.stack([0 * strips, strips], 1), np.stack([cells, 0 * cells + n - 1], 1)])
    ext = np.concatenate([np.stack([0 * strips + n, 0 * strips + 1], 1), np.ones((len(cells), 2), dtype=np.int64)])
    if widen_first:
        ext[0, 1] = 2
    return one_tensor_v2(pos, ext, [n, n])


@pytest.mark.parametrize("n", [3500, 7000])
def test_forged_v2_layouts_of_100_to_300_kb_are_decided_fast(n: int) -> None:
    good, forged = _strips_and_cells_v2(n), _strips_and_cells_v2(n, widen_first=True)
    assert 100_000 < len(good) < 300_000
    assert _timed(lambda: fmt.decode_index(good)) < 1
    t = time.perf_counter()
    with pytest.raises(CorruptCheckpointError, match=r"element \[0, 1\] lies in 2 chunks"):
        fmt.decode_index(forged)
    assert time.perf_counter() - t < 1


def test_irregular_150x150_grid_decodes_fast() -> None:
    rng = np.random.default_rng(1)
    cuts = [np.concatenate([[0], np.sort(rng.choice(np.arange(1, 1000), 149, replace=False)), [1000]])
            for _ in range(2)]
    i, j = (a.ravel() for a in np.meshgrid(np.arange(150), np.arange(150), indexing="ij"))
    pos = np.stack([cuts[0][i], cuts[1][j]], 1)
    ext = np.stack([np.diff(cuts[0])[i], np.diff(cuts[1])[j]], 1)
    order = rng.permutation(len(pos))  # the ranks' chunks in no particular order
    data = one_tensor_v2(pos[order], ext[order], [1000, 1000])
    assert _timed(lambda: fmt.decode_index(data)) < 1


_MEASURE = textwrap.dedent("""
    import json, resource, sys, time
    from shardsafe.format.index import versions as fmt
    from shardsafe.errors import CorruptCheckpointError
    data = open(sys.argv[1], "rb").read()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.process_time()  # CPU seconds of this process: the decoder's work
    try:
        fmt.decode_index(data)
        outcome = "decoded"
    except CorruptCheckpointError as e:
        outcome = str(e)
    dt = time.process_time() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    print(json.dumps({"seconds": dt, "extra_mb": peak / 1024, "index_mb": len(data) / 1e6, "outcome": outcome}))
""")


def _measure(tmp_path, data: bytes) -> dict:
    p = tmp_path / "index.json"
    p.write_bytes(data)
    r = subprocess.run([sys.executable, "-c", _MEASURE, str(p)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    print(out)
    return out


def _deep(depth: int, leaves: int) -> bytes:
    inner: dict = {"t": "list", "v": [{"t": "int", "v": 0}] * leaves}
    for _ in range(depth):
        inner = {"t": "dict", "k": ["a"], "v": [inner]}
    tree = {"t": "dict", "k": ["a"], "v": [inner]}
    return _seal(_body([], tree, 8))


# the limits are relative to the index's size: 10 MB shows the same refusals by default
# (smaller, the interpreter's fixed costs would eat the time bound); the attack's full
# size runs under -m stress
@pytest.mark.parametrize("leaves", [pytest.param(560_000, id="10MB"),
                                    pytest.param(1_400_000, id="26MB", marks=pytest.mark.stress)])
def test_deep_wide_tree_is_refused_in_bounded_time_and_memory(tmp_path, leaves: int) -> None:
    data = _deep(195, leaves)  # 195 levels deep
    out = _measure(tmp_path, data)
    assert "deeper than" in out["outcome"]
    assert out["seconds"] < 0.5 * out["index_mb"] and out["extra_mb"] < 25 * out["index_mb"], out
    data = _deep(60, leaves)  # within the depth limit, but every leaf 60 deep
    out = _measure(tmp_path, data)
    assert "deep on average" in out["outcome"], out
    assert out["seconds"] < 0.5 * out["index_mb"] and out["extra_mb"] < 25 * out["index_mb"], out


@pytest.mark.parametrize("arrays", [pytest.param(4_300_000, id="13MB"),
                                    pytest.param(43_000_000, id="130MB", marks=pytest.mark.stress)])
def test_flat_list_of_empty_arrays_is_refused_in_bounded_memory(tmp_path, arrays: int) -> None:
    # empty arrays: 3 bytes of JSON each, ~64 bytes of memory each once parsed
    tree = {"t": "dict", "k": ["a"], "v": [{"t": "str", "v": "x"}]}
    body = _body([], tree, 8)
    body["metadata"] = {"junk": []}
    data = _seal(body).replace(b'"junk":[]', b'"junk":[' + b"[]," * arrays + b"[]]")
    data = data[: data.rindex(b',"index_checksum"')]
    data += b',"index_checksum":"crc32c:%08x"}\n' % crc32c(data)
    out = _measure(tmp_path, data)
    assert "more JSON objects and arrays than the limit" in out["outcome"], out
    assert out["seconds"] < 0.5 * out["index_mb"] and out["extra_mb"] < 3 * out["index_mb"], out
