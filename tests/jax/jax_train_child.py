"""A JAX training process for the crash-resume test (run as a script, never imported).

    python jax_train_child.py DIR PROGRESS LAST_STEP [KILL_AT]

Trains a sharded state (4x2 mesh of emulated CPU devices) from the manager's newest
step to LAST_STEP, saving through a CheckpointManager (``options``); with KILL_AT it
SIGKILLs itself right after saving that step. Appends "resumed N <tier>" and, at the
end, "final <digest>" to PROGRESS. The test imports ``update``, ``digest`` and
``options`` to resume and to train the uninterrupted reference in its own process.
"""

from __future__ import annotations

import os
import signal
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
from jax_states import train_state  # noqa: E402

import shardsafe  # noqa: E402


@jax.jit
def update(s):
    """One deterministic "step": every leaf changes, shardings stay."""
    return jax.tree_util.tree_map(lambda x: x + x.dtype.type(1) if x.dtype != bool else ~x, s)


def digest(state: dict) -> str:
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(state["train"]):
        h.update(np.asarray(leaf).tobytes())
    h.update(str(state["step"]).encode())
    return h.hexdigest()[:16]


def options(directory: object) -> dict:
    """The manager's options: async saves every 2 steps, 2 kept, a local tier every step."""
    return {"save_interval_steps": 2, "max_to_keep": 2, "local_directory": os.path.join(directory, "local"),
            "local_save_interval_steps": 1}


def main() -> None:
    directory, progress, last = sys.argv[1], sys.argv[2], int(sys.argv[3])
    kill_at = int(sys.argv[4]) if len(sys.argv) > 4 else -1
    mesh = jax.make_mesh((4, 2), ("dp", "tp"))
    state = {"train": train_state(mesh), "step": 0}
    mgr = shardsafe.CheckpointManager(directory, **options(directory))
    start = mgr.restore(state) or 0
    with open(progress, "a") as f:
        f.write(f"resumed {start} {mgr.last_restore.tier if mgr.last_restore else '-'}\n")
    for step in range(start + 1, last + 1):
        state["train"], state["step"] = update(state["train"]), step
        mgr.save(step, state)
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    mgr.wait_until_finished()
    mgr.close()
    with open(progress, "a") as f:
        f.write(f"final {digest(state)}\n")


if __name__ == "__main__":
    main()
