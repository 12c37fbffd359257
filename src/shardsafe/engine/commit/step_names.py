"""The names of a manager's step directories: ``step_<N>``, N zero-padded to 8 digits
(wider numbers are accepted). The manager names its steps with them; the diagnosis of a
path that is not a checkpoint (``diagnose``) recognises a directory of steps by them.
"""

from __future__ import annotations

import re

_STEP_RE = re.compile(r"^step_(\d+)$")


def step_name(step: int) -> str:
    """Directory name of ``step`` (``step_00000042``)."""
    return f"step_{step:08d}"


def parse_step(name: str) -> int | None:
    """The step a directory name stands for, or None if it is not a step directory."""
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


__all__ = ["parse_step", "step_name"]
