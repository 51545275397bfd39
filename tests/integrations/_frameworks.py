"""Helpers of the integration tests: a free loopback port for a gloo rendezvous."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now (for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
