"""engine.commit.names: which keys under a directory of checkpoints shardsafe writes."""

from __future__ import annotations

import pytest

from shardsafe.engine.commit import TMP_MARKER, plan_transaction
from shardsafe.engine.commit.detach import own_name
from shardsafe.engine.commit.names import entries_file_name, is_own_file_name, written_by_shardsafe
from shardsafe.format import INDEX_NAME
from shardsafe.plan.layout import block_file_name, data_file_name
from shardsafe.storage import LocalStorage

OURS = [
    "step_00000005/index.json",
    "step_00000005/data-r00000-000.safetensors",
    "step_00000005/data-r16383-012.blocks",
    "my-checkpoint/data-r00003-000.safetensors",
    "epoch=3-step=100/index.json",  # a checkpoint may have any name
    ".step_00000007.shardsafe-tmp-0123456789abcdef/data-r00000-000.safetensors",
    "step_00000009/ref00002-data-r00000-000.safetensors",  # cp carrying a reference
    "step_00000009/ref00002.blocks",
    "step_00000009/ref00002.3",
    "step_00000004/.data-r00000-000.safetensors" + TMP_MARKER + "0123456789abcdef",  # cp --all sibling
    ".step_00000007.shardsafe-tmp-0123456789abcdef/entries-r3",  # a rank's large chunk entries
]

NOT_OURS = [
    "tensorboard/events.out",
    "events.out.tfevents.1700000000",
    "index.json",  # too shallow: a checkpoint's files lie one level down
    "data-r00000-000.safetensors",
    "notes/step_100/data-r00000-000.safetensors",  # too deep
    "runs/a/step_00000005/index.json",
    "step_00000005/index.json.bak",  # look-alikes
    "step_00000005/index.json/x",
    "step_00000005/old-index.json",
    "step_00000005/data-r00000-000.safetensors.bak",
    "step_00000005/data-r0-0.pt",
    "step_00000005/data-rx-000.safetensors",
    "step_00000005/model.safetensors",
    "step_00000005/ref00002-notes.txt",
    "step_00000005/ref2-data-r00000-000.safetensors",
    "step_00000005/entries-r03",
    "step_00000005/entries-rx",
    "step_00000005/.index.json" + TMP_MARKER + "0123456789abcdef",
    "step_00000005/.notes.txt" + TMP_MARKER + "0123456789abcdef",
    "step_00000005/",
    "/index.json",
    "./index.json",
    "../index.json",
    "",
    "other-app/dataset.tar",
]


@pytest.mark.parametrize("key", OURS)
def test_names_shardsafe_writes(key: str) -> None:
    assert written_by_shardsafe(key)


@pytest.mark.parametrize("key", NOT_OURS)
def test_names_of_others(key: str) -> None:
    assert not written_by_shardsafe(key)


def test_the_writers_own_names_pass(tmp_path) -> None:  # noqa: ANN001
    """The names the writers themselves produce, not copies of them: a renamed file fails here."""
    txn = plan_transaction(LocalStorage(), str(tmp_path / "step_00000003"), overwrite=False)
    workdir = txn.workdir.rsplit("/", 1)[-1]
    files = [INDEX_NAME, data_file_name(0), data_file_name(12, 3), block_file_name(7, 1),
             own_name(4, data_file_name(0), set()), own_name(4, block_file_name(0), {f"ref00004-{block_file_name(0)}"}),
             own_name(4, data_file_name(0), {f"ref00004-{data_file_name(0)}", "ref00004.safetensors"}),
             entries_file_name(0), entries_file_name(4095)]
    for f in files:
        assert is_own_file_name(f), f
        assert written_by_shardsafe(f"step_00000003/{f}") and written_by_shardsafe(f"{workdir}/{f}"), f
