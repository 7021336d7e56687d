"""Processes of the e2e tier: the binaries they run, their logs, waits, and stop by PID."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from delayq.local.process import stop_by_pid
from delayq.local.waiting import wait_until

#: The checkout under test: the processes the tests start locally run its code.
REPO = Path(__file__).resolve().parents[2]


class E2EError(RuntimeError):
    """A harness step failed; the message carries the relevant log tail."""


#: How e2e waits poll: the control plane converges over seconds, and a probe that raises
#: (connection refused, a kubectl error while the API is still coming up) only means "not yet".
INTERVAL_S = 0.25
NOT_YET: tuple[type[Exception], ...] = (Exception,)


def http_ok(url: str, context: ssl.SSLContext | None = None, token: str | None = None) -> str:
    """GET ``url`` and return its body if the status is 200 (raises otherwise)."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=5, context=context) as response:
        body: str = response.read().decode()
        if response.status != 200:
            raise E2EError(f"{url}: HTTP {response.status}: {body[:200]}")
        return body or "ok"


def unverified_tls() -> ssl.SSLContext:
    """TLS context for the health ports of controller-manager and scheduler.

    They serve with a self-signed certificate they generate in memory at start-up, so there is
    nothing to verify against; only ``/healthz`` (an always-allowed path) is read through it.
    """
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


@dataclass
class ManagedProcess:
    """One server process of the control plane, with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        """The PID it is stopped by."""
        return self.popen.pid

    def exited(self) -> str | None:
        """If the process has died, say so with its log tail (for ``wait_until(abort=...)``)."""
        code = self.popen.poll()
        if code is None:
            return None
        return f"{self.name} (pid {self.pid}) exited with {code}:\n{self.tail()}"

    def tail(self, lines: int = 30) -> str:
        """The last lines of the log, which is where a failed start explains itself."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the PID, then SIGKILL it if it has not exited within ``grace`` seconds."""
        stop_by_pid(self.popen, grace)


def spawn(name: str, argv: Sequence[str], workdir: Path) -> ManagedProcess:
    """Start one server process in its own session, its output in ``workdir/logs/<name>.log``."""
    log_path = workdir / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            cwd=workdir, start_new_session=True,
        )
    return ManagedProcess(name, popen, log_path)


def await_ready(process: ManagedProcess, probe: Callable[[], Any], timeout: float) -> None:
    """Poll ``probe`` until it succeeds; a crash of the process aborts the wait with its log."""
    start = time.monotonic()
    wait_until(probe, timeout, f"{process.name} to become ready",
               interval_s=INTERVAL_S, not_yet=NOT_YET, abort=process.exited)
    print(f"e2e: {process.name} ready in {time.monotonic() - start:.1f}s (pid {process.pid})")


@dataclass
class Tools:
    """Where the binaries come from: the build cache, with kubectl/helm falling back to PATH."""

    bin_dir: Path | None

    def path(self, name: str) -> str:
        """Absolute path of a tool, preferring the pinned build over whatever is on PATH."""
        if self.bin_dir is not None and (self.bin_dir / name).exists():
            return str(self.bin_dir / name)
        found = shutil.which(name)
        if found is None:
            raise E2EError(f"{name} not found in {self.bin_dir} or on PATH (run e2e/build.sh)")
        return found
