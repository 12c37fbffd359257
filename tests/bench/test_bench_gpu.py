"""The GPU benchmark without a GPU: its arithmetic and targets (table-driven), its
``--dry-run`` (every phase on tiny CPU tensors, the same code a GPU run executes), and
what it does on a machine with no GPU (says so, measures nothing)."""

from __future__ import annotations

import json

import pytest
import torch

from shardsafe.bench import gpu
from shardsafe.bench.gpu_report import (BASELINE, DCP, DCP_LOAD, PINNED, SHARDSAFE, SHARDSAFE_LOAD, TORCH,
                                        gpu_markdown, gpu_targets, summarize, targets_met)

GB = 10**9


def raw(*, ss_stall=0.2, dcp_stall=0.5, pinned=50.0, base=0.020, during=0.0205, nbytes=8 * GB) -> dict:
    """Raw results of a run whose shardsafe staging moved ``nbytes`` in ``ss_stall`` s."""
    return {"config": {"nbytes": nbytes, "tensors": 32, "rounds": 2, "device": "cuda:0"},
            "env": {"device": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "torch": "2.11.0+cu130"},
            "limits": {PINNED: [pinned, pinned + 2, pinned - 2]},
            "saves": {SHARDSAFE: {"stall": [ss_stall, ss_stall + 0.01], "durable": [5.0, 5.2]},
                      DCP: {"stall": [dcp_stall], "durable": [9.0]},
                      TORCH: {"stall": [30.0], "durable": [30.0]}},
            "training": {BASELINE: [base] * 5, SHARDSAFE: [during] * 9, DCP: [base * 1.2] * 9},
            "loads": {SHARDSAFE_LOAD: [2.0, 2.2], DCP_LOAD: [4.0]}, "skipped": []}


def test_summary_arithmetic() -> None:
    s = summarize(raw())
    assert s[SHARDSAFE]["blocked_s"] == pytest.approx(0.205)
    assert s[SHARDSAFE]["staging_gbs"] == pytest.approx(8 / 0.205)
    assert s[SHARDSAFE]["durable_s"] == pytest.approx(5.1)
    assert s[SHARDSAFE]["step_overhead"] == pytest.approx(0.025)
    assert s[DCP]["step_overhead"] == pytest.approx(0.2)
    assert s[TORCH]["step_overhead"] is None
    assert s[SHARDSAFE_LOAD]["load_s"] == pytest.approx(2.1) and s[DCP_LOAD]["load_gbs"] == pytest.approx(2.0)


# (raw results, expected [value, met] of each target: blocked ratio, D2H fraction, overhead)
CASES = [
    (raw(), [(0.205 / 0.5, True), (8 / 0.205 / 50, False), (0.025, True)]),
    (raw(ss_stall=0.17, pinned=50.0), [(0.175 / 0.5, True), (8 / 0.175 / 50, True), (0.025, True)]),
    (raw(ss_stall=0.3), [(0.305 / 0.5, False), (8 / 0.305 / 50, False), (0.025, True)]),
    (raw(during=0.0212), [(0.41, True), (8 / 0.205 / 50, False), (0.06, False)]),
    (raw(during=0.019), [(0.41, True), (8 / 0.205 / 50, False), (-0.05, True)]),
]


@pytest.mark.parametrize("results,want", CASES)
def test_targets(results, want) -> None:
    got = gpu_targets(results)
    assert [t.goal for t in got] == ["<= 0.50", ">= 0.80", "<= 0.05"]
    for t, (value, ok) in zip(got, want, strict=True):
        assert t.value == pytest.approx(value, rel=1e-6) and t.ok is ok, t
    assert targets_met(results) is all(ok for _, ok in want)


def test_unmeasured_targets_are_not_met() -> None:
    r = raw()
    del r["limits"][PINNED]
    r["training"][SHARDSAFE] = []
    got = gpu_targets(r)
    assert [t.ok for t in got] == [True, None, None] and not targets_met(r)
    assert not targets_met({})


def test_markdown_names_the_device_and_the_targets() -> None:
    text = gpu_markdown(raw(ss_stall=0.17), "python -m shardsafe.bench.gpu --out x")
    for line in ("Command: `python -m shardsafe.bench.gpu --out x`", "NVIDIA H100 80GB HBM3, driver 580.159.04",
                 "7.45 GiB on cuda:0", "| device-to-host: shardsafe staging GB/s / pinned copy_ GB/s | 0.91 |",
                 "| dcp.async_save (DCP's pinned, cached staging) | 0.500 |", "| +2.5% |",
                 "shardsafe's load is 1.90x as fast as dcp.load", "| pinned host memory | 50.0 |"):
        assert line in text, line
    assert "Dry run" not in text


def test_dry_run_runs_every_phase_on_the_cpu(tmp_path, capsys) -> None:
    out, doc = tmp_path / "out", tmp_path / "BENCH.md"
    doc.write_text("# Benchmarks\n\n<!-- gpu:begin -->\nOLD\n<!-- gpu:end -->\n")
    rc = gpu.main(["--dry-run", "--out", str(out), "--dir", str(tmp_path / "d"), "--write-doc", str(doc),
                   "--check-targets"])
    assert rc == 3  # the pinned copy limit cannot be measured on the CPU: a target unmeasured
    got = json.loads((out / gpu.JSON_NAME).read_text())
    assert got["config"]["dry_run"] and got["env"]["device"] == "cpu (dry run)" and not got["skipped"]
    for system in (SHARDSAFE, DCP, TORCH):
        assert len(got["saves"][system]["stall"]) == 1 and len(got["saves"][system]["durable"]) == 1, system
    assert got["training"][BASELINE] and got["training"][SHARDSAFE] and got["training"][DCP]
    assert got["loads"][SHARDSAFE_LOAD] and got["loads"][DCP_LOAD] and got["limits"]["pageable"]
    md = (out / gpu.MD_NAME).read_text()
    assert "Dry run on the CPU: not a measurement" in md and md.strip() in capsys.readouterr().out
    assert "OLD" not in doc.read_text() and "### Targets, from this run" in doc.read_text()
    assert sorted(p.name for p in out.iterdir()) == [gpu.JSON_NAME, gpu.MD_NAME]
    assert list((tmp_path / "d").iterdir()) == []  # every checkpoint it wrote is gone


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the benchmark would measure")
def test_without_a_gpu_it_says_so_and_measures_nothing(tmp_path, capsys) -> None:
    assert gpu.main(["--out", str(tmp_path / "out")]) == 0
    assert gpu.NO_GPU in capsys.readouterr().out and not (tmp_path / "out").exists()
