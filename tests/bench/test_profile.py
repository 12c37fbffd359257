"""``python -m shardsafe.bench.profile`` profiles a save and both loads of tiny tensors."""

from __future__ import annotations

from shardsafe.bench.profile import main


def test_profile_reports_each_operation(capsys, tmp_path):
    assert main(["--count", "50", "--repeat", "1", "--top", "5", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for op in ("shardsafe.save", "shardsafe.load (new tensors)", "shardsafe.load (in place)"):
        assert f"## {op}: " in out
    assert out.count("Ordered by: internal time") == 3
