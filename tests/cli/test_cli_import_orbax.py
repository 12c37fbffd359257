"""``shardsafe import`` of Orbax checkpoints (``StandardCheckpointer``'s PyTree layout, OCDBT
and not, and a ``CheckpointManager`` step): bit-exact, checked against the source arrays."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
ocp = pytest.importorskip("orbax.checkpoint")

import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardsafe  # noqa: E402


def _bits(n: int, dtype, seed: int) -> np.ndarray:
    dt = np.dtype(dtype)
    return np.random.default_rng(seed).integers(0, 256, n * dt.itemsize, dtype=np.uint8).view(dt)


def _state() -> dict:
    devices = len(jax.devices())
    mesh = jax.make_mesh((devices,), ("x",))
    w = _bits(8 * devices * 16, np.float32, 0).reshape(8 * devices, 16)
    return {"params": {"w": jax.device_put(w, NamedSharding(mesh, P("x", None))),
                       "b": jax.device_put(_bits(16, ml_dtypes.bfloat16, 1), NamedSharding(mesh, P()))},
            "opt": [jnp.asarray(_bits(6, np.int8, 2)), jnp.asarray(_bits(4, ml_dtypes.float8_e4m3fn, 3))],
            "step": jnp.asarray(41, jnp.int32)}


def _same(ckpt: str, state: dict) -> None:
    got = shardsafe.load(ckpt)
    want = {"params.w": state["params"]["w"], "params.b": state["params"]["b"], "opt.0": state["opt"][0],
            "opt.1": state["opt"][1], "step": state["step"]}
    flat = {"params.w": got["params"]["w"], "params.b": got["params"]["b"], "opt.0": got["opt"][0],
            "opt.1": got["opt"][1], "step": got["step"]}
    for k, v in want.items():
        a, b = np.asarray(v), np.asarray(flat[k])
        assert (a.dtype, a.shape, a.tobytes()) == (b.dtype, b.shape, b.tobytes()), k


@pytest.mark.parametrize("ocdbt", [True, False])
def test_import_an_orbax_standard_checkpoint(cli, tmp_path, ocdbt: bool) -> None:  # noqa: ANN001
    state, src = _state(), str(tmp_path / "orbax")
    with ocp.Checkpointer(ocp.StandardCheckpointHandler(use_ocdbt=ocdbt)) as c:
        c.save(src, args=ocp.args.StandardSave(state))
    proc = cli("import", src, tmp_path / "out", "--json")
    assert proc.returncode == 0, proc.stderr
    assert '"format": "orbax"' in proc.stdout
    _same(str(tmp_path / "out"), state)


def test_import_an_orbax_manager_step(cli, tmp_path) -> None:  # noqa: ANN001
    state = _state()
    with ocp.CheckpointManager(str(tmp_path / "mgr")) as mgr:
        mgr.save(7, args=ocp.args.StandardSave(state))
        mgr.wait_until_finished()
    proc = cli("import", tmp_path / "mgr" / "7", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    _same(str(tmp_path / "out"), state)


def test_a_directory_that_is_neither_orbax_nor_dcp_is_refused(cli, tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "src").mkdir()
    proc = cli("import", tmp_path / "src", tmp_path / "out")
    assert proc.returncode != 0 and "not a DCP checkpoint" in proc.stderr


def test_the_verification_names_each_differing_key_path() -> None:
    from shardsafe.cli._orbax import same_values

    src = {"a": np.zeros(2, np.float32), "b": {"c": np.ones(3, np.int8)}, "n": [np.float32(1)]}
    assert same_values(src, {"a": np.zeros(2, np.float32), "b": {"c": np.ones(3, np.int8)},
                             "n": [np.float32(1)]}) == []
    assert same_values(src, {"a": np.zeros(2, np.float64), "b": {"c": np.zeros(3, np.int8)},
                             "n": [np.float32(2)]}) == ["a", "b.c", "n.0"]
    assert same_values(src, {"a": np.zeros(2, np.float32), "b": {"c": np.ones(3, np.int8)}}) == ["<root>"]
