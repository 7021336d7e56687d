"""A throw-away MinIO server on a free loopback port: the real S3-compatible store of the s3a://
backup tests, built into ~/.cache/delayq-tools by scripts/install-minio.sh on first use (never
skipped), stopped by its PID."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from delayq.local.ports import free_port
from delayq.local.process import stop_by_pid
from delayq.local.waiting import wait_until
from tests.tool_support import installed

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0




@dataclass
class MinioServer:
    """One `minio server` with its own data directory; the root user is the test's credential."""

    access_key: str = "delayq-test"
    secret_key: str = field(default_factory=lambda: os.urandom(12).hex())
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    directory: Path | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> list[str]:
        return ["--address", f"127.0.0.1:{self.port}"]

    def start(self) -> MinioServer:
        self.directory = Path(tempfile.mkdtemp(prefix="delayq-minio-"))
        self.port = free_port()
        env = {
            **os.environ,
            "MINIO_ROOT_USER": self.access_key,
            "MINIO_ROOT_PASSWORD": self.secret_key,
            "MINIO_BROWSER": "off",  # no console: one port, on loopback
        }
        log = (self.directory / "minio.log").open("wb")
        self.process = subprocess.Popen(
            [installed("install-minio"), "server", str(self.directory / "data"), "--quiet",
             *self.address],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        wait_until(self._live, START_TIMEOUT_S, f"minio on port {self.port}")
        return self

    def _live(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            detail = (self.directory / "minio.log").read_text() if self.directory else ""
            raise RuntimeError(f"minio exited with {self.process.returncode}: {detail}")
        try:
            with urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=1) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def filesystem(self, access_key: str | None = None, secret_key: str | None = None) -> Any:
        """A pyarrow S3 client of the server (an S3 client other than Spark's S3A)."""
        from pyarrow import fs

        return fs.S3FileSystem(
            access_key=access_key or self.access_key,
            secret_key=secret_key or self.secret_key,
            endpoint_override=f"127.0.0.1:{self.port}",
            scheme="http",
            region="us-east-1",
            allow_bucket_creation=True,
        )

    def stop(self) -> None:
        if self.process is not None:
            stop_by_pid(self.process, STOP_TIMEOUT_S)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self) -> MinioServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
