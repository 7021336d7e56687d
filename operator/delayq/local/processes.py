"""Start `delayq serve` processes and stop them by PID (used by `delayq dev` and the benchmark).

Each process gets its settings through DELAYQ_* variables (the same path the Kubernetes chart
uses) and its own log file; stopping sends SIGTERM to that PID only and waits for the graceful
exit, escalating to SIGKILL after a bound.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

from delayq.service.config import ServiceConfig, env_name

STOP_TIMEOUT_S = 30.0


def config_env(config: ServiceConfig) -> dict[str, str]:
    """The DELAYQ_* variables that reproduce `config` (pure)."""
    return {env_name(f.name): str(getattr(config, f.name)) for f in fields(config)}


@dataclass
class ServeProcess:
    config: ServiceConfig
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    # on top of the config's variables: e.g. libfaketime's, for a process with a skewed clock
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> ServeProcess:
        env = {**os.environ, **config_env(self.config), **self.extra_env}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "delayq.cli", "serve"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in a terminal reaches the parent only
            )
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def terminate(self) -> None:
        if self.running():
            os.kill(self.pid, signal.SIGTERM)

    def wait(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Exit code after a graceful stop; SIGKILL (code -9) when it overran `timeout_s`."""
        assert self.process is not None
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            return self.process.wait()

    def kill(self) -> None:
        """kill -9: no graceful anything (failover tests and benchmarks)."""
        if self.running():
            os.kill(self.pid, signal.SIGKILL)
            self.wait()


def stop_all(processes: list[ServeProcess]) -> list[int]:
    """SIGTERM every process first (they drain in parallel), then collect the exit codes."""
    for process in processes:
        process.terminate()
    return [process.wait() for process in processes if process.process is not None]
