"""Talking to the other ranks: the only package that touches torch.distributed (and
JAX's coordination service).

``get_comm()`` picks the implementation: ``TorchComm`` over a process group when
torch.distributed is initialised with more than one rank (or a group is passed);
``JaxComm`` over JAX's coordination service when a multi-process ``jax.distributed``
job is initialised and torch.distributed is not; ``SingleProcessComm`` otherwise, so
world size 1 needs no process group at all.
"""

from __future__ import annotations

import random
import socket
import sys
from typing import Any

from .base import Comm, ExternalRank, SingleProcessComm, next_namespace
from .channel import Channel, LocalChannel
from .jax_comm import JaxComm, jax_distributed_active


def _torch_active() -> bool:
    """An initialised torch.distributed group of more than one rank."""
    if "torch" not in sys.modules:  # torch.distributed cannot be initialised without torch
        return False
    try:
        import torch.distributed as dist
    except ImportError:  # numpy-only install
        return False
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def distributed_active(process_group: Any = None) -> bool:
    """True when saves and loads must be collective: an initialised torch.distributed group
    of > 1 rank, or a multi-process ``jax.distributed`` job."""
    if process_group is not None:
        return True
    return _torch_active() or jax_distributed_active()


def get_comm(process_group: Any = None) -> Comm:
    """The Comm for ``process_group``: the default torch.distributed group when None, else the
    ``jax.distributed`` job, else a single process."""
    if process_group is None and not _torch_active():
        return JaxComm() if jax_distributed_active() else SingleProcessComm()
    from .torch_comm import TorchComm  # imports torch.distributed only when it is in use

    return TorchComm(process_group)


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 right now, for a local job's ``MASTER_PORT``.

    Taken below the kernel's ephemeral port range where that range can be read: a port
    from it may be handed to an outgoing connection (a gloo group opens many) between now
    and the moment the job binds it, which fails the job with "address already in use".
    """
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(100 if low > 2048 else 0):
        port = rng.randrange(low // 2, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (0 where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


__all__ = ["Channel", "Comm", "ExternalRank", "JaxComm", "LocalChannel", "SingleProcessComm",
           "distributed_active", "free_loopback_port", "get_comm", "jax_distributed_active", "next_namespace"]
