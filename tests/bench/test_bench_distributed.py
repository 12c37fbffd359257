"""The distributed benchmark: its tables and Markdown section from given figures; the
whole benchmark end to end (tiny sizes, real ranks) under -m stress."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")


def _figures(save: float, load: float) -> dict:
    saves = {n: {"stall": save / 10, "durable": save * k}
             for k, n in enumerate(("shardsafe save", "shardsafe async_save", "dcp.save", "dcp.async_save"), 1)}
    loads = {f"{s} ({m})": {"load": load * k} for k, s in enumerate(("shardsafe load", "dcp.load"), 1)
             for m in ("warm", "cold")}
    return {"save": saves, "load": loads}


def test_tables_show_each_world_size_with_dcp_ratios_and_the_section_is_replaced(tmp_path) -> None:  # noqa: ANN001
    from shardsafe.bench.distributed import table, write_section

    results = {"run": {1: _figures(2.0, 1.0), 2: _figures(1.0, 0.5)},
               "reshard": {"1->2": {"shardsafe load (cold)": {"load": 0.5}, "dcp.load (cold)": {"load": 1.5}}}}
    text = table(results, 1 << 30)
    assert text.startswith("State: 1.00 GiB")
    for row in ("| 2 | shardsafe save | 100 ms | 1000 ms | 1.07 | 3.00x |",
                "| 1 | shardsafe async_save | 200 ms | 4000 ms | 0.27 | 2.00x |",
                "| 1 | in place, cold | 1000 ms | 2000 ms | 2.00x |",
                "| 1->2 | resharded, cold | 500 ms | 1500 ms | 3.00x |"):
        assert row in text, row
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\nthe single-process tables\n")
    write_section(str(doc), text, "cmd 1")
    write_section(str(doc), "new table", "cmd 2")
    out = doc.read_text()
    assert out.startswith("# Benchmarks\n\nthe single-process tables\n")
    assert out.count("<!-- distributed-bench:begin -->") == 1 and "new table" in out and "cmd 2" in out
    assert "| 2 | shardsafe save |" not in out


@pytest.mark.stress
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
