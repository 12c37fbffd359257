"""Pure parts of the CLI: verify's read coalescing, gc's retention choice, subtree lookup."""

from __future__ import annotations

import pytest

from shardsafe._numbers import ceil_div
from shardsafe.cli._listing import Entry, scan
from shardsafe.cli._tensors import leaves, subtree
from shardsafe.cli.gc import expired
from shardsafe.cli.verify import plan_reads
from shardsafe.format.index.objects import Index, TensorEntry
from shardsafe.format.index.rows import ChunkEntry, FileEntry
from shardsafe.storage import LocalStorage

BS = 4096


def _index(chunks: list[tuple[str, str, int, int]], block_size: int = BS) -> Index:
    """An index of 1-D uint8 tensors: (key, file, offset, nbytes) each."""
    tensors, files = [], {}
    for i, (key, file, offset, n) in enumerate(chunks):
        nblocks = max(1, ceil_div(n, block_size))
        c = ChunkEntry(file, offset, n, (0,), (n,), tuple(range(nblocks)))
        tensors.append(TensorEntry((key,), "numpy", "uint8", (n,), (c,)))
        files[file] = max(files.get(file, 0), offset + n)
    tree = {"t": "dict", "k": [k for k, *_ in chunks],
            "v": [{"t": "tensor", "id": i} for i in range(len(chunks))]}
    return Index(tree=tree, tensors=tuple(tensors), block_size=block_size,
                 files=tuple(FileEntry(f, size, 4096) for f, size in sorted(files.items())))


def test_plan_reads_coalesces_neighbours_and_splits_at_the_limit() -> None:
    idx = _index([("a", "f0", 4096, 100), ("b", "f0", 4196, 50), ("c", "f0", 4246, 3 * BS),
                  ("d", "f1", 4096, 10)])
    ranges = plan_reads(idx, max_read=2 * BS)
    spans = [(r.file, r.start, r.end, [(b.key, b.number) for b in r.blocks]) for r in ranges]
    assert spans == [
        ("f0", 4096, 4246 + BS, [("a", 0), ("b", 0), ("c", 0)]),
        ("f0", 4246 + BS, 4246 + 3 * BS, [("c", 1), ("c", 2)]),
        ("f1", 4096, 4106, [("d", 0)]),
    ]
    # every block is checked exactly once, with its own checksum
    blocks = [b for r in ranges for b in r.blocks]
    assert sorted((b.key, b.number, b.chunk.checksums[b.number]) for b in blocks) == [
        ("a", 0, 0), ("b", 0, 0), ("c", 0, 0), ("c", 1, 1), ("c", 2, 2), ("d", 0, 0)]


def test_plan_reads_handles_empty_tensors_and_gaps() -> None:
    idx = _index([("e", "f0", 4096, 0), ("x", "f0", 4096, 10), ("y", "f0", 8192, 10)])
    ranges = plan_reads(idx)
    assert [(r.start, r.end) for r in ranges] == [(4096, 4106), (8192, 8202)]
    assert [b.key for b in ranges[0].blocks] == ["e", "x"]


def _entry(name: str, step: int | None, created: float, state: str = "committed") -> Entry:
    idx = Index(tree={"t": "dict", "k": [], "v": []}, tensors=(), files=(), block_size=BS,
                created=created,
                metadata={} if step is None else {"shardsafe.manager": {"step": step}})
    return Entry(name, name, state, index=idx if state == "committed" else None)


@pytest.mark.parametrize("keep, want", [(None, []), (5, []), (3, []), (2, ["step_00000001"]),
                                        (1, ["step_00000001", "step_00000002"])])
def test_expired_keeps_the_newest_steps(keep, want) -> None:  # noqa: ANN001
    entries = [_entry("step_00000002", 2, created=300.0), _entry("step_00000010", 10, created=100.0),
               _entry("step_00000001", 1, created=200.0), _entry("step_00000011", None, 0, "partial")]
    assert [e.name for e in expired(entries, keep)] == want


def test_expired_ignores_unstepped_checkpoints_in_a_manager_directory() -> None:
    entries = [_entry("step_00000001", 1, 1.0), _entry("step_00000002", 2, 2.0), _entry("best", None, 0.5)]
    assert [e.name for e in expired(entries, 1)] == ["step_00000001"]


def test_expired_with_keep_period_uses_the_manager_policy() -> None:
    entries = [_entry(f"step_{s:08d}", s, float(s)) for s in (1, 2, 3, 4, 5, 6)]
    assert [e.step for e in expired(entries, 2, keep_period=2)] == [1, 3]


def test_expired_orders_other_checkpoints_by_creation() -> None:
    entries = [_entry("b", None, 3.0), _entry("a", None, 1.0), _entry("c", None, 2.0)]
    assert [e.name for e in expired(entries, 1)] == ["a", "c"]
    with pytest.raises(ValueError, match="step_"):
        expired(entries, 1, keep_period=2)


def test_subtree_finds_keys_containing_dots() -> None:
    tree = {"t": "dict", "k": ["model", "model.x"],
            "v": [{"t": "dict", "k": ["layer.weight", 0], "v": [{"t": "int", "v": 1}, {"t": "int", "v": 2}]},
                  {"t": "int", "v": 3}]}
    idx = Index(tree=tree, tensors=(), files=(), block_size=BS)
    node, path = subtree(idx, "model.layer.weight")
    assert (node, path) == ({"t": "int", "v": 1}, ("model", "layer.weight"))
    assert subtree(idx, "model.0")[1] == ("model", 0)
    assert subtree(idx, "model.x")[1] == ("model.x",)
    assert [leaf.dotted for leaf in leaves(idx, *subtree(idx, "model"))] == ["model.layer.weight", "model.0"]
    with pytest.raises(KeyError):
        subtree(idx, "model.nope")


@pytest.mark.parametrize("data_file", ["data-r00000-000.safetensors", "data-r00000-001.blocks"])
def test_scan_takes_a_directory_of_data_files_without_index_for_an_unfinished_save(tmp_path, data_file) -> None:  # noqa: ANN001
    for name in ("run_a", "notes"):
        (tmp_path / name).mkdir()
    (tmp_path / "run_a" / data_file).write_bytes(b"\0" * 16)  # an object store's upload, no index
    (tmp_path / "notes" / "readme.txt").write_text("not a checkpoint")
    found = [(e.name, e.state) for e in scan(LocalStorage(), str(tmp_path))]
    assert found == [("run_a", "partial")]
