"""``shardsafe verify CKPT|DIR``: check the index, every data-file header and every checksum.

Reads are coalesced: neighbouring chunks of a file are fetched as one byte range of up
to ``MAX_READ`` bytes (one request on object stores instead of one per small tensor),
and ranges are checked concurrently on the shared I/O pool. Memory stays at
``MAX_READ`` per I/O thread however large the checkpoint is.

Blocks are checked by ``format.block_verify.BlockStream`` as the bytes stream past.
Compressed chunks (block files, docs/FORMAT.md section 12) are checked twice per block:
the stored bytes against their CRC32C, then, decoded, against the raw CRC32C (a block
decodes to at most ``block_size`` bytes, which an index with compressed chunks keeps at
64 MiB or less). A block file's magic and its tiling by the chunks replace the
safetensors header check.
"""

from __future__ import annotations

import argparse
import json
import struct
from collections.abc import Callable
from concurrent.futures import as_completed
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import EXIT_FAILED, EXIT_OK
from ._args import add_command, add_quiet_option, resolve_step, storage_options
from ._listing import Entry, checkpoints_at
from ._output import progress
from ..errors import CheckpointError
from ..format.block_verify import BlockSpan, BlockStream, index_spans
from ..format.blockfile import DATA_START, MAGIC
from ..format.datafile import parse_header
from ..format.index.objects import Index
from ..format.index.rows import FileEntry
from ..format.index.rows import split_reference
from ..plan.header_check import MAX_HEADER_BYTES, header_problems
from ..plan.load_plan import coalesce
from ..storage import Storage, storage_for
from ..engine.io_pool import io_pool
from ..engine.commit.diagnose import not_found
from ..engine.commit.locations import data_file

MAX_READ = 64 << 20


@dataclass(slots=True)
class ReadRange:
    """Bytes ``[start, end)`` of ``file`` covering ``blocks``."""

    file: str
    start: int
    end: int
    blocks: list[BlockSpan] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Problem:
    """A damaged part of a checkpoint: one output line of ``verify``."""

    checkpoint: str
    message: str
    file: str | None = None
    key: str | None = None

    def __str__(self) -> str:
        where = "".join(f" {k}={v!r}" for k, v in (("file", self.file), ("key", self.key)) if v)
        return f"BAD {self.checkpoint}:{where} {self.message}"


def plan_reads(index: Index, max_read: int = MAX_READ) -> list[ReadRange]:
    """Groups every checksum block of ``index`` into coalesced reads (pure)."""
    spans = index_spans(index)
    ids = {f.name: i for i, f in enumerate(index.files)}
    order, bounds = coalesce([ids[b.chunk.file] for b in spans], [b.offset for b in spans],
                             [b.length for b in spans], max_read)
    groups = [[spans[i] for i in order[a:b]] for a, b in zip(bounds.tolist(), bounds[1:].tolist())]
    return [ReadRange(g[0].chunk.file, g[0].offset, max(b.offset + b.length for b in g), g)
            for g in groups]


def _check_range(storage: Storage, path: str, r: ReadRange, block_size: int,
                 label: str) -> list[Problem]:
    """Reads ``r`` in pieces of at most ``MAX_READ`` bytes (a range is longer only when it
    is one block of a huge ``block_size``) and checks its blocks as they stream past."""
    stream = BlockStream(r.blocks, block_size)
    target = data_file(storage, path, r.file)
    buf = np.empty(min(MAX_READ, r.end - r.start), dtype=np.uint8)
    bad: dict[str, Problem] = {}
    pos = r.start
    try:
        while True:
            view = memoryview(buf)[: min(MAX_READ, r.end - pos)]
            storage.read_into(target, pos, view)
            for e in stream.feed(pos, view):
                bad.setdefault(e.key or "", Problem(label, e.message, r.file, e.key))
            pos += len(view)
            if pos >= r.end:
                break
    except EOFError:
        return [Problem(label, "data file is truncated", r.file, r.blocks[0].key)]
    return list(bad.values())


def _read_header(storage: Storage, path: str, f: FileEntry) -> dict:
    """The parsed safetensors header of data file ``f``; reads at most ``MAX_HEADER_BYTES``.

    Raises:
        ValueError: the header is damaged, longer than allowed, or does not end at the
            ``data_start`` the index gives.
    """
    target = data_file(storage, path, f.name)
    length = bytearray(8)
    storage.read_into(target, 0, memoryview(length))
    (n,) = struct.unpack("<Q", length)
    if n > MAX_HEADER_BYTES or 8 + n != f.data_start:
        raise ValueError(f"header length {n} does not match the index's data_start "
                         f"{f.data_start} (at most {MAX_HEADER_BYTES} bytes)")
    prefix = bytearray(8 + n)
    storage.read_into(target, 0, memoryview(prefix))
    _, entries = parse_header(bytes(prefix))
    return entries


