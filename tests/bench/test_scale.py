"""The scale benchmark runs end to end on a small job and reports what it promises."""

from __future__ import annotations

import json
import subprocess
import sys

from shardsafe.bench.scale import build_index, run
from shardsafe.format.index_v2 import decode, encode


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
    for key in ("index_bytes", "encode_s", "decode_s", "plan_s", "peak_rss_mib", "bytes_per_chunk"):
        assert key in last
    assert last["ranks"] == 8 and last["chunks"] == 40


def test_planning_exchange_bytes_first_and_repeat() -> None:
    out = run(16, 20)
    keys = ("plan_bytes_first", "plan_bytes_first_rank0", "plan_bytes_first_rank", "plan_bytes_repeat",
            "plan_bytes_repeat_rank0", "plan_bytes_repeat_rank", "plan_report_bytes", "plan_decision_bytes",
            "plan_first_s")
    for key in keys:
        assert out[key] > 0, key
    # a repeat save exchanges only the 33-byte digests and a short "same" decision
    assert out["plan_bytes_repeat"] * 10 < out["plan_bytes_first"]
    assert out["plan_bytes_repeat_rank"] < 33 + 200 < out["plan_bytes_first_rank"]
    # rank 0 reads every rank's report: at least 16 of them
    assert out["plan_bytes_first_rank0"] > 16 * out["plan_report_bytes"] // 2
    assert out["plan_bytes_first"] > 16 * out["plan_report_bytes"] // 2 + 15 * out["plan_decision_bytes"]


def test_simulated_messages_are_the_exchange_messages() -> None:
    from shardsafe.bench.exchange import SimulatedJob
    from shardsafe.engine.plan_exchange import decide_full
    from shardsafe.plan.distribute import decode_plan

    job = SimulatedJob(build_index(4, 6))
    reports = [job.full(r) for r in range(4)]
    assert all(len(job.first(r, True)) == 33 and job.first(r, False)[:1] == b"N" for r in range(4))
    kept: list[object] = []
    decision = decide_full(4, reports, lambda: {"token": "t", "workdir": "w", "replace": False}, kept.append)
    assert "error" not in decision and len(kept) == 1
    assert decision["solo"] == [] and len(decision["paths"]) == 6
    # every rank writes its own shards: no box is left for the planner to assign
    plan = decode_plan(decision["plan"].encode("utf-8"))
    assert plan.shared == () and plan.everywhere == ((), ())
    assert list(plan.loads) == job.nbytes.sum(axis=0).tolist()


def test_large_jobs_skip_rank0s_union_but_count_reports() -> None:
    out = run(8, 5, reports_max=4)
    assert out["plan_first_s"] is None and out["plan_decision_bytes"] is None
    assert out["plan_bytes_first"] > out["plan_bytes_repeat"] > 0
