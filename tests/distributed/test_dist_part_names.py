"""The FSDP checkpoint of the shared cluster run, read with safetensors alone (no index)."""

from __future__ import annotations

import json
import os

from safetensors import safe_open

from shardsafe.api.load import read_checkpoint_index
from shardsafe.format.tree import render_path
from shardsafe.plan.layout import PARTS_KEY, part_name


def test_every_shard_is_named_as_a_part_with_its_global_shape(cluster) -> None:  # noqa: ANN001
    out, results = cluster
    assert results[("save", 4)]
    ckpt = os.path.join(out, "fsdp")
    index = read_checkpoint_index(ckpt)
    expected: dict[str, dict[str, dict]] = {f.name: {} for f in index.files}
    for t in index.tensors:
        for c in t.chunks:
            if c.shape != t.shape:
                expected[c.file][part_name(render_path(t.key), c.offsets, c.shape)] = {
                    "tensor": render_path(t.key), "offsets": list(c.offsets), "shape": list(c.shape),
                    "global_shape": list(t.shape)}
    assert sum(len(v) for v in expected.values()) >= 4  # the run really sharded tensors
    for f in index.files:
        with safe_open(os.path.join(ckpt, f.name), framework="pt") as st:
            parts = json.loads((st.metadata() or {}).get(PARTS_KEY, "{}"))
            assert parts == expected[f.name], f.name
            for name, p in parts.items():
                assert list(st.get_slice(name).get_shape()) == p["shape"]
            whole = [k for k in st.keys() if k not in parts]
            shapes = {render_path(t.key): list(t.shape) for t in index.tensors}
            for k in whole:  # a name without /part[...] is the complete tensor
                assert list(st.get_slice(k).get_shape()) == shapes[k.split("#")[0]] or \
                    st.get_slice(k).get_dtype() == "U8", k
