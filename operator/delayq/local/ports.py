"""Free loopback ports and condition waits shared by every local server launcher."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


def free_port() -> int:
    """Ask the kernel for a free loopback port (a tiny race remains; launchers retry on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll `condition` until it holds; raise TimeoutError naming `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.1f}s waiting for {what}")
        time.sleep(0.01)
