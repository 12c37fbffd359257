"""``free_loopback_port``: a port a local job can bind later, never one from the range the
kernel hands to outgoing connections (which a gloo group opens by the dozen)."""

from __future__ import annotations

import socket

from shardsafe.comm import free_loopback_port

RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def test_ports_are_free_and_below_the_ephemeral_range() -> None:
    with open(RANGE) as f:
        low = int(f.read().split()[0])
    ports = {free_loopback_port() for _ in range(20)}
    assert all(low // 2 <= p < low for p in ports), (low, sorted(ports))
    assert len(ports) > 1  # drawn at random, not one fixed port
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))