def _block_file_problem(storage: Storage, path: str, f: FileEntry, held: int) -> str | None:
    """What is wrong with block file ``f`` beyond its blocks: its magic, and whether its
    chunks (``held`` stored bytes) fill it exactly (the index keeps them apart, so their
    sizes must add up)."""
    magic = bytearray(len(MAGIC))
    storage.read_into(data_file(storage, path, f.name), 0, memoryview(magic))
    if bytes(magic) != MAGIC:
        return f"block file does not start with {MAGIC!r}"
    if split_reference(f.name) is not None:  # a reference: this index uses some of its chunks
        return None if held <= f.size - f.data_start else (
            f"the index places {held} bytes of chunks in a block file of {f.size - f.data_start}")
    if held != f.size - f.data_start:
        return f"block file holds {f.size - f.data_start} bytes of chunks, the index places {held}"
    return None


def _check_headers(storage: Storage, path: str, index: Index, label: str) -> list[Problem]:
    """Each data file must stay a valid safetensors file saying exactly what the index says
    (a block file: start with its magic and hold exactly its chunks)."""
    problems = []
    held: dict[str, int] = {}
    if any(f.data_start == DATA_START for f in index.files):
        for t in index.tensors:
            for c in t.chunks:
                held[c.file] = held.get(c.file, 0) + c.stored_nbytes
    for f in index.files:
        if f.data_start == DATA_START:
            try:
                msg = _block_file_problem(storage, path, f, held.get(f.name, 0))
            except (OSError, EOFError, CheckpointError) as e:
                msg = f"cannot read: {e}"
            if msg is not None:
                problems.append(Problem(label, msg, f.name))
            continue
        try:
            entries = _read_header(storage, path, f)
        except (ValueError, EOFError) as e:
            problems.append(Problem(label, f"safetensors header is damaged ({e})", f.name))
            continue
        except (OSError, CheckpointError) as e:
            problems.append(Problem(label, f"cannot read: {e}", f.name))
            continue
        problems.extend(Problem(label, f"safetensors header: {m}", f.name)
                        for m in header_problems(index, f, entries))
    return problems


def verify_checkpoint(storage: Storage, entry: Entry, label: str,
                      on_bytes: Callable[[int], None] | None = None) -> list[Problem]:
    """Every problem of one checkpoint (empty when it is intact)."""
    if entry.index is None:
        return [Problem(label, entry.error or f"not a committed checkpoint ({entry.state})")]
    index = entry.index
    problems = _check_headers(storage, entry.path, index, label)
    futures = {io_pool().submit(_check_range, storage, entry.path, r, index.block_size, label): r
               for r in plan_reads(index)}
    for fut in as_completed(futures):
        try:
            problems.extend(fut.result())
        except (OSError, CheckpointError) as e:
            r = futures[fut]
            problems.append(Problem(label, f"cannot read: {e}", r.file, r.blocks[0].key))
        if on_bytes is not None:
            r = futures[fut]
            on_bytes(r.end - r.start)
    return sorted(problems, key=lambda p: (p.file or "", p.key or "", p.message))


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "verify", run, "check every checksum of a checkpoint or directory",
                "Check the index, the data-file headers and every chunk checksum of CKPT, or of "
                "every checkpoint in DIR. Prints one line per damaged file/key and exits 1 if any "
                "is found.",
                ("path", "CKPT|DIR", "checkpoint, or directory of checkpoints"),
                json_help="print JSON for machines: one record per checkpoint, with its problems")
    add_quiet_option(p)


def run(args: argparse.Namespace) -> int:
    shown = resolve_step(args.path, storage_options(args))
    storage, path = storage_for(shown, storage_options(args))
    entries = [e for e in checkpoints_at(storage, path) if e.state != "partial"]
    if not entries:
        raise not_found(storage, path, shown)
    single = len(entries) == 1 and entries[0].path == path
    total = sum(f.size for e in entries if e.index is not None for f in e.index.files)
    bar = progress(total, "verify", args.quiet)
    records = []
    try:
        for e in entries:
            label = shown if single else e.name
            problems = verify_checkpoint(storage, e, label, bar.update)
            records.append(_record(e, label, problems))
            if args.json:
                continue
            with bar.paused():
                for p in problems:
                    print(p)
                if not problems:
                    print(f"OK  {label}: {len(e.index.tensors)} tensors, {len(e.index.files)} file(s)")
    finally:
        bar.close()
    bad = sum(not r["ok"] for r in records)
    if args.json:
        print(json.dumps({"checkpoints": records, "damaged": bad}, indent=2))
    elif bad:
        print(f"{bad} of {len(entries)} checkpoint(s) damaged")
    return EXIT_FAILED if bad else EXIT_OK


def _record(e: Entry, label: str, problems: list[Problem]) -> dict[str, Any]:
    """What ``verify --json`` reports of one checkpoint."""
    return {"name": label, "path": e.path, "step": e.step, "ok": not problems,
            "tensors": len(e.index.tensors) if e.index is not None else None,
            "files": len(e.index.files) if e.index is not None else None,
            "problems": [{"message": p.message, "file": p.file, "key": p.key} for p in problems]}
