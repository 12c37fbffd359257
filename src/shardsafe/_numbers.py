"""Small arithmetic and formatting helpers shared by every layer.

Imports nothing from the package, so any module (format included) may use it.
"""

from __future__ import annotations

from typing import Literal

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def ceil_div(a: int, b: int) -> int:
    """``a / b`` rounded up, for integers ``a >= 0`` and ``b > 0`` (``ceil_div(5, 4) == 2``)."""
    return -(-a // b)


def transfer(n: float, seconds: float) -> str:
    """A transfer for a log line: ``'1.2 GiB in 0.84 s (1.4 GiB/s)'``."""
    rate = human_bytes(n / seconds) + "/s" if seconds > 0 else "-"
    return f"{human_bytes(n)} in {seconds:.2f} s ({rate})"


def human_bytes(n: float | None, largest: Literal["GiB", "TiB"] = "TiB") -> str:
    """A size in binary units: ``1536`` -> ``'1.5 KiB'``; ``None`` -> ``'-'`` (unknown).

    Args:
        n: A number of bytes, or ``None`` when unknown.
        largest: The largest unit used; larger sizes are shown as many of it.
    """
    if n is None:
        return "-"
    value = float(n)
    for unit in _UNITS[: _UNITS.index(largest) + 1]:
        if value < 1024 or unit == largest:
            return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
