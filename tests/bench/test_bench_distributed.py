"""The distributed benchmark runs end to end (tiny sizes) and writes its section."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")


def test_distributed_bench_smoke(tmp_path, subprocess_env) -> None:  # noqa: ANN001
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\nthe single-process tables\n")
    out = subprocess.run([sys.executable, "-m", "shardsafe.bench.distributed", "--size", "8MiB",
                          "--tensors", "4", "--repeat", "1", "--nproc", "1,2",
                          "--dir", str(tmp_path / "ck"), "--write-doc", str(doc)],
                         env=subprocess_env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    for row in ("| 2 | shardsafe save |", "| 2 | dcp.async_save |", "| 1->2 | resharded, cold |",
                "| 2->1 | resharded, cold |", "| 2 | in place, cold |"):
        assert row in out.stdout
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nthe single-process tables\n")  # kept
    assert text.count("<!-- distributed-bench:begin -->") == 1 and "| 2 | shardsafe save |" in text
    # a second run replaces the section instead of appending another
    from shardsafe.bench.distributed import write_section

    write_section(str(doc), "new table", "cmd")
    text = doc.read_text()
    assert text.count("<!-- distributed-bench:begin -->") == 1 and "new table" in text
    assert "| 2 | shardsafe save |" not in text
    assert os.path.isdir(tmp_path / "ck")
