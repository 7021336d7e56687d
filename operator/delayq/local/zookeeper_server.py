"""Start and stop a throw-away standalone ZooKeeper on a free loopback port, stopped by its PID.

Used by the pytest fixtures and `delayq dev`, so both run the same real server (Debian's
`zookeeper` package, installed by scripts/setup.sh) with the same settings. The server is
restartable on the same port and data directory: sessions and nodes survive a restart exactly as
they do in production, which is what the ZooKeeper-restart tests exercise.

Small on purpose: the JVM gets `-Xmx256m` and the serial collector because tests share two
cores with everything else; `tickTime` 500 ms lets sessions be as short as 1 s in tests while
still allowing the 10 s production default (maxSessionTimeout is raised to 60 s).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from delayq.local.ports import free_port
from delayq.local.process import stop_by_pid
from delayq.local.waiting import wait_until

START_TIMEOUT_S = 60.0  # a cold JVM on a loaded two-core machine can take a while
STOP_TIMEOUT_S = 10.0
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
JVM_OPTIONS = ("-Xmx256m", "-Xss512k", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
# Debian ships one jar whose manifest names its dependencies; an upstream tarball has lib/*.jar.
DEBIAN_JAR = "/usr/share/java/zookeeper.jar"
TARBALL_LIB_GLOBS = ("/usr/share/zookeeper/lib/*.jar", "/opt/zookeeper/lib/*.jar")
LOGGER_JAR = "/usr/share/java/slf4j-simple.jar"
# Debian's manifest omits the Netty codec that NettyServerCnxnFactory (the TLS client port,
# `secureClientPort`) needs; the plain port does not load it.
NETTY_CODEC_JAR = "/usr/share/java/netty-codec.jar"


def java_binary() -> str:
    path = shutil.which("java")
    if path is None:
        raise FileNotFoundError("java not found on PATH: run scripts/setup.sh first")
    return path


def zookeeper_classpath() -> str:
    """Classpath of the installed ZooKeeper server; FileNotFoundError says how to install it."""
    for pattern in TARBALL_LIB_GLOBS:
        jars = sorted(glob.glob(pattern))
        if any(Path(jar).name.startswith("zookeeper-") for jar in jars):
            return os.pathsep.join(jars)
    if Path(DEBIAN_JAR).exists():
        jars = [DEBIAN_JAR] + [jar for jar in (LOGGER_JAR, NETTY_CODEC_JAR) if Path(jar).exists()]
        return os.pathsep.join(jars)
    raise FileNotFoundError("ZooKeeper jars not found: run scripts/setup.sh first")


@dataclass
class ZooKeeperServer:
    """One standalone ZooKeeper process with its own data directory.

    `start()` after `stop(keep_data=True)` (or `restart()`) comes back on the same port with the
    same data, so clients reconnect to the sessions and nodes they had.
    """

    tick_time_ms: int = 500
    extra_config: dict[str, str] = field(default_factory=dict)
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    directory: Path | None = None

    @property
    def hosts(self) -> str:
        """The kazoo / zkCli connection string."""
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path | None:
        return self.directory / "zookeeper.log" if self.directory else None

    def start(self) -> ZooKeeperServer:
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="delayq-zookeeper-"))
        if self.port == 0:
            self.port = free_port()
        config = {
            "tickTime": str(self.tick_time_ms),
            "dataDir": str(self.directory / "data"),
            "clientPort": str(self.port),
            "clientPortAddress": "127.0.0.1",
            "maxClientCnxns": "200",
            "minSessionTimeout": str(2 * self.tick_time_ms),
            "maxSessionTimeout": "60000",
            "admin.enableServer": "false",
            "4lw.commands.whitelist": "ruok,srvr,mntr",
            "autopurge.purgeInterval": "0",
            # a throw-away server: no fsync per transaction (it survives a process restart,
            # which the restart tests need, but not a machine crash, which they do not)
            "forceSync": "no",
            # quotas are hard limits, as on the bundled ensemble (coordination/quota.py)
            "enforceQuota": "true",
            **self.extra_config,
        }
        config_path = self.directory / "zoo.cfg"
        config_path.write_text("".join(f"{key}={value}\n" for key, value in config.items()))
        command = [
            java_binary(),
            *JVM_OPTIONS,
            "-Dzookeeper.admin.enableServer=false",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp",
            zookeeper_classpath(),
            MAIN_CLASS,
            str(config_path),
        ]
        with open(self.directory / "zookeeper.log", "ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
            )
        wait_until(self._answers_ruok, START_TIMEOUT_S, f"ZooKeeper on port {self.port}")
        return self

    def _answers_ruok(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            log = self.log_path
            detail = log.read_text()[-4000:] if log and log.exists() else ""
            raise RuntimeError(f"ZooKeeper exited with {self.process.returncode}: {detail}")
        return four_letter_word(self.port, "ruok") == "imok"

    def stop(self, keep_data: bool = False) -> None:
        """Stop the process by PID; remove the data directory unless `keep_data`."""
        if self.process is not None:
            stop_by_pid(self.process, STOP_TIMEOUT_S)
        self.process = None
        if not keep_data and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def restart(self) -> ZooKeeperServer:
        """Stop and start again on the same port and data: an outage of the whole ensemble."""
        self.stop(keep_data=True)
        return self.start()

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def four_letter_word(port: int, word: str, timeout_s: float = 1.0) -> str:
    """Send a four-letter command (`ruok`, `srvr`, `mntr`); '' when the server does not answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.sendall(word.encode())
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""
