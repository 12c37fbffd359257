"""``python -m shardsafe.bench.tiers``: both restores happen and the JSON line is complete;
the local-tier section of ``shardsafe demo`` (a small state, in process) reports both times."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from shardsafe.bench.tiers import local_tier_section


def test_tiers_bench_prints_its_json_line(tmp_path, subprocess_env) -> None:  # noqa: ANN001
    proc = subprocess.run([sys.executable, "-m", "shardsafe.bench.tiers", "--size", "4MiB",
                           "--repeat", "1", "--dir", str(tmp_path / "p"),
                           "--local-dir", str(tmp_path / "l")],
                          env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["state_bytes"] == 4 << 20 and r["local_s"] > 0 and r["persistent_cold_s"] > 0
    assert (tmp_path / "l" / "rank_0").is_dir()  # the local tier was written where asked


def test_local_tier_section_times_both_tiers() -> None:
    text = local_tier_section(4 << 20)
    assert "restoring a 4 MiB state" in text
    local = float(re.search(r"from the local tier .*:\s+([\d.]+) s", text).group(1))
    cold = float(re.search(r"cold page cache:\s+([\d.]+) s", text).group(1))
    speedup = float(re.search(r"the local tier is ([\d.]+)x faster", text).group(1))
    assert local > 0 and cold > 0 and abs(speedup - cold / local) < 0.1 * speedup + 0.1
