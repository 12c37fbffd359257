"""``shardsafe import``: torch.save (weights-only), safetensors and DCP directories."""

from __future__ import annotations

import os
import warnings

import pytest

torch = pytest.importorskip("torch")

import shardsafe  # noqa: E402
from cli_helpers import one_line_error  # noqa: E402


def _state() -> dict:
    return {"model": {"w": torch.randn(6, 2), "b": torch.zeros(2, dtype=torch.bfloat16)},
            "step": 12, "lrs": [0.1, 0.01], "name": "run-a"}


def test_import_torch_save_file(cli, tmp_path) -> None:  # noqa: ANN001
    state = _state()
    torch.save(state, tmp_path / "ck.pt")
    proc = cli("import", tmp_path / "ck.pt", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    got = shardsafe.load(str(tmp_path / "out"))
    assert torch.equal(got["model"]["w"], state["model"]["w"]) and got["model"]["b"].dtype == torch.bfloat16
    assert (got["step"], got["lrs"], got["name"]) == (12, [0.1, 0.01], "run-a")


class Payload:
    """Unpickling this object would create a marker file; weights-only loading must refuse it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (open, (self.marker, "w"))


def test_import_refuses_arbitrary_objects_without_running_them(cli, tmp_path) -> None:  # noqa: ANN001
    marker = tmp_path / "pwned"
    torch.save({"w": torch.ones(1), "evil": Payload(str(marker))}, tmp_path / "evil.pt")
    proc = cli("import", tmp_path / "evil.pt", tmp_path / "out")
    assert proc.returncode == 1
    assert "weights_only" in one_line_error(proc)
    assert not marker.exists()
    assert not (tmp_path / "out").exists()


def test_import_safetensors_file(cli, tmp_path) -> None:  # noqa: ANN001
    st = pytest.importorskip("safetensors.torch")
    tensors = {"model.w": torch.randn(3, 3), "model.b": torch.arange(3, dtype=torch.int32)}
    st.save_file(tensors, str(tmp_path / "m.safetensors"), metadata={"note": "hi"})
    proc = cli("import", tmp_path / "m.safetensors", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    got = shardsafe.load(str(tmp_path / "out"))
    assert sorted(got) == ["model.b", "model.w"] and torch.equal(got["model.w"], tensors["model.w"])
    index = shardsafe.api.load.read_checkpoint_index(str(tmp_path / "out"))
    assert index.metadata["shardsafe.import"]["safetensors_metadata"] == {"note": "hi"}


def test_import_dcp_directory(cli, tmp_path) -> None:  # noqa: ANN001
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    state = {"model": {"w": torch.randn(4, 5), "b": torch.ones(5)}, "step": 99, "extra": {"lr": 0.5}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... single process"
        dcp.save(state, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    assert os.path.exists(tmp_path / "dcp" / ".metadata")
    proc = cli("import", tmp_path / "dcp", tmp_path / "out", "--trust-pickle")
    assert proc.returncode == 0, proc.stderr
    got = shardsafe.load(str(tmp_path / "out"))
    assert torch.equal(got["model"]["w"], state["model"]["w"]) and torch.equal(got["model"]["b"], state["model"]["b"])
    assert got["step"] == 99 and got["extra"] == {"lr": 0.5}


def test_import_dcp_with_a_missing_data_file_is_one_line(cli, tmp_path) -> None:  # noqa: ANN001
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.ones(3)}, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    for name in os.listdir(tmp_path / "dcp"):
        if name.endswith(".distcp"):
            os.remove(tmp_path / "dcp" / name)
    proc = cli("import", tmp_path / "dcp", tmp_path / "out", "--trust-pickle")
    assert proc.returncode == 1
    assert "DCP could not read the checkpoint (FileNotFoundError" in one_line_error(proc)


def test_import_errors(cli, tmp_path) -> None:  # noqa: ANN001
    proc = cli("import", tmp_path / "missing.pt", tmp_path / "out")
    assert proc.returncode == 1 and "does not exist" in one_line_error(proc)
    (tmp_path / "plain").mkdir()
    proc = cli("import", tmp_path / "plain", tmp_path / "out")
    assert proc.returncode == 1 and "not a DCP checkpoint" in one_line_error(proc)
    torch.save(torch.ones(2), tmp_path / "t.pt")
    proc = cli("import", tmp_path / "t.pt", tmp_path / "out")
    assert proc.returncode == 1 and "not a dict" in one_line_error(proc)


def test_import_safetensors_with_prefix_loads_into_a_module_in_place(cli, tmp_path) -> None:  # noqa: ANN001
    st = pytest.importorskip("safetensors.torch")
    source = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    st.save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(tmp_path / "m.safetensors"))
    proc = cli("import", tmp_path / "m.safetensors", tmp_path / "out", "--prefix", "model")
    assert proc.returncode == 0, proc.stderr
    target = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    weight = target[0].weight
    shardsafe.load(str(tmp_path / "out"), {"model": target})
    assert target[0].weight is weight  # in place
    for k, v in source.state_dict().items():
        assert torch.equal(target.state_dict()[k], v), k
    index = shardsafe.api.load.read_checkpoint_index(str(tmp_path / "out"))
    assert index.metadata["shardsafe.import"]["prefix"] == "model"
    assert sorted(shardsafe.load(str(tmp_path / "out"))) == ["model"]


def test_import_without_prefix_does_not_fit_a_module(cli, tmp_path) -> None:  # noqa: ANN001
    st = pytest.importorskip("safetensors.torch")
    st.save_file({"weight": torch.ones(2, 2)}, str(tmp_path / "m.safetensors"))
    assert cli("import", tmp_path / "m.safetensors", tmp_path / "out").returncode == 0
    with pytest.raises(shardsafe.StateMismatchError):
        shardsafe.load(str(tmp_path / "out"), {"model": torch.nn.Linear(2, 2, bias=False)})


def test_import_refuses_an_empty_prefix(cli, tmp_path) -> None:  # noqa: ANN001
    torch.save({"w": torch.ones(1)}, tmp_path / "ck.pt")
    proc = cli("import", tmp_path / "ck.pt", tmp_path / "out", "--prefix", "")
    assert "--prefix" in one_line_error(proc)


def test_import_of_dcp_needs_trust_pickle_and_reads_nothing_without_it(cli, tmp_path) -> None:  # noqa: ANN001
    import pickle

    dcp_dir = tmp_path / "dcp"
    dcp_dir.mkdir()
    marker = tmp_path / "pwned"
    (dcp_dir / ".metadata").write_bytes(pickle.dumps(Payload(str(marker))))  # a hostile .metadata
    proc = cli("import", dcp_dir, tmp_path / "out")
    line = one_line_error(proc)
    assert "--trust-pickle" in line and "pickle" in line
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["source", "dcp metadata", "dcp data file"])
def test_import_refuses_a_fifo_instead_of_hanging(cli, tmp_path, where: str) -> None:  # noqa: ANN001
    if where == "source":
        os.mkfifo(tmp_path / "ck.pt")
        src = tmp_path / "ck.pt"
    else:
        dcp = pytest.importorskip("torch.distributed.checkpoint")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save({"w": torch.ones(3)}, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
        name = ".metadata" if where == "dcp metadata" else next(
            n for n in os.listdir(tmp_path / "dcp") if n.endswith(".distcp"))
        os.remove(tmp_path / "dcp" / name)
        os.mkfifo(tmp_path / "dcp" / name)
        src = tmp_path / "dcp"
    proc = cli("import", src, tmp_path / "out", "--trust-pickle", timeout=60)
    assert "is a FIFO, not a regular file" in one_line_error(proc)
