"""The command line on s3:// URLs, against a real moto server through s3fs."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")

import shardsafe  # noqa: E402
from cli_helpers import one_line_error, save_step  # noqa: E402


def test_ls_info_verify_on_s3(cli, s3) -> None:  # noqa: ANN001
    run, opts = s3.url + "/run", s3.storage_options
    for step in (1, 2):
        save_step(run, step, storage_options=opts)
    fs = s3.filesystem()
    # a save that died after uploading data: a prefix with data but no index
    fs.pipe_file(f"{s3.bucket}/run/step_00000003/data-r00000-000.safetensors", b"\0" * 10)
    o = ["--storage-options", s3.options_json()]

    records = json.loads(cli("ls", run, "--json", *o).stdout)
    assert [(r["name"], r["state"], r["step"]) for r in records] == [
        ("step_00000001", "committed", 1), ("step_00000002", "committed", 2),
        ("step_00000003", "partial", 3)]
    assert records[1]["metrics"] == {"loss": 0.5}

    # the AWS_* environment variables work instead of --storage-options
    by_env = json.loads(cli("ls", run, "--json", env=s3.env).stdout)
    assert [r["name"] for r in by_env] == [r["name"] for r in records]

    info = json.loads(cli("info", run + "/step_00000002", "--json", *o).stdout)
    assert {leaf["path"]: leaf["shape"] for leaf in info["leaves"] if leaf["type"] == "tensor"} == {
        "model.layer.weight": [8, 4], "model.layer.bias": [4], "table": [2, 3]}

    ok = cli("verify", run, *o)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    data = f"{s3.bucket}/run/step_00000001/data-r00000-000.safetensors"
    blob = bytearray(fs.cat_file(data))
    blob[-1] ^= 0xFF  # last byte: inside the last tensor of the file
    fs.pipe_file(data, bytes(blob))
    bad = cli("verify", run, *o)
    assert bad.returncode == 1
    assert "BAD step_00000001: file='data-r00000-000.safetensors' key=" in bad.stdout
    assert "step_00000002: 3 tensors" in bad.stdout


def test_export_and_diff_from_s3(cli, s3, tmp_path) -> None:  # noqa: ANN001
    run, opts = s3.url + "/run", s3.storage_options
    a = save_step(run, 1, storage_options=opts)
    b = save_step(run, 2, storage_options=opts)
    o = ["--storage-options", s3.options_json()]
    proc = cli("export", b, tmp_path / "m.pt", "--only", "model", *o)
    assert proc.returncode == 0, proc.stderr
    got = torch.load(str(tmp_path / "m.pt"), weights_only=True)
    want = shardsafe.load(b, storage_options=opts)["model"]
    assert torch.equal(got["layer.weight"], want["layer.weight"])
    diff = cli("diff", a, b, *o)
    assert diff.returncode == 1 and "~ optim.step  int 1 -> int 2" in diff.stdout


def test_import_into_s3_and_missing_prefix(cli, s3, tmp_path) -> None:  # noqa: ANN001
    torch.save({"w": torch.arange(4.0)}, tmp_path / "w.pt")
    o = ["--storage-options", s3.options_json()]
    proc = cli("import", tmp_path / "w.pt", s3.url + "/imported", *o)
    assert proc.returncode == 0, proc.stderr
    assert torch.equal(shardsafe.load(s3.url + "/imported", storage_options=s3.storage_options)["w"],
                       torch.arange(4.0))
    missing = cli("info", s3.url + "/nothing", *o)
    assert missing.returncode == 3 and f"'{s3.url}/nothing' does not exist" in one_line_error(missing)
    no_credentials = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_SESSION_TOKEN": None,
                      "AWS_PROFILE": None, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                      "AWS_CONFIG_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true"}
    denied = cli("ls", s3.url, "--storage-options", json.dumps({"endpoint_url": s3.endpoint}),
                 env=no_credentials)
    assert denied.returncode == 1 and "NoCredentialsError" in one_line_error(denied)


def test_gc_on_s3_removes_expired_steps_partial_prefixes_and_unfinished_uploads(cli, s3) -> None:  # noqa: ANN001
    run, opts = s3.url + "/run", s3.storage_options
    for step in (1, 2, 3):
        save_step(run, step, storage_options=opts)
    fs = s3.filesystem()
    fs.pipe_file(f"{s3.bucket}/run/step_00000004/data-r00000-000.safetensors", b"\0" * 10)
    o = ["--storage-options", s3.options_json()]
    kept = cli("gc", run, "--max-to-keep", "2", *o)  # default --min-age: fresh leftovers stay
    assert kept.stdout.splitlines() == ["deleted step_00000001 (step 1)"]
    # what a SIGKILL mid-upload leaves: an unfinished multipart upload (see tests/storage).
    # Created only now because moto reports a fixed 2010 start time for every upload.
    mpu = fs.call_s3("create_multipart_upload", Bucket=s3.bucket, Key="run/step_00000005/data-r00000-000.safetensors")
    proc = cli("gc", run, "--max-to-keep", "2", "--min-age", "0", *o)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "deleted leftover step_00000004" and len(lines) == 2
    assert lines[1].startswith("deleted unfinished upload " + f"{s3.bucket}/run/step_00000005/"
                               f"data-r00000-000.safetensors (upload id {mpu['UploadId']}, started ")
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{s3.bucket}/run")) == ["step_00000002", "step_00000003"]
    assert [u["UploadId"] for u in fs.list_multipart_uploads(s3.bucket)] == []
    assert mpu["UploadId"]


def test_gc_on_s3_aborts_only_the_uploads_shardsafe_started(cli, s3) -> None:  # noqa: ANN001
    run, opts = s3.url + "/run", s3.storage_options
    save_step(run, 1, storage_options=opts)
    fs = s3.filesystem()

    def start(key: str) -> str:
        return fs.call_s3("create_multipart_upload", Bucket=s3.bucket, Key=key)["UploadId"]

    ours = start("run/step_00000002/data-r00000-000.safetensors")  # a save killed mid-upload
    foreign = {"run/tensorboard/events.out": start("run/tensorboard/events.out"),
               "run/notes/step_00000003/data-r00000-000.safetensors":  # a shardsafe name, too deep
                   start("run/notes/step_00000003/data-r00000-000.safetensors"),
               "other-app/dataset.tar": start("other-app/dataset.tar")}
    o = ["--storage-options", s3.options_json()]

    def open_uploads() -> set[str]:
        return {u["UploadId"] for u in fs.list_multipart_uploads(s3.bucket)}

    left = (f"left 2 unfinished upload(s) not written by shardsafe: {s3.bucket}/run/notes/step_00000003/"
            f"data-r00000-000.safetensors, {s3.bucket}/run/tensorboard/events.out")
    dry = cli("gc", run, "--min-age", "0", "--dry-run", *o)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[-1] == left
    assert open_uploads() == {ours, *foreign.values()}

    # moto dates every upload 2010: an age limit beyond that keeps shardsafe's upload
    young = json.loads(cli("gc", run, "--min-age", "1e10", "--dry-run", "--json", *o).stdout)
    assert young["uploads_aborted"] == [] and [u["upload_id"] for u in young["uploads_kept"]] == [ours]
    assert "younger than --min-age (1e+10 s)" in young["uploads_kept"][0]["reason"]
    assert sorted((u["key"], u["upload_id"]) for u in young["uploads_left"]) == sorted(
        (f"{s3.bucket}/{k}", i) for k, i in foreign.items() if k.startswith("run/"))

    proc = cli("gc", run, "--min-age", "0", *o)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith(
        f"deleted unfinished upload {s3.bucket}/run/step_00000002/data-r00000-000.safetensors "
        f"(upload id {ours}")
    assert lines[1] == left
    assert open_uploads() == set(foreign.values())
    again = json.loads(cli("gc", run, "--min-age", "0", "--json", *o).stdout)
    assert again["uploads_aborted"] == [] and len(again["uploads_left"]) == 2

    # at the bucket root, run/... lies a level too deep to be a checkpoint of this directory
    root = cli("gc", s3.url, "--min-age", "0", *o)
    assert root.returncode == 0, root.stderr
    assert root.stdout.splitlines() == [
        "nothing to remove",
        "left 3 unfinished upload(s) not written by shardsafe: " + ", ".join(
            f"{s3.bucket}/{k}" for k in sorted(foreign))]
    assert open_uploads() == set(foreign.values())
    assert shardsafe.load(run + "/step_00000001", storage_options=opts)["optim"]["step"] == 1
