"""JAX on 8 emulated CPU devices, shared by every test here (JAX starts once per process).

``XLA_FLAGS`` must be set before JAX creates its CPU client, so it is set when this file
is collected, before any test imports JAX.
"""

from __future__ import annotations

import os

import pytest

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
jax = pytest.importorskip("jax")


@pytest.fixture(scope="session")
def mesh42():
    """The 4x2 mesh ``("dp", "tp")`` of the 8 devices."""
    if len(jax.devices()) < 8:
        pytest.fail(f"JAX started with {len(jax.devices())} devices before XLA_FLAGS was set")
    return jax.make_mesh((4, 2), ("dp", "tp"))
