"""Index and planning at scale, simulated without processes.

``python -m shardsafe.bench.scale --ranks 1024 --tensors 1000`` builds the checkpoint an
FSDP job of R ranks would write (each of T tensors split evenly along dimension 0 over
the ranks, one data file per rank), builds and encodes the index (in the version saves
write) with the real encoder, decodes and validates it with the real decoder, and plans
one rank's load the way ``shardsafe.load`` does (the index's global part and the parts
the rank's shard needs, ``engine.load.index_exchange``, then the reader's planner
``engine.load.reader.ChunkReader.tasks``, which builds objects only for the chunks that overlap
the rank's shard). ``plan.table_reads`` (fully vectorised) is timed too. The restore of
the job, on the same number of ranks and resharded onto 3/4 of them, is simulated by
``bench.restore`` (``restore_*`` and ``reshard_*``: index bytes per rank and in all, the
time to decode what a rank needs, storage requests). It prints a table and, last, one
JSON line.

The planning exchange of a collective save (``engine.save.plan_exchange``) is simulated by
``bench.exchange`` with the functions the real exchange runs: the bytes every rank
exchanges on a first save and on a repeat save with the same layout
(``plan_bytes_first``/``plan_bytes_repeat``: all ranks together, also given as
``plan_bytes_exchanged``; ``_rank0``: rank 0; ``_rank``: the largest other rank), and
rank 0's work in a first save (``plan_first_s``, also ``save_plan_s``: reading the
hellos and every rank's report one at a time, joining them, ``plan_writers``, the
answer and its parts). ``write_imbalance`` is that plan's largest load over the mean.

``--v1`` also times the v1 JSON index and the v1 load planner (``pieces_for`` over
``ChunkEntry`` objects) for the same layout; ``--dcp`` sizes the ``.metadata`` file that
DCP's own writer writes for the layout, for comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ..engine.load.reader import ChunkReader, ReadJob
from ..format.dtypes import lookup
from ..format.index.v4_layout import Header
from ..format.index.versions import decode, encode_columnar
from ..format.index.model import ColumnarIndex
from ..plan.table_reads import even_shard_reads, row_split_tensors
from ..storage.local import LocalStorage
from ..harness.synthetic_job import build_index, job_tensors
from ..engine.load.index_exchange import from_head
from .exchange import simulate
from .restore import CKPT, SimulatedStorage, restore_figures, shard_regions

T = TypeVar("T")


def _timed(fn: Callable[[], T]) -> tuple[T, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _timed_cpu(fn: Callable[[], T]) -> tuple[T, float, float]:
    """Wall and CPU seconds (on a shared machine the CPU time shows the work, not the wait)."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def load_plan(data: bytes, files: dict[str, int], rank: int, world: int) -> tuple[int, float]:
    """What ``shardsafe.load`` does on rank ``rank`` of ``world`` for an FSDP target before any
    read, given the index ``data`` and its data files' sizes: decode the index's global part
    (received from rank 0), choose, read and decode the parts its dim-0 shard of every
    tensor needs (``engine.load.index_exchange``), then plan the reads with the reader's
    planner. Returns (I/O tasks planned, seconds spent decoding and choosing)."""
    storage = SimulatedStorage(data, files)
    head = data[: Header(data).head_size]
    t0 = time.perf_counter()
    read = from_head(storage, CKPT, head)  # type: ignore[arg-type]
    regions = shard_regions(read.index.infos or (), world, rank)
    index = read.narrow(regions)
    decode_s = time.perf_counter() - t0
    jobs = []
    for t, offsets, shape in regions:
        e = index.tensors[t]
        dest = np.empty(int(np.prod(shape)) * lookup(e.dtype).itemsize, dtype=np.uint8)
        jobs.append(ReadJob(e, dest, offsets, shape))
    return len(ChunkReader(LocalStorage(), "bench", index).tasks(jobs)), decode_s


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(ranks: int, tensors: int, v1: bool = False, dcp: bool = False, exchange: bool = True) -> dict[str, Any]:
    """Measures one configuration; returns the figures of the JSON line.

    ``exchange``: also simulate the planning exchange (``bench.exchange``), first, so
    that ``plan_peak_rss_mib`` is the high-water mark of rank 0's planning alone."""
    save = {"save_plan_s": None, "plan_bytes_exchanged": None, "write_imbalance": None}
    figures: dict[str, Any] = {}
    if exchange:
        figures = simulate(ranks, *job_tensors(ranks, tensors))
        save = {"save_plan_s": figures["plan_first_s"], "plan_bytes_exchanged": figures["plan_bytes_first"],
                "write_imbalance": figures.pop("write_imbalance")}
        figures["plan_peak_rss_mib"] = round(_peak_mib(), 1)
    index, build_s = _timed(lambda: build_index(ranks, tensors))
    data, encode_s, encode_cpu = _timed_cpu(lambda: encode_columnar(index))
    (decoded, _), decode_s, decode_cpu = _timed_cpu(lambda: decode(data))
    if decoded != index:
        raise AssertionError("decode(encode(index)) differs from the index")
    del decoded
    ts = row_split_tensors(index.chunks)
    reads, table_plan_s = _timed(lambda: even_shard_reads(index.chunks, ts, ranks // 2, ranks))
    files = {f.name: f.size for f in index.files}
    (tasks, load_decode_s), load_plan_s = _timed(lambda: load_plan(data, files, ranks // 2, ranks))
    n = index.chunks.num_chunks
    out: dict[str, Any] = {
        "ranks": ranks, "tensors": tensors, "chunks": n, "index_bytes": len(data),
        "bytes_per_chunk": round(len(data) / n, 2), "build_s": round(build_s, 3),
        "encode_s": round(encode_s, 3), "decode_s": round(decode_s, 3),
        "encode_cpu_s": round(encode_cpu, 3), "decode_cpu_s": round(decode_cpu, 3),
        "load_decode_s": round(load_decode_s, 3), "load_plan_s": round(load_plan_s - load_decode_s, 4),
        "table_plan_s": round(table_plan_s, 4), "reads_one_rank": len(reads), "read_tasks_one_rank": tasks}
    out.update(restore_figures(index, ranks, data))
    del data
    if v1:
        out.update(_v1_figures(index, ranks))
    if dcp:
        out["dcp_metadata_bytes"] = dcp_metadata_bytes(index)
        out["dcp_bytes_per_chunk"] = round(out["dcp_metadata_bytes"] / n, 2)
    out["peak_rss_mib"] = round(_peak_mib(), 1)
    out.update(figures)
    out.update(save)
    out["plan_s"] = round((save["save_plan_s"] or 0) + out["load_plan_s"], 3)
    return out


def _v1_figures(index: ColumnarIndex, ranks: int) -> dict[str, Any]:
    """The v1 JSON index and the v1 load planner on the same layout."""
    from ..format.index.versions import decode_index, encode_index  # bench only: v1 goes through objects
    from ..plan.load_plan import pieces_for

    data = encode_columnar(index)
    old, convert_s = _timed(lambda: decode_index(data))
    raw, enc_s = _timed(lambda: encode_index(old, version=1))
    back, dec_s = _timed(lambda: decode_index(raw))
    q_of = [-(-t.shape[0] // ranks) for t in back.tensors]
    m = ranks // 2

    def plan() -> int:
        count = 0
        for t, q in zip(back.tensors, q_of):
            lo = min(m * q, t.shape[0])
            hi = min(lo + q, t.shape[0])
            count += len(pieces_for(t.chunks, (lo,) + (0,) * (len(t.shape) - 1),
                                    (hi - lo,) + t.shape[1:]))
        return count

    _, plan_s = _timed(plan)
    return {"v1_index_bytes": len(raw), "v1_bytes_per_chunk": round(len(raw) / index.chunks.num_chunks, 2),
            "v1_encode_s": round(enc_s, 3), "v1_decode_s": round(dec_s, 3),
            "v1_load_plan_s": round(plan_s, 3), "v2_to_v1_objects_s": round(convert_s, 3)}


def dcp_metadata_bytes(index: ColumnarIndex) -> int:
    """Size of the ``.metadata`` file DCP's own ``FileSystemWriter.finish`` writes for these chunks."""
    import torch
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata, MetadataIndex,
                                                       TensorProperties, TensorStorageMetadata)
    from torch.distributed.checkpoint.storage import WriteResult

    sd: dict[str, Any] = {}
    results: list[WriteResult] = []
    ct = index.chunks
    for t, info in enumerate(index.tensors):
        fqn = ".".join(map(str, info.key))
        c = ct.tensor_chunks(t)
        chunks = []
        for i in range(len(c.file)):
            off, size = torch.Size(c.pos[i].tolist()), torch.Size(c.extent[i].tolist())
            chunks.append(ChunkStorageMetadata(offsets=off, sizes=size))
            results.append(WriteResult(MetadataIndex(fqn, off), int(c.nbytes[i]), _StorageInfo(
                f"__{int(c.file[i])}_0.distcp", int(c.offset[i]), int(c.nbytes[i]))))
        sd[fqn] = TensorStorageMetadata(TensorProperties(dtype=getattr(torch, info.dtype)),
                                        torch.Size(info.shape), chunks)
    with tempfile.TemporaryDirectory() as d:
        writer = FileSystemWriter(d, sync_files=False)
        writer.set_up_storage_writer(True)
        writer.finish(Metadata(state_dict_metadata=sd), [results])
        return os.path.getsize(os.path.join(d, ".metadata"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shardsafe.bench.scale", description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--tensors", type=int, default=1000)
    p.add_argument("--v1", action="store_true", help="also time the v1 JSON index and planner")
    p.add_argument("--dcp", action="store_true", help="also size DCP's pickled metadata")
    p.add_argument("--no-exchange", action="store_true", help="skip the planning exchange")
    args = p.parse_args(argv)
    out = run(args.ranks, args.tensors, v1=args.v1, dcp=args.dcp, exchange=not args.no_exchange)
    for k, v in out.items():
        print(f"{k:24} {v}")
    print(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
