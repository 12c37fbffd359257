"""``python -m shardsafe.bench.tiers`` (its main, in process): the saves and both restores happen and the JSON line is complete;
the local-tier section of ``shardsafe demo`` (a small state, in process) reports both times."""

from __future__ import annotations

import json
import re

import pytest

from shardsafe.bench.tiers import CONFIGS, local_tier_section, main, save_steps


@pytest.mark.stress  # six fresh processes; the two tests below are its fast representatives
def test_tiers_bench_prints_its_json_line(tmp_path, capsys) -> None:  # noqa: ANN001
    assert main(["--size", "4MiB", "--repeat", "1", "--steps", "2", "--dir", str(tmp_path / "p"),
                 "--local-dir", str(tmp_path / "l")]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["state_bytes"] == 4 << 20 and r["local_s"] > 0 and r["persistent_cold_s"] > 0
    assert r["save_persistent_s"] > 0 and r["save_both_s"] > 0 and r["save_budget_s"] > 0
    assert r["both_vs_persistent"] > 0 and r["extra_both_bytes"] is not None
    for name in ("both", "budget", "restore"):  # the local tier was written where asked
        assert (tmp_path / "l" / name / "rank_0").is_dir(), name


def test_local_tier_section_times_both_tiers() -> None:
    text = local_tier_section(4 << 20)
    assert "restoring a 4 MiB state" in text
    local = float(re.search(r"from the local tier .*:\s+([\d.]+) s", text).group(1))
    cold = float(re.search(r"cold page cache:\s+([\d.]+) s", text).group(1))
    speedup = float(re.search(r"the local tier is ([\d.]+)x faster", text).group(1))
    assert local > 0 and cold > 0
    # the times are printed to the millisecond and the speed-up to a tenth: the speed-up must
    # lie within what the rounded times allow
    lo, hi = (cold - 0.0005) / (local + 0.0005), (cold + 0.0005) / max(local - 0.0005, 1e-9)
    assert lo - 0.05 <= speedup <= hi + 0.05, (local, cold, speedup)


def test_the_save_configurations_in_this_process(tmp_path) -> None:  # noqa: ANN001
    got = save_steps(4 << 20, str(tmp_path / "p"), str(tmp_path / "l"), steps=2, budget=64 << 20)
    assert sorted(got["blocked_s"]) == sorted(CONFIGS)
    assert all(len(v) == 2 and min(v) > 0 for v in got["blocked_s"].values())
    for name in ("both", "budget"):  # the local tier was written where asked
        assert (tmp_path / "l" / name / "rank_0").is_dir(), name

