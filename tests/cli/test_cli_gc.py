"""``shardsafe gc``: retention by step and removal of leftovers older than --min-age."""

from __future__ import annotations

import json
import os
import time

import pytest

pytest.importorskip("torch")

from cli_helpers import save_step  # noqa: E402

import shardsafe  # noqa: E402


def _leftover(run: str, name: str, age: float) -> str:
    path = os.path.join(run, name)
    os.makedirs(path)
    data = os.path.join(path, "data-r00000-000.safetensors")
    with open(data, "wb") as f:
        f.write(b"\0" * 64)
    t = time.time() - age
    os.utime(data, (t, t))
    os.utime(path, (t, t))
    return path


def test_gc_keeps_newest_steps_and_removes_old_leftovers(cli, tmp_path) -> None:  # noqa: ANN001
    run = str(tmp_path / "run")
    for step in (1, 2, 10, 3):
        save_step(run, step)
    old = _leftover(run, ".step_00000011.shardsafe-tmp-aaaaaaaaaaaaaaaa", age=7200)
    young = _leftover(run, ".step_00000012.shardsafe-tmp-bbbbbbbbbbbbbbbb", age=5)
    os.makedirs(os.path.join(run, "logs"))  # not ours: never touched

    dry = cli("gc", run, "--max-to-keep", "2", "--min-age", "600", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would delete step_00000001 (step 1)" in dry.stdout
    assert sorted(os.listdir(run)) == sorted(["step_00000001", "step_00000002", "step_00000003",
                                              "step_00000010", os.path.basename(old),
                                              os.path.basename(young), "logs"])

    period = cli("gc", run, "--max-to-keep", "2", "--keep-period", "2", "--min-age", "600", "--dry-run")
    lines = period.stdout.splitlines()
    assert lines[:5] == ["would delete step_00000001 (step 1)",  # 2 is kept: even
                         f"would delete leftover {os.path.basename(old)}",
                         "would keep step_00000002: its step is divisible by --keep-period 2",
                         "would keep step_00000003: one of the 2 newest",
                         "would keep step_00000010: one of the 2 newest"]
    assert len(lines) == 6 and lines[5].startswith(
        f"would keep {os.path.basename(young)}: unfinished save, last written ")
    assert lines[5].endswith("s ago, younger than --min-age (600 s): a save may still be writing it")

    proc = cli("gc", run, "--max-to-keep", "2", "--min-age", "600")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["deleted step_00000001 (step 1)", "deleted step_00000002 (step 2)",
                                        f"deleted leftover {os.path.basename(old)}"]
    assert sorted(os.listdir(run)) == sorted(["step_00000003", "step_00000010",
                                              os.path.basename(young), "logs"])
    assert shardsafe.load(os.path.join(run, "step_00000010"))["optim"]["step"] == 10

    again = cli("gc", run, "--max-to-keep", "2", "--min-age", "600")
    assert again.stdout.strip() == "nothing to remove"


def test_gc_orders_unnamed_checkpoints_by_creation_time(cli, tmp_path) -> None:  # noqa: ANN001
    import torch

    for name in ("zeta", "alpha", "mid"):  # saved in this order: names do not sort by age
        shardsafe.save({"x": torch.ones(1)}, str(tmp_path / name))
        time.sleep(0.05)
    proc = cli("gc", tmp_path, "--max-to-keep", "1")
    assert proc.stdout.splitlines() == ["deleted zeta", "deleted alpha"]
    assert sorted(os.listdir(tmp_path)) == ["mid"]


@pytest.mark.parametrize("args, message", [
    (("--max-to-keep", "0"), "argument --max-to-keep: must be at least 1, got 0"),
    (("--keep-period", "-2"), "argument --keep-period: must be at least 1, got -2"),
    (("--min-age", "-1"), "argument --min-age: must be at least 0, got -1"),
    (("--min-age", "an hour"), "argument --min-age: not a number: 'an hour'"),
    (("--max-to-keep", "1.5"), "argument --max-to-keep: not a number: '1.5'"),
])
def test_gc_bad_arguments_are_usage_errors(cli, tmp_path, args, message) -> None:  # noqa: ANN001
    save_step(str(tmp_path), 1)
    proc = cli("gc", tmp_path, *args)
    assert proc.returncode == 2, proc.stderr  # argparse's exit code, as for any bad argument
    assert proc.stderr.splitlines()[-1] == f"shardsafe gc: error: {message}"
    assert proc.stdout == "" and os.listdir(tmp_path) == ["step_00000001"]


def test_gc_json_reports_what_it_deleted_and_kept(cli, tmp_path) -> None:  # noqa: ANN001
    run = str(tmp_path / "run")
    for step in (1, 2, 3):
        save_step(run, step)
    old = _leftover(run, ".step_00000004.shardsafe-tmp-aaaaaaaaaaaaaaaa", age=7200)
    young = _leftover(run, "step_00000005", age=5)  # an object-store-like partial step
    os.makedirs(os.path.join(run, "step_00000006"))
    open(os.path.join(run, "step_00000006", "index.json"), "wb").close()  # committed, unreadable

    def report(*extra: str) -> dict:
        proc = cli("gc", run, "--max-to-keep", "1", "--min-age", "600", "--json", *extra)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    dry = report("--dry-run")
    assert dry["dry_run"] is True
    assert dry["deleted"] == [{"name": "step_00000001", "step": 1, "what": "checkpoint"},
                              {"name": "step_00000002", "step": 2, "what": "checkpoint"},
                              {"name": os.path.basename(old), "step": 4, "what": "leftover"}]
    kept = {k["name"]: k["reason"] for k in dry["kept"]}
    assert kept.keys() == {"step_00000003", "step_00000005", "step_00000006"}
    assert kept["step_00000003"] == "one of the 1 newest"
    assert "younger than --min-age (600 s)" in kept["step_00000005"]
    assert kept["step_00000006"].startswith("damaged (")
    assert (dry["uploads_aborted"], dry["uploads_kept"], dry["uploads_left"]) == ([], [], [])
    assert len(os.listdir(run)) == 6  # a dry run removes nothing

    done = report()
    assert done["dry_run"] is False and done["deleted"] == dry["deleted"]
    assert [k["name"] for k in done["kept"]] == [k["name"] for k in dry["kept"]]
    assert sorted(os.listdir(run)) == ["step_00000003", "step_00000005", "step_00000006"]
    assert os.path.basename(young) == "step_00000005"


def _outside(tmp_path) -> tuple[str, str]:  # noqa: ANN001
    """A directory of unrelated files and a committed checkpoint of another run."""
    victim = tmp_path / "elsewhere"
    victim.mkdir()
    (victim / "notes.txt").write_text("unrelated")
    (victim / "data-r00000-000.safetensors").write_bytes(b"\0" * 64)
    other = save_step(str(tmp_path / "other_run"), 1)
    (tmp_path / "other_run" / "step_00000001" / "unrelated.txt").write_text("keep me")
    return str(victim), other


def test_gc_never_deletes_through_a_symlinked_step(cli, tmp_path) -> None:  # noqa: ANN001
    run = str(tmp_path / "run")
    for step in (5, 6):
        save_step(run, step)
    victim, other = _outside(tmp_path)
    before = {p: sorted(os.listdir(p)) for p in (victim, other)}
    os.symlink(victim, os.path.join(run, "step_00000002"))  # no index: looks like a leftover
    os.symlink(other, os.path.join(run, "step_00000001"))  # committed, older: would expire
    os.symlink(victim, os.path.join(run, ".step_00000009.shardsafe-tmp-0123456789abcdef"))
    proc = cli("gc", run, "--max-to-keep", "1", "--min-age", "0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["deleted step_00000005 (step 5)"]
    assert {p: sorted(os.listdir(p)) for p in (victim, other)} == before
    assert shardsafe.load(other)["optim"]["step"] == 1
    assert sorted(os.listdir(run)) == [".step_00000009.shardsafe-tmp-0123456789abcdef",
                                       "step_00000001", "step_00000002", "step_00000006"]
    ls = cli("ls", run)
    assert ls.returncode == 0 and "step_00000001" not in ls.stdout, ls.stdout


def test_gc_leaves_a_fifo_named_like_a_step(cli, tmp_path) -> None:  # noqa: ANN001
    run = str(tmp_path / "run")
    save_step(run, 5)
    os.mkfifo(os.path.join(run, "step_00000004"))
    proc = cli("gc", run, "--min-age", "0", timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "nothing to remove"
    assert os.path.exists(os.path.join(run, "step_00000004"))
