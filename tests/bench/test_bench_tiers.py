"""``python -m shardsafe.bench.tiers``: both restores happen and the JSON line is complete."""

from __future__ import annotations

import json
import subprocess
import sys


def test_tiers_bench_prints_its_json_line(tmp_path, subprocess_env) -> None:  # noqa: ANN001
    proc = subprocess.run([sys.executable, "-m", "shardsafe.bench.tiers", "--size", "4MiB",
                           "--repeat", "1", "--dir", str(tmp_path / "p"),
                           "--local-dir", str(tmp_path / "l")],
                          env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["state_bytes"] == 4 << 20 and r["local_s"] > 0 and r["persistent_cold_s"] > 0
    assert (tmp_path / "l" / "rank_0").is_dir()  # the local tier was written where asked
