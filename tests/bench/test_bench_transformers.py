"""python -m shardsafe.bench.transformers runs end to end (a smoke test, not a measurement)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

pytest.importorskip("transformers")

from shardsafe.bench import transformers as bench  # noqa: E402


def test_the_trainer_benchmark_reports_blocked_time_and_throughput(tmp_path) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bench.main(["--steps", "2", "--save-steps", "1", "--layers", "1", "--repeat", "1", "--dir", str(tmp_path),
                    "--json"])
    report = json.loads(out.getvalue())
    assert report["runs"]["plain"]["saves"] == 2 and report["runs"]["shardsafe"]["saves"] == 2
    assert report["runs"]["none"]["saves"] == 0
    assert report["blocked_ratio"] > 0 and set(report["throughput_vs_no_checkpoints"]) == {"plain", "shardsafe"}
