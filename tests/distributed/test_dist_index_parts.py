"""Restoring at scale on real processes: each rank reads the index's global part (by
broadcast) and only its own part, the job lists its steps once, and no value above 1 MB
goes through the c10d store (index_parts_worker.py; gloo on 127.0.0.1, a storage that
counts requests, a store that measures every value set).

The full form runs 16 ranks (restored on 16 and on 12) under ``-m stress``; the default
suite runs the same job on 4 ranks (restored on 4 and 3).
"""

from __future__ import annotations

import json
import os

import pytest
from dist_harness import run_script

from shardsafe.comm import free_loopback_port
from shardsafe.format.index.v4_layout import HEADER, Header
from shardsafe.format.index.versions import decode_index

MB = 1_000_000


def _job(out: str, world: int) -> tuple[list[dict], bytes]:
    run_script("index_parts_worker.py", world, out, str(world), str(free_loopback_port()), timeout=900)
    return _results(out, world)


def _results(out: str, world: int) -> tuple[list[dict], bytes]:
    results = []
    for r in range(world):
        with open(os.path.join(out, f"r{r}.json")) as f:
            results.append(json.load(f))
    with open(os.path.join(out, "run", "step_00000001", "index.json"), "rb") as f:
        return results, f.read()


def _check(results: list[dict], index: bytes, world: int) -> None:
    h = Header(index)
    assert decode_index(index).format_version == 4 and h.parts == world  # one part per writing rank
    parts = [n for _, n, _ in h.entries(index[h.directory : h.parts_start], 0)]
    head = h.head_size

    # no value above 1 MB was set in the c10d store, in any save or restore of the job,
    # although the big checkpoint's index head (its metadata) is larger: it was broadcast
    assert max(r["store_max"] for r in results) <= MB, [r["store_max"] for r in results]
    assert all(r["big"]["equal"] for r in results)
    assert all(r["big"]["received"] > MB for r in results[1:]) and results[0]["big"]["read"] > MB
    # an index of version 3 is read whole by rank 0 and broadcast whole, and loads the same
    v3 = [r["big_v3"] for r in results]
    # (rank 0 first reads the few bytes of a version 4 header to tell the versions apart)
    assert all(v["equal"] for v in v3) and v3[0]["read"] == HEADER.size + v3[0]["size"] > MB
    assert all(v["received"] == v["size"] and v["read"] == 0 for v in v3[1:])

    # same layout: rank r reads its own directory entry and its own part, once; rank 0 also
    # reads the head (two requests), the others receive it; every part is read by one rank
    same = [r["same"] for r in results]
    assert all(s["equal"] and s["step"] == 1 for s in same)
    for rank, s in enumerate(same):
        assert s["parts"] == [rank]
        assert s["read"] == (head if rank == 0 else 0) + 16 + parts[rank], (rank, s)
        assert s["received"] == (0 if rank == 0 else head)
        assert s["index_requests"] == (2 if rank == 0 else 0) + 2
    assert sum(s["read"] + s["received"] for s in same) == world * (head + 16) + sum(parts)

    # LIST requests for the whole job: rank 0 cleans up at start-up and lists once per
    # restore; the other ranks are told
    assert sum(r["startup"].get("list", 0) for r in results) <= 2
    for phase in ("same", "reshard"):
        rs = [r[phase] for r in results if phase in r]
        assert sum(s["startup"].get("list", 0) for s in rs) <= 2
        assert sum(s["restore"].get("list", 0) for s in rs) == 1 and rs[0]["restore"].get("list", 0) == 1
        for s in rs[1:]:
            # the other requests of a rank follow its share: its reads of the index (its
            # directory entries and parts), and one size query per data file it reads
            # (its own, and those of the tensors stored whole it loads)
            gets = s["restore"]["gets"]
            assert gets["index.json"] == s["index_requests"] <= 4
            assert s["restore"].get("head", 0) <= len(gets) - 1, s["restore"]

    # resharded onto 3/4 of the ranks: each reads exactly the parts of the files whose
    # chunks overlap its FSDP shard (rows [r c, (r + 1) c) of each tensor, c = ceil(rows /
    # ranks), as FSDP2 cuts them), found here from the whole index's chunks, and all
    # restore exactly
    smaller = world * 3 // 4
    reshard = [r["reshard"] for r in results[:smaller]]
    whole = decode_index(index)
    rank_of = {f.name: f.rank for f in whole.files}
    assert all(s["equal"] and s["step"] == 1 for s in reshard)
    for rank, s in enumerate(reshard):
        want = set()
        for t in whole.tensors:
            if len(t.chunks) < 2:
                continue  # stored as one chunk: in the global part
            c = -(-t.shape[0] // smaller)
            lo, hi = rank * c, min(t.shape[0], (rank + 1) * c)
            want |= {rank_of[k.file] for k in t.chunks if k.offsets[0] < hi and lo < k.offsets[0] + k.shape[0]}
        assert s["parts"] == sorted(want), (rank, s["parts"], sorted(want))
        span = range(min(want), max(want) + 1)  # neighbouring ranges are read in one request
        assert s["read"] + s["received"] <= head + 16 * len(span) + sum(parts[k] for k in span), (rank, s)


def test_restore_reads_only_its_parts_four_ranks(tmp_path) -> None:  # noqa: ANN001
    _check(*_job(str(tmp_path), 4), 4)


@pytest.mark.stress
def test_restore_reads_only_its_parts_sixteen_ranks(tmp_path) -> None:  # noqa: ANN001
    _check(*_job(str(tmp_path), 16), 16)
