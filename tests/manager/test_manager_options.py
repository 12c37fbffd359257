"""ManagerOptions: validation at construction, normalisation, immutability."""

from __future__ import annotations

import dataclasses
import datetime
import signal

import pytest

import shardsafe
from shardsafe.manager.options import ManagerOptions


@pytest.mark.parametrize("kwargs, match", [
    ({"save_interval_steps": 0}, "save_interval_steps"),
    ({"save_interval_steps": 2.5}, "save_interval_steps"),
    ({"save_interval_steps": True}, "save_interval_steps"),
    ({"max_to_keep": 0}, "max_to_keep"),
    ({"keep_period": -1}, "keep_period"),
    ({"save_interval_seconds": 0}, "save_interval_seconds"),
    ({"save_interval_seconds": float("nan")}, "save_interval_seconds"),
    ({"keep_time_interval": "1h"}, "keep_time_interval"),
    ({"save_on_steps": [1, -2]}, "save_on_steps"),
    ({"best_mode": "median", "best_fn": len}, "best_mode"),
    ({"best_mode": "min"}, "best_fn is None"),
    ({"best_fn": 3}, "callable"),
    ({"keep_checkpoints_without_metrics": False}, "only has a meaning with best_fn"),
    ({"preemption_signals": (signal.SIGKILL,)}, "SIGKILL"),
    ({"preemption_signals": (12345,)}, "not a signal"),
    ({"read_only": True, "preemption_signals": (signal.SIGTERM,)}, "read_only"),
    ({"async_save": "yes"}, "async_save"),
    ({"storage_options": 5}, "storage_options"),
])
def test_bad_options_raise(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        ManagerOptions(**kwargs)


def test_bad_options_raise_from_the_manager(tmp_path) -> None:
    with pytest.raises(ValueError, match="max_to_keep"):
        shardsafe.CheckpointManager(tmp_path / "c", max_to_keep=0)
    assert not (tmp_path / "c").exists()  # nothing was created
    with pytest.raises(TypeError):
        shardsafe.CheckpointManager(tmp_path / "c", max_to_kep=3)


def test_normalisation_and_frozen() -> None:
    o = ManagerOptions(save_on_steps=[5, 5, 7], keep_time_interval=datetime.timedelta(minutes=2),
                       save_interval_seconds=3, preemption_signals=[signal.SIGTERM, 10, signal.SIGTERM])
    assert o.save_on_steps == frozenset({5, 7})
    assert o.keep_time_interval == 120.0 and o.save_interval_seconds == 3.0
    assert o.preemption_signals == (signal.SIGTERM, signal.SIGUSR1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.max_to_keep = 3  # type: ignore[misc]


def test_from_options(tmp_path) -> None:
    opts = ManagerOptions(max_to_keep=2, save_interval_steps=5)
    with shardsafe.CheckpointManager.from_options(tmp_path, opts) as mgr:
        assert mgr.options == opts
        assert not mgr.should_save(3) and mgr.should_save(5)
