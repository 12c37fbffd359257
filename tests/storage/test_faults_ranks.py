"""A real gloo job saving to S3 through the fault proxy, one rank's uploads stalled for good:
that rank passes its deadline and raises ``CheckpointTimeoutError`` naming itself, the
file and the request; the others learn it through the save's abort path instead of
waiting in a barrier; every rank raises within deadline + 10 s; nothing is committed and
the previous checkpoint loads. Two ranks in the default suite, four under ``-m stress``
(``SHARDSAFE_FAULTS_RANKS_REPORT=<file>`` writes each rank's outcome there as JSON)."""

from __future__ import annotations

import json
import os

import pytest
from dist_harness import run_job

from fault_proxy import Faults

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "faults_worker.py")
SLACK = 10.0


def _stalled_job(faulty_s3, tmp_path, nprocs: int, stalled: int, deadline: float) -> list[dict]:  # noqa: ANN001
    loc = faulty_s3.loc
    faulty_s3.proxy.faults = Faults(stall=1.0, stall_seconds=600,
                                    only=lambda m, t: m == "PUT" and f"/bad/data-r{stalled:05d}" in t)
    job = run_job(WORKER, nprocs, str(tmp_path), f"{loc.url}/run", loc.options_json(), str(deadline),
                  timeout=240, env=loc.env)
    assert not job.hung and job.codes == [0] * nprocs, job.logs()
    results = [json.load(open(tmp_path / f"r{r}.json")) for r in range(nprocs)]
    for r in results:
        assert r["checkpoint_error"] and r["elapsed"] < deadline + SLACK, (r, job.logs())
        assert r["good"], r  # the previous checkpoint loads
    mine = results[stalled]
    assert mine["error"] == "CheckpointTimeoutError", mine
    assert f"rank {stalled}" in mine["message"] and f"data-r{stalled:05d}" in mine["message"]
    assert "PUT" in mine["message"], mine
    assert faulty_s3.proxy.counts["stall"] >= 1
    fs = faulty_s3.direct.filesystem()
    assert not fs.exists(f"{faulty_s3.direct.bucket}/run/bad/index.json")
    if os.environ.get("SHARDSAFE_FAULTS_RANKS_REPORT"):  # for the "faults" table of docs/BENCHMARKS.md
        with open(os.environ["SHARDSAFE_FAULTS_RANKS_REPORT"], "w") as f:
            json.dump({"ranks": nprocs, "stalled": stalled, "deadline_s": deadline, "results": results}, f, indent=1)
    return results


def test_a_rank_stalled_past_the_deadline_fails_every_rank_in_time(faulty_s3, tmp_path) -> None:  # noqa: ANN001
    results = _stalled_job(faulty_s3, tmp_path, 2, stalled=1, deadline=6.0)
    assert "rank 1" in results[0]["message"]  # rank 0 says which rank failed, and why


@pytest.mark.stress
def test_four_ranks_one_stalled(faulty_s3, tmp_path) -> None:  # noqa: ANN001
    results = _stalled_job(faulty_s3, tmp_path, 4, stalled=2, deadline=20.0)
    assert all("rank 2" in r["message"] for r in results), results
