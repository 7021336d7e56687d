"""Stopping a server process we started, by its PID (shared by every local launcher)."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_by_pid(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM, wait up to `timeout_s`, then SIGKILL: never leaves the process behind."""
    if process.poll() is not None:
        return
    os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
