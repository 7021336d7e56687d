"""Start and stop a throw-away `redis-server` on a free loopback port, stopped by its PID.

Used by the pytest fixtures, the benchmarks and `delayq dev`, so every one of them runs the same
real server with the same settings.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import redis

from delayq.local.ports import free_port
from delayq.local.process import stop_by_pid
from delayq.local.waiting import wait_until

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0


def redis_server_binary() -> str:
    """Path of redis-server; the setup script installs it from Debian when missing."""
    path = shutil.which("redis-server")
    if path is None:
        raise FileNotFoundError("redis-server not found on PATH: run scripts/setup.sh first")
    return path


@dataclass
class RedisServer:
    """One redis-server process with its own data directory.

    `hz 100` makes server-side timers (blocking-call timeouts, active expiry) ten times finer
    than the default; delayq's wake-up does not rely on them but keeps them tight anyway.
    """

    appendonly: bool = False
    extra_config: dict[str, str] = field(default_factory=dict)
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    directory: Path | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start the server; after `crash()` it starts again on the same port and data."""
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="delayq-redis-"))
            self.port = free_port()
        config = {
            "bind": "127.0.0.1",
            "port": str(self.port),
            "dir": str(self.directory),
            "save": '""',
            "appendonly": "yes" if self.appendonly else "no",
            "hz": "100",
            "protected-mode": "yes",
            "daemonize": "no",
            "logfile": str(self.directory / "redis.log"),
            **self.extra_config,
        }
        config_path = self.directory / "redis.conf"
        config_path.write_text("".join(f"{key} {value}\n" for key, value in config.items()))
        self.process = subprocess.Popen(
            [redis_server_binary(), str(config_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_until(self._answers_ping, START_TIMEOUT_S, f"redis-server on port {self.port}")
        return self

    def _answers_ping(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            log = (self.directory / "redis.log") if self.directory else None
            detail = log.read_text() if log and log.exists() else ""
            raise RuntimeError(f"redis-server exited with {self.process.returncode}: {detail}")
        try:
            password = self.extra_config.get("requirepass")
            client = redis.Redis(port=self.port, password=password, socket_timeout=0.5)
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    def crash(self) -> None:
        """kill -9, keeping the data directory (for crash-recovery tests)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None:
            stop_by_pid(self.process, STOP_TIMEOUT_S)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
