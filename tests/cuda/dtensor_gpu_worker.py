"""One rank on one GPU (``test_cuda_integrations``): DTensors on a 1-GPU device mesh are
saved with ``save`` and ``async_save`` and loaded back, in place into DTensors on the GPU
and as plain global tensors. Run as ``python dtensor_gpu_worker.py OUT BACKEND`` with the
environment torchrun gives a rank; prints ``ok`` at the end."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import shardsafe


def main(out: str, backend: str) -> None:
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    try:
        mesh = init_device_mesh("cuda", (1,))
        g = torch.Generator(device="cuda").manual_seed(0)
        full = torch.randn(64, 48, generator=g, device="cuda")
        placements = {"rows": [Shard(0)], "cols": [Shard(1)], "replicated": [Replicate()]}
        values = {"rows": full, "cols": full.to(torch.bfloat16), "replicated": full[:8].clone()}
        state = {k: distribute_tensor(values[k], mesh, placements[k]) for k in placements}
        state["step"] = 5
        shardsafe.save(state, os.path.join(out, "sync"))
        shardsafe.async_save(state, os.path.join(out, "async")).result()
        for name in ("sync", "async"):
            path = os.path.join(out, name)
            plain = shardsafe.load(path)
            for k, v in values.items():
                assert type(plain[k]) is torch.Tensor and plain[k].device.type == "cpu", (name, k)
                assert torch.equal(plain[k], v.cpu()), (name, k)
            target = {k: distribute_tensor(torch.zeros_like(v), mesh, placements[k]) for k, v in values.items()}
            target["step"] = 0
            shardsafe.load(path, target)
            for k, v in values.items():
                assert isinstance(target[k], DTensor) and target[k].device.type == "cuda", (name, k)
                assert torch.equal(target[k].full_tensor(), v), (name, k)
            assert target["step"] == 5
    finally:
        dist.destroy_process_group()
    print("ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
