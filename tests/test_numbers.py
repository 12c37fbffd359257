"""shardsafe._numbers: the one ceiling division and the one byte-size formatter."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from shardsafe._numbers import ceil_div, human_bytes


@pytest.mark.parametrize("a", [0, 1, 4095, 4096, 4097, 10**12 + 7])
@pytest.mark.parametrize("b", [1, 3, 4096])
def test_ceil_div_rounds_up(a: int, b: int) -> None:
    assert ceil_div(a, b) == math.ceil(Fraction(a, b))


@pytest.mark.parametrize(("n", "largest", "text"), [
    (None, "TiB", "-"), (0, "TiB", "0 B"), (1023, "TiB", "1023 B"), (1536, "TiB", "1.5 KiB"),
    (5 * 2**20, "TiB", "5.0 MiB"), (3 * 2**40, "TiB", "3.0 TiB"), (3 * 2**40, "GiB", "3072.0 GiB"),
    (2**60, "TiB", "1048576.0 TiB")])
def test_human_bytes(n: int | None, largest: str, text: str) -> None:
    assert human_bytes(n, largest) == text  # type: ignore[arg-type]
