"""The scale benchmark runs end to end on a small job and reports what it promises."""

from __future__ import annotations

import json
import subprocess
import sys

from shardsafe.bench.scale import run
from shardsafe.harness.synthetic_job import build_index
from shardsafe.format.index.v2 import decode, encode
from shardsafe.format.index.v4_layout import Header
from shardsafe.format.index.versions import encode_columnar


def test_simulated_job_is_a_valid_fsdp_index() -> None:
    index = build_index(8, 10)
    assert decode(encode(index)) == index
    ct = index.chunks
    assert all(s is not None and s.dim == 0 and s.file_stride == 1 for s in ct.splits)
    # tensor 7 is uneven (8 * 2 - 3 = 13 rows over 8 ranks: parts of 2, the last of 1)
    assert index.tensors[7].shape[0] == 13 and ct.tensor_chunks(7).extent[:, 0].tolist() == [2] * 6 + [1]
    assert len(index.files) == 8 and [f.rank for f in index.files] == list(range(8))


def test_figures() -> None:
    out = run(16, 20, v1=True)
    assert out["chunks"] == build_index(16, 20).chunks.num_chunks
    assert out["bytes_per_chunk"] == round(out["index_bytes"] / out["chunks"], 2) < 24
    assert out["v1_bytes_per_chunk"] > 4 * out["bytes_per_chunk"]
    assert out["reads_one_rank"] == 20 and out["write_imbalance"] < 1.1


def test_command_line_ends_with_one_json_line(subprocess_env: dict[str, str]) -> None:
    res = subprocess.run([sys.executable, "-m", "shardsafe.bench.scale", "--ranks", "8", "--tensors", "5"],
                         env=subprocess_env, capture_output=True, text=True, check=True, timeout=120)
    last = json.loads(res.stdout.strip().splitlines()[-1])
    for key in ("index_bytes", "encode_s", "decode_s", "plan_s", "peak_rss_mib", "bytes_per_chunk",
                "restore_index_bytes_rank", "restore_index_bytes_total", "reshard_index_bytes_rank",
                "restore_decode_s", "restore_list_requests", "restore_requests_rank"):
        assert key in last
    assert last["ranks"] == 8 and last["chunks"] == 40


def test_planning_exchange_bytes_first_and_repeat() -> None:
    out = run(16, 20)
    keys = ("plan_bytes_first", "plan_bytes_first_rank0", "plan_bytes_first_rank", "plan_bytes_repeat",
            "plan_bytes_repeat_rank0", "plan_bytes_repeat_rank", "plan_report_bytes", "plan_decision_bytes",
            "plan_first_s", "save_plan_s", "plan_bytes_exchanged", "plan_peak_rss_mib")
    for key in keys:
        assert out[key] > 0, key
    # a repeat save exchanges only the 49-byte hellos and a short "same" decision: under
    # 1 KB per rank (the first save is small too now: one shape, 40-byte reports)
    assert out["plan_bytes_repeat"] <= 16 * 1024 and out["plan_bytes_repeat"] * 3 < out["plan_bytes_first"]
    assert out["plan_bytes_repeat_rank"] < 49 + 200 < out["plan_bytes_first_rank"]
    # rank 0 reads every rank's hello and report (40 bytes each here) and one shape, its own
    # (set and fetched)
    assert 16 * (49 + 40) < out["plan_bytes_first_rank0"] < 16 * (49 + 40) + 2 * out["plan_report_bytes"] + 1000
    assert out["plan_bytes_exchanged"] == out["plan_bytes_first"]


def test_simulated_messages_are_the_exchange_messages() -> None:
    from shardsafe.bench.exchange import SimulatedJob
    from shardsafe.bench.scale import job_tensors
    from shardsafe.plan.collective.answer import decide_full, read_hellos
    from shardsafe.plan.collective.report import decode_report

    job = SimulatedJob(4, *job_tensors(4, 6))
    index = build_index(4, 6)
    hellos = read_hellos((job.hello(r, False) for r in range(4)), 4)
    reports = [job.report(r, r == 0) for r in range(4)]
    assert all(len(job.hello(r, True)) == 49 and job.hello(r, False)[:1] == b"N" for r in range(4))
    for r, raw in enumerate(reports):  # each rank's own bytes are its chunks of the index
        ct = index.chunks
        assert decode_report(raw, r).own == int(ct.nbytes[ct.file == r].sum())
    decision, parts, lead = decide_full(None, hellos, iter(reports),
                                        lambda: {"token": "t", "workdir": "w", "replace": False})
    assert lead is not None and decision["tensors"] == 6 and list(parts) == ["shape/" + job.shape.digest.hex()]
    # every rank writes its own shards: no box is left for the planner to assign
    assert lead.joined.plan.shared == ()
    assert list(lead.joined.plan.loads) == [int(index.chunks.nbytes[index.chunks.file == r].sum()) for r in range(4)]


def test_restore_reads_each_part_once() -> None:
    """Same layout: every rank reads or receives the head, reads one directory entry and
    its own part, nothing else, so all ranks together read each part once; resharded onto
    3/4 of the ranks, a rank reads a few parts; one LIST for the whole job."""
    out = run(16, 20, exchange=False)
    data = encode_columnar(build_index(16, 20))
    h = Header(data)
    parts = [n for _, n, _ in h.entries(data[h.directory : h.parts_start], 0)]
    assert out["index_bytes"] == len(data) and len(parts) == 16
    assert out["restore_head_bytes"] == h.head_size
    assert out["restore_index_bytes_rank"] == h.head_size + 16 + max(parts)
    assert out["restore_index_bytes_total"] == 16 * (h.head_size + 16) + sum(parts)
    # (parts and entries closer than 64 KiB are read in one request: here, with 280-byte
    # parts, a rank's few parts and those between them)
    assert out["restore_index_bytes_rank"] < out["reshard_index_bytes_rank"] < len(data)
    # rank 0: the header and the global part, its directory entry, its part, its data file's size
    assert out["restore_requests_rank"] == 5 and out["reshard_requests_rank"] <= 2 + 2 * 3 + 3
    assert out["restore_list_requests"] == 1
    assert 0 < out["restore_decode_s"] < 1 and 0 < out["reshard_decode_s"] < 1
