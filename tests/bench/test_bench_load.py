"""``shardsafe bench --cases load --quick`` runs end to end at tiny sizes and reports every
measurement of the case with its target (pass/fail)."""

from __future__ import annotations


def test_bench_quick_load_case_reports_every_target(tmp_path, cli):
    r = cli("bench", "--quick", "--cases", "load", "--dir", tmp_path / "d")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "### Case load:" in out
    for name in ("best O_DIRECT read", "torch.load(weights_only=True) cold", "torch.load(weights_only=True) warm",
                 "compression=auto load from /dev/shm", "FSDP-style 8 -> 6 reshard", "JAX 4x2 -> 8x1",
                 "manager local-tier save", "manager local-tier restore", "dcp.load cold"):
        line = next((ln for ln in out.splitlines() if name in ln and ln.startswith("| (load)")), None)
        assert line is not None, name
        assert line.rstrip(" |").endswith(("yes", "**no**", "–")), line
