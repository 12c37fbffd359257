"""The benchmark runs end to end with one command and emits its tables: case (a) with the
machine limits by default, every case under -m stress."""

from __future__ import annotations

import subprocess

import pytest

from shardsafe.bench import parse_size
from shardsafe.bench.report import BEGIN, END, write_doc


def test_bench_quick_case_a_emits_its_tables_and_the_doc_section(tmp_path, cli):
    doc = tmp_path / "BENCH.md"
    doc.write_text(f"# Benchmarks\n\nhand-written notes\n\n{BEGIN}\nSTALE-TABLE\n{END}\n")
    r = cli("bench", "--quick", "--cases", "a", "--dir", tmp_path / "d", "--write-doc", doc)
    assert r.returncode == 0, r.stderr
    for text in ("### Targets, from this run", "### Case a:", "### Machine limits", "| shardsafe save |",
                 "| dcp.save |", "| torch.save + fsync |", "direct-I/O write",
                 "| dcp.async_save + shardsafe Writer, Stager |", "| torch_checkpointing save |",
                 "| torch_checkpointing async save |", "| torch_checkpointing load in place (cold) |",
                 "use_direct_io=False"):
        assert text in r.stdout, text
    assert "### Case b:" not in r.stdout
    text = doc.read_text()
    assert "hand-written notes" in text and "STALE-TABLE" not in text and "### Case a:" in text


@pytest.mark.stress
def test_bench_quick_emits_the_tables(tmp_path, subprocess_env, python):
    doc = tmp_path / "BENCH.md"
    doc.write_text(f"# Benchmarks\n\nhand-written notes\n\n{BEGIN}\nSTALE-TABLE\n{END}\n\nmore notes\n")
    r = subprocess.run([python, "-m", "shardsafe", "bench", "--quick", "--dir", str(tmp_path / "d"),
                        "--write-doc", str(doc)], env=subprocess_env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for heading in ("### Targets, from this run", "### Case a:", "### Case b:", "### Case c:",
                    "### Case d:", "### Machine limits"):
        assert heading in out
    for row in ("| shardsafe save |", "| shardsafe async_save (blocking) |", "| dcp.save |",
                "| dcp.async_save |", "| torch.save + fsync |", "| shardsafe load in place (cold) |",
                "| dcp.load in place (warm) |", "| none |", "direct-I/O write",
                "| 1/8 of the state |", "| unlimited |"):
        assert row in out, row
    text = doc.read_text()
    assert "hand-written notes" in text and "more notes" in text and "STALE-TABLE" not in text
    assert "### Case a:" in text and "Command: `shardsafe bench --quick" in text


def test_python_dash_m_entry_point_has_help(subprocess_env, python):
    r = subprocess.run([python, "-m", "shardsafe.bench", "--help"], env=subprocess_env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--write-doc" in r.stdout and "--cases" in r.stdout


@pytest.mark.parametrize("text,n", [("2GiB", 2 << 30), ("512MiB", 512 << 20), ("64m", 64 << 20),
                                    ("1048576", 1 << 20), ("1.5k", 1536)])
def test_parse_size(text, n):
    assert parse_size(text) == n


def test_write_doc_creates_or_appends(tmp_path):
    p = tmp_path / "x.md"
    write_doc(str(p), "T1")
    assert BEGIN in p.read_text() and "T1" in p.read_text()
    write_doc(str(p), "T2")
    assert "T2" in p.read_text() and "T1" not in p.read_text()


def test_the_command_help_says_what_the_cases_are_in_plain_text(cli):  # noqa: ANN001
    r = cli("bench", "--help")
    assert r.returncode == 0
    assert "``" not in r.stdout and "shardsafe bench:" not in r.stdout.split("options:")[0]
    for case in ("(a) large fp32 tensors", "(b) 20,000", "(c) a small transformer", "(d) case (a)'s state",
                 "(e) 100,000 tiny tensors", "compression: shardsafe's codecs", "pipeline: a sync save"):
        assert case in " ".join(r.stdout.split()), case
