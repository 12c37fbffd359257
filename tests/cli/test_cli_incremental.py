"""The CLI on an incremental manager directory: info, ls, verify, export and gc understand
references to earlier steps' data files."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")

from helpers import flip_byte  # noqa: E402

import shardsafe  # noqa: E402
from shardsafe.manager.lock import LOCK_NAME  # noqa: E402

DATA = "data-r00000-000.safetensors"
BASE = torch.arange(32768, dtype=torch.float32)  # 128 KiB, never changes


def _run(root: str, steps: int = 4, max_to_keep: int | None = 2) -> None:
    with shardsafe.CheckpointManager(root, max_to_keep=max_to_keep, incremental=True) as mgr:
        for step in range(steps):
            mgr.save(step, {"base": BASE, "adapter": torch.full((16,), float(step)), "step": step})
    assert LOCK_NAME not in os.listdir(root)  # released on close


def test_info_separates_own_and_referenced_bytes(cli, tmp_path) -> None:  # noqa: ANN001
    root = str(tmp_path / "run")
    _run(root)
    p = cli("info", os.path.join(root, "step_00000003"), "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["referenced_bytes"] == BASE.nbytes
    assert d["bytes"] < 8192  # the adapter, the header and padding
    assert [f["reference"] for f in d["files"]] == [False, True]
    text = cli("info", os.path.join(root, "step_00000003")).stdout
    assert "references   128.0 KiB of unchanged chunks in 1 data file(s) of step_00000000" in text


def test_ls_shows_references_and_referenced_leftovers(cli, tmp_path) -> None:  # noqa: ANN001
    root = str(tmp_path / "run")
    _run(root)
    p = cli("ls", root, "--json")
    assert p.returncode == 0, p.stderr
    rows = {r["name"]: r for r in json.loads(p.stdout)}
    assert rows["step_00000000"]["state"] == "referenced"  # retired, its data still in use
    assert rows["step_00000003"]["state"] == "committed"
    assert rows["step_00000003"]["referenced_bytes"] == BASE.nbytes
    assert "(+128.0 KiB referenced)" in cli("ls", root).stdout


def test_verify_checks_referenced_data(cli, tmp_path) -> None:  # noqa: ANN001
    root = str(tmp_path / "run")
    _run(root)
    ok = cli("verify", root)
    assert ok.returncode == 0 and "OK  step_00000003: 2 tensors, 2 file(s)" in ok.stdout, ok.stdout
    victim = os.path.join(root, "step_00000000", DATA)
    flip_byte(victim, 4096 + 100, 0x01)  # inside the base, which every kept step references
    bad = cli("verify", root)
    assert bad.returncode == 1
    assert "2 of 2 checkpoint(s) damaged" in bad.stdout and f"step_00000000/{DATA}" in bad.stdout


def test_export_copies_referenced_tensors(cli, tmp_path) -> None:  # noqa: ANN001
    from safetensors.torch import load_file

    root = str(tmp_path / "run")
    _run(root)
    out = str(tmp_path / "step3.safetensors")
    p = cli("export", os.path.join(root, "step_00000003"), out)
    assert p.returncode == 0, p.stderr
    got = load_file(out)
    assert torch.equal(got["base"], BASE) and torch.equal(got["adapter"], torch.full((16,), 3.0))


def test_gc_keeps_referenced_data(cli, tmp_path) -> None:  # noqa: ANN001
    root = str(tmp_path / "run")
    _run(root, steps=4, max_to_keep=None)
    dry = cli("gc", root, "--max-to-keep", "1", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would delete step_00000000 (step 0)" in dry.stdout
    assert "kept step_00000000: 1 data file(s) that committed checkpoints reference" in dry.stdout
    assert len(os.listdir(root)) == 4  # a dry run removes nothing
    p = cli("gc", root, "--max-to-keep", "1")
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(root)) == ["step_00000000", "step_00000003"]
    assert os.listdir(os.path.join(root, "step_00000000")) == [DATA]
    assert torch.equal(shardsafe.load(os.path.join(root, "step_00000003"))["base"], BASE)
    shardsafe.delete(os.path.join(root, "step_00000003"))
    p = cli("gc", root, "--min-age", "0")  # nothing references step 0's data any more
    assert p.returncode == 0 and "deleted leftover step_00000000" in p.stdout, p.stdout
    assert os.listdir(root) == []


def test_compressed_references(cli, tmp_path) -> None:  # noqa: ANN001
    """incremental=True with compression: info counts the referenced chunks' stored bytes,
    export decodes them, gc keeps the referenced block file."""
    from safetensors.torch import load_file

    from shardsafe.plan.layout import block_file_name

    root = str(tmp_path / "run")
    base = (torch.randn(512, 512, generator=torch.Generator().manual_seed(3)) * 0.02).to(torch.bfloat16)
    with shardsafe.CheckpointManager(root, incremental=True, compression="auto") as mgr:
        for step in range(3):
            mgr.save(step, {"base": base, "adapter": torch.full((16,), float(step)), "step": step})
    last = os.path.join(root, "step_00000002")
    d = json.loads(cli("info", last, "--json").stdout)
    blocks = os.path.getsize(os.path.join(root, "step_00000000", block_file_name(0)))
    assert d["referenced_bytes"] == blocks - 8 < base.nbytes  # the base as stored: compressed
    assert "compression  " in cli("info", last).stdout
    out = str(tmp_path / "step2.safetensors")
    assert cli("export", last, out).returncode == 0
    assert torch.equal(load_file(out)["base"], base)
    p = cli("gc", root, "--max-to-keep", "1")
    assert p.returncode == 0, p.stderr
    assert block_file_name(0) in os.listdir(os.path.join(root, "step_00000000"))
    assert cli("verify", last).returncode == 0
    assert torch.equal(shardsafe.load(last)["base"], base)


def test_rolled_back_steps_verify_and_gc_leaves_them(tmp_path, capsys) -> None:  # noqa: ANN001
    from shardsafe.cli import main

    root = str(tmp_path / "run")
    _run(root, steps=4, max_to_keep=None)
    with shardsafe.CheckpointManager(root, incremental=True) as mgr:
        state = {"base": torch.zeros_like(BASE), "adapter": torch.zeros(16), "step": 0}
        assert mgr.restore(state, step=1, rollback=True) == 1  # steps 2 and 3 moved aside
        for step in (2, 3):
            mgr.save(step, {"base": BASE, "adapter": torch.full((16,), 10.0 * step), "step": step})
    rolled = sorted(n for n in os.listdir(root) if ".rolled-back-" in n)
    assert [n[:13] for n in rolled] == ["step_00000002", "step_00000003"]
    # their files are links of the files they referenced, which hold other chunks too
    assert main(["verify", root]) == 0, capsys.readouterr().out
    capsys.readouterr()
    # the manager never expires moved-aside steps, nor does gc; the new steps 2 and 3 are steps
    assert main(["gc", root, "--max-to-keep", "1", "--min-age", "0"]) == 0
    out = capsys.readouterr().out
    assert "deleted step_00000002 (step 2)" in out and "rolled-back" not in out, out
    assert sorted(n for n in os.listdir(root) if ".rolled-back-" in n) == rolled
    for n, step in zip(rolled, (2, 3)):
        assert torch.equal(shardsafe.load(os.path.join(root, n))["adapter"], torch.full((16,), float(step)))
    assert torch.equal(shardsafe.load(os.path.join(root, "step_00000003"))["adapter"], torch.full((16,), 30.0))
    with pytest.raises(shardsafe.CheckpointNotFoundError):
        shardsafe.load(os.path.join(root, "step_00000002"))
