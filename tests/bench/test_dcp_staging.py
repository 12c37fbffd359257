"""The dcp.async_save staging benchmark runs end to end (tiny sizes) and prints its table."""

from __future__ import annotations

from shardsafe.bench import dcp_staging


def test_dcp_staging_benchmark_runs_and_holds_its_budget(tmp_path, capsys) -> None:  # noqa: ANN001
    res = dcp_staging.run(4 << 20, 1, str(tmp_path), tensor_size=1 << 20)
    assert len(res["samples"]["default"]) == len(res["samples"]["stager"]) == 1
    assert 0 < res["peak"] <= res["budget"]
    text = dcp_staging.table(res)
    assert "| shardsafe.dcp.Stager |" in text and "held" in text
    assert dcp_staging.main(["--size", "2MiB", "--repeat", "1", "--dir", str(tmp_path)]) == 0
    assert "caller blocked" in capsys.readouterr().out
