"""What the manager adds for the local tier and the automatic interval, in one place.

``Tiers`` holds the optional ``LocalTier`` and ``AutoInterval`` of a manager and the
``RestoreInfo`` of its last restore; the manager calls it at a few points of ``save``,
``restore``, ``wait_until_finished`` and ``close``. Without ``local_directory`` and
``"auto"`` every call is a no-op.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, MutableMapping
from typing import Any

from ..comm import agreement
from .interval import AutoInterval
from .local_tier import LocalTier
from .options import ManagerOptions
from .tier_restore import RestoreInfo, restore_local


def _rank0_value(value: int) -> int:
    """Every rank gets rank 0's ``value`` (the agreed interval)."""
    return int(agreement.leader_decides(lambda: value, what="agreeing on the save interval"))


class Tiers:
    """The local tier, the automatic interval and the last restore of one manager.

    Args:
        opts: The manager's options.
        writable: False for a read-only manager (no local tier, no saves).
    """

    def __init__(self, opts: ManagerOptions, *, writable: bool) -> None:
        self.local: LocalTier | None = None
        if writable and opts.local_directory is not None:  # collective with replication
            self.local = LocalTier(opts.local_directory, interval=opts.local_save_interval_steps or 1,
                                   max_to_keep=opts.local_max_to_keep, replication=opts.local_replication)
        self.auto = AutoInterval(opts.expected_mtbf_seconds, _rank0_value) \
            if opts.expected_mtbf_seconds is not None else None
        self.interval = opts.save_interval_steps if isinstance(opts.save_interval_steps, int) else None
        self.last_restore: RestoreInfo | None = None

    def due(self, step: int) -> bool:
        """Whether the automatic interval makes ``step`` due (False without ``"auto"``)."""
        return self.auto is not None and self.auto.due(step)

    def after_save(self, step: int, state: Mapping[str, Any], saved: bool, blocked_s: float) -> None:
        """After ``save``: measures a persistent save; starts the local save if due.

        Raises:
            CheckpointError: The previous local save failed (this one has started).
        """
        if saved and self.auto is not None:
            self.auto.saved(step, blocked_s)
        if self.local is not None and self.local.due(step):
            self.local.save(step, state)

    def current_interval(self) -> int | None:
        return self.auto.interval if self.auto is not None else self.interval

    def local_steps(self) -> list[int]:
        return self.local.steps() if self.local is not None else []

    def restore_local(self, state: MutableMapping[str, Any], at_least: int | None) -> int | None:
        """The local/peer restore (collective); None: restore from the persistent tier."""
        if self.local is None:
            return None
        got = restore_local(self.local, state, at_least)
        if got is not None:
            self.last_restore = got
        return None if got is None else got.step

    def restored(self, step: int | None, t0: float, *, forget: bool) -> None:
        """Records a persistent restore; with ``forget`` local steps newer than it are
        dropped (training continues from ``step``: they would never be restored)."""
        self.last_restore = RestoreInfo(step, "persistent", time.monotonic() - t0)
        if forget and self.local is not None and step is not None:
            self.local.forget_newer(step)

    def wait(self) -> None:
        """Waits for the local save in flight (raises its error)."""
        if self.local is not None:
            self.local.wait()

    def close(self) -> None:
        if self.local is not None:
            self.local.close()


__all__ = ["Tiers"]
