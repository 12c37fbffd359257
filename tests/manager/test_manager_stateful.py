"""CheckpointManager.save(step, obj) and restore(obj) take a single Stateful object, from
the persistent tier and from the local tier alike."""

from __future__ import annotations

import torch

import shardsafe


def _model(fill: float) -> torch.nn.Module:
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    with torch.no_grad():
        for t in m.state_dict().values():
            if t.is_floating_point():
                t.fill_(fill)
    return m


def test_a_module_is_saved_and_restored_from_both_tiers(tmp_path) -> None:
    opts = dict(save_interval_steps=4, local_directory=str(tmp_path / "local"),
                local_save_interval_steps=2)
    with shardsafe.CheckpointManager(tmp_path / "persistent", **opts) as mgr:
        for step in range(7):
            model = _model(float(step))
            assert mgr.save(step, model) == (step % 4 == 0)
    with shardsafe.CheckpointManager(tmp_path / "persistent", **opts) as mgr:
        target = _model(-1.0)
        assert mgr.restore(target) == 6 and mgr.last_restore.tier == "local"
        assert torch.equal(target[0].weight, torch.full((4, 3), 6.0))
        assert torch.equal(target[1].running_var, torch.full((4,), 6.0))
        assert mgr.restore(target, step=4) == 4  # the persistent tier
        assert torch.equal(target[0].weight, torch.full((4, 3), 4.0))
    assert sorted(shardsafe.load(str(tmp_path / "persistent" / "step_00000004"))) == sorted(
        _model(0.0).state_dict())
