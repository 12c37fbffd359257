"""shardsafe.values.dtensor: ``import shardsafe`` does not import ``torch.distributed.tensor``
(about a second of every process start, the CLI's included), and DTensors are still
recognised and placed once their module is imported (a one-rank gloo group in a child)."""

from __future__ import annotations

import subprocess
import sys

_CHILD = """
import os, sys, tempfile
import torch, torch.distributed as dist
import shardsafe
from shardsafe import values
from shardsafe.values import dtensor
assert "torch.distributed.tensor" not in sys.modules, "import shardsafe imported torch.distributed.tensor"
assert not dtensor.is_dtensor(torch.zeros(2))

from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.device_mesh import init_device_mesh
dist.init_process_group("gloo", init_method="file://" + os.path.join(tempfile.mkdtemp(), "store"),
                        rank=0, world_size=1)
x = distribute_tensor(torch.arange(6.0).reshape(3, 2), init_device_mesh("cpu", (1,)), [Shard(0)])
assert dtensor.is_dtensor(x) and not dtensor.is_dtensor(torch.zeros(2))
box = dtensor.local_shard(x, "w")
assert (box.offsets, box.shape, box.global_shape, box.holders) == ((0, 0), (3, 2), (3, 2), (0,)), box
adapter = values.adapter_for(x)
assert adapter.name == "dtensor" and values.adapter_for(torch.zeros(2)).name == "torch"
row = adapter.describe(x, ("w",))
assert row == ("torch", "float32", (3, 2), 24, None), row  # the global tensor; never an alias
local, offsets, shape = values.target_region(x)
assert local.data_ptr() == x.to_local().data_ptr() and (offsets, shape) == ((0, 0), (3, 2))
dist.destroy_process_group()
print("ok")
"""


def test_dtensor_module_is_imported_only_by_whoever_makes_dtensors(subprocess_env) -> None:  # noqa: ANN001
    out = subprocess.run([sys.executable, "-c", _CHILD], env=subprocess_env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
