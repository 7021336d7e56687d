"""Free loopback ports shared by every local server launcher."""

from __future__ import annotations

import socket


def free_port() -> int:
    """Ask the kernel for a free loopback port (a tiny race remains; launchers retry on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
