"""``python -m shardsafe.bench.jax --processes 2``: a real 2-process ``jax.distributed`` job
times shardsafe and Orbax and the table names every metric with its target."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("orbax.checkpoint")


@pytest.mark.stress  # a 2-process JAX job saving with both libraries
def test_multi_process_bench_prints_its_table(tmp_path, capsys) -> None:  # noqa: ANN001
    from shardsafe.bench.jax import main

    main(["--processes", "2", "--mib", "16", "--repeat", "1", "--dir", str(tmp_path)])
    table = capsys.readouterr().out
    assert "| 16 MiB, 2 processes x 4 devices |" in table
    for metric in ("blocking", "durable", "restore same"):
        row = re.search(rf"\| {metric} \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x \| <= [\d.]+x, (met|missed) \|", table)
        assert row is not None and float(row.group(1)) > 0 and float(row.group(2)) > 0, (metric, table)
