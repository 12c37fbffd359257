"""save, async_save and load log one INFO line each (path, bytes, time, throughput) through
the "shardsafe" logger, stages at DEBUG, and never print."""

from __future__ import annotations

import logging
import re

import torch

import shardsafe

_TRANSFER = r"(\d+\.\d) MiB in \d+\.\d\d s \([\d.]+ [KMG]iB/s\)"


def _info(caplog) -> list[str]:  # noqa: ANN001
    return [r.getMessage() for r in caplog.records if r.name == "shardsafe" and r.levelno == logging.INFO]


def test_save_async_save_and_load_log_one_line_each(tmp_path, caplog, capsys) -> None:  # noqa: ANN001
    state = {"w": torch.randn(512, 1024)}  # 2 MiB
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with caplog.at_level(logging.INFO, logger="shardsafe"):
        shardsafe.save(state, a)
        shardsafe.async_save(state, b).result()
        shardsafe.load(a)
        shardsafe.load(b, {"w": torch.zeros(512, 1024)})
    lines = _info(caplog)
    assert len(lines) == 4, lines
    assert re.fullmatch(rf"saved {re.escape(a)}: {_TRANSFER}", lines[0]), lines[0]
    assert re.fullmatch(rf"saved {re.escape(b)}: {_TRANSFER}, blocked \d+\.\d\d s", lines[1]), lines[1]
    assert re.fullmatch(rf"loaded {re.escape(a)}: {_TRANSFER}", lines[2]), lines[2]
    assert re.fullmatch(rf"loaded {re.escape(b)}: {_TRANSFER}", lines[3]), lines[3]
    assert all(re.search(_TRANSFER, x).group(1) == "2.0" for x in lines)  # the state's 2 MiB
    assert capsys.readouterr().out == ""


def test_the_stages_are_at_debug(tmp_path, caplog) -> None:  # noqa: ANN001
    with caplog.at_level(logging.DEBUG, logger="shardsafe"):
        shardsafe.async_save({"w": torch.ones(1000)}, str(tmp_path / "c")).result()
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any(m.startswith(f"staged the save to {tmp_path / 'c'}: ") for m in debug), debug
