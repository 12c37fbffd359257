"""``shardsafe --version``: the package version, the index format saves write, and which
planes transform ``compression="auto"`` runs, with the compiled kernel's file."""

from __future__ import annotations

import pytest

import shardsafe
from shardsafe.cli import main
from shardsafe.format import planes_kernel
from shardsafe.format.index.versions import WRITE_VERSION


def _version(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    return capsys.readouterr().out.strip()


def test_version_names_the_format_and_the_kernel_file(capsys):
    out = _version(capsys)
    kernel = planes_kernel.loaded()
    assert out.startswith(f"shardsafe {shardsafe.__version__} (index format {WRITE_VERSION};"), out
    if kernel is None:
        assert out.endswith("planes transform: numpy (the compiled kernel is not built))"), out
    else:
        assert out.endswith(f"planes transform: compiled kernel {kernel.__file__})"), out


def test_version_without_the_kernel_says_numpy(capsys, monkeypatch):
    monkeypatch.setattr(planes_kernel, "_kernel", None)  # what an install without it loads
    assert _version(capsys).endswith("planes transform: numpy (the compiled kernel is not built))")
