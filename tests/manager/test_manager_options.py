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


def test_signature_spells_out_every_option_with_its_type_and_default() -> None:
    """One source of truth: the manager's keywords are exactly ManagerOptions' fields."""
    import inspect
    import typing

    from shardsafe.manager.options import option_docs

    params = list(inspect.signature(shardsafe.CheckpointManager).parameters.values())
    assert params[0].name == "directory"
    fields = dataclasses.fields(ManagerOptions)
    assert [p.name for p in params[1:]] == [f.name for f in fields]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:])
    for p, f in zip(params[1:], fields):
        assert p.default == f.default and p.annotation == f.type, f.name
    hints = typing.get_type_hints(shardsafe.CheckpointManager.__init__)
    assert all(hints[f.name] == typing.get_type_hints(ManagerOptions)[f.name] for f in fields)
    docs = option_docs()
    assert set(docs) == {f.name for f in fields} and all(docs.values())
    assert all(f"{f.name} (default" in shardsafe.CheckpointManager.__doc__ for f in fields)


@pytest.mark.parametrize("kwargs, names", [
    ({"read_only": True, "incremental": True}, ["incremental"]),
    ({"read_only": True, "compression": "zstd", "max_staging_bytes": 64 << 20},
     ["max_staging_bytes", "compression"]),
    ({"read_only": True, "local_directory": "x", "local_save_interval_steps": 2}, ["local_save_interval_steps"]),
    ({"read_only": True, "max_to_keep": 3, "async_save": False}, ["max_to_keep", "async_save"]),
    ({"max_staging_bytes": 32 << 20, "compression": "zstd"}, ["max_staging_bytes", "compression"]),
    ({"max_staging_bytes": 1 << 20}, ["max_staging_bytes"]),
])
def test_refused_combinations_name_their_options(kwargs, names) -> None:
    with pytest.raises(ValueError) as e:
        ManagerOptions(**kwargs)
    assert all(n in str(e.value) for n in names), str(e.value)


def test_options_that_combine(tmp_path) -> None:
    ManagerOptions(read_only=True, local_directory=str(tmp_path), local_replication=True, timeout=5,
                   best_fn=len, restore_fallback=False)
    ManagerOptions(max_staging_bytes=64 << 20, compression="auto", async_save=True, incremental=True,
                   local_directory=str(tmp_path))
    with pytest.raises(ValueError, match="max_staging_bytes.*object store"):
        shardsafe.CheckpointManager("s3://bucket/run", max_staging_bytes=64 << 20)
