"""A trainer with a frozen base and a changing adapter, saving incrementally until killed.

``python incremental_child.py DIR PROGRESS ASYNC`` (run by test_manager_incremental.py,
never imported by it except for ``expected``). Appends "ready" and then "committed N"
(fsynced) once step N is known to be committed.
"""

from __future__ import annotations

import os
import sys

import torch

BASE_NUMEL = 1 << 20  # 4 MiB frozen float32 base: a kill often lands inside a save
MAX_TO_KEEP = 2


def expected(step: int) -> dict:
    """The state at ``step``: the base never changes, the adapter does every step."""
    return {"base": torch.arange(BASE_NUMEL, dtype=torch.float32),
            "adapter": {"a": torch.full((1 << 18,), float(step)), "b": torch.arange(64) + step},
            "step": step}


def main() -> int:
    import shardsafe

    directory, progress, async_save = sys.argv[1], sys.argv[2], bool(int(sys.argv[3]))
    fd = os.open(progress, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def note(line: str) -> None:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)

    state = expected(0)
    with shardsafe.CheckpointManager(directory, max_to_keep=MAX_TO_KEEP, incremental=True,
                                     async_save=async_save) as mgr:
        start = (mgr.latest_step() or -1) + 1
        note("ready")
        for step in range(start, start + 100_000):
            state["adapter"]["a"].fill_(float(step))
            torch.arange(64, out=state["adapter"]["b"]).add_(step)
            state["step"] = step
            mgr.save(step, state)
            note(f"committed {step - 1}" if async_save else f"committed {step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
