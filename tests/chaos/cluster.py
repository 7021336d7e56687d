"""The processes under test: one redis-server (AOF, fsync always), one ZooKeeper, three serves.

Every serve process reaches ZooKeeper and Redis through its own `Link`s, so one of them can be
partitioned alone; two of them run under libfaketime, +5 s and -5 s off the real clock (only
their wall clock: monotonic time stays real, as on a host whose NTP is off). A supervisor plays
the kubelet: a serve process that exits on its own (a Redis outage it does not survive) is
restarted, and the exit is recorded. Everything started here is stopped by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from delayq.coordination.layout import TopicPaths
from delayq.local.ports import free_port
from delayq.local.processes import ServeProcess
from delayq.local.redis_server import RedisServer
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue.topic import TopicType
from delayq.service.config import ServiceConfig
from tests.faketime import faketime_env

from .proxy import Link
from .receiver import SECRET

NAMESPACE = "chaos"
TOPIC = "orders"
SLOTS = 64
SESSION_TIMEOUT_MS = 4000
ACK_TIMEOUT_MS = 10_000  # past SESSION_TIMEOUT_MS + 2 s: a takeover that waits it shows
WEBHOOK_TIMEOUT_MS = 2000
BACKOFF_BASE_MS = 250
BACKOFF_MAX_MS = 2000
GRACE_MS = 3000
SKEWS_S = (0.0, 5.0, -5.0)  # member c0 real, c1 ahead, c2 behind
RESTART_BACKOFF_S = 1.0


@dataclass
class Member:
    """One serve process, its links, and what the injector is doing to it."""

    name: str
    skew_s: float
    zk_link: Link
    redis_link: Link
    serve: ServeProcess
    held_down: bool = False  # stopped on purpose: the supervisor leaves it alone
    unexpected_exits: list[tuple[float, int]] = field(default_factory=list)  # (wall ms, code)

    @property
    def url(self) -> str:
        return self.serve.url

    def signal(self, signum: signal.Signals) -> None:
        if self.serve.running():
            os.kill(self.serve.pid, signum)


@dataclass
class Cluster:
    workdir: Path
    receiver_url: str
    redis: RedisServer = field(
        default_factory=lambda: RedisServer(
            appendonly=True,
            extra_config={"appendfsync": "always", "enable-debug-command": "local"},
        )
    )
    zookeeper: ZooKeeperServer = field(default_factory=ZooKeeperServer)
    members: list[Member] = field(default_factory=list)
    observer: KazooClient | None = None
    _supervisor: asyncio.Task[None] | None = None

    @property
    def paths(self) -> TopicPaths:
        return TopicPaths(NAMESPACE, TOPIC)

    def config(self, name: str, zk_port: int, redis_port: int, http_port: int) -> ServiceConfig:
        return ServiceConfig(
            redis_url=f"redis://127.0.0.1:{redis_port}/0",
            namespace=NAMESPACE,
            topic=TOPIC,
            slot_amount=SLOTS,
            topic_type=TopicType.WEBHOOK,
            webhook_url=self.receiver_url,
            webhook_secret=SECRET,
            webhook_timeout_ms=WEBHOOK_TIMEOUT_MS,
            ack_timeout_ms=ACK_TIMEOUT_MS,
            retry_backoff_base_ms=BACKOFF_BASE_MS,
            retry_backoff_max_ms=BACKOFF_MAX_MS,
            zookeeper_connect=f"127.0.0.1:{zk_port}",
            zookeeper_session_timeout_ms=SESSION_TIMEOUT_MS,
            member_id=name,
            port=http_port,
            grace_ms=GRACE_MS,
            log_level="INFO",
        )

    async def start(self) -> None:
        await asyncio.to_thread(self.redis.start)
        await asyncio.to_thread(self.zookeeper.start)
        for index, skew in enumerate(SKEWS_S):
            name = f"c{index}"
            zk_link, redis_link = Link(self.zookeeper.port), Link(self.redis.port)
            await zk_link.start()
            await redis_link.start()
            config = self.config(name, zk_link.port, redis_link.port, free_port())
            serve = ServeProcess(config, self.workdir / f"{name}.log", extra_env=faketime_env(skew))
            self.members.append(Member(name, skew, zk_link, redis_link, serve))
        for member in self.members:
            member.serve.start()
        self.observer = KazooClient(hosts=self.zookeeper.hosts, timeout=4.0)
        await asyncio.to_thread(self.observer.start, 30)
        self._supervisor = asyncio.create_task(self._supervise())

    async def _supervise(self) -> None:
        """Restart serve processes that exited on their own (as a kubelet would)."""
        while True:
            for member in self.members:
                code = member.serve.process.poll() if member.serve.process else None
                if code is not None and not member.held_down:
                    member.unexpected_exits.append((time.time() * 1000, code))
                    await asyncio.sleep(RESTART_BACKOFF_S)
                    if not member.held_down and not member.serve.running():
                        member.serve.start()
            await asyncio.sleep(0.2)

    def owners(self) -> dict[int, str] | None:
        """slot -> member holding its owner node; None when ZooKeeper cannot be read now."""
        client = self.observer
        if client is None or not client.connected:
            return None
        try:
            children = client.get_children(self.paths.owners)
            requests = {int(c): client.get_async(self.paths.owner(int(c))) for c in children}
            result: dict[int, str] = {}
            for slot, request in requests.items():
                with contextlib.suppress(NoNodeError):
                    result[slot] = request.get(timeout=2.0)[0].decode()
            return result
        except NoNodeError:
            return {}
        except (KazooException, KazooTimeoutError):
            return None

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    async def stop(self) -> None:
        """Stop everything this cluster started, by PID, whatever state the faults left."""
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        for member in self.members:
            member.held_down = True
            member.signal(signal.SIGCONT)
            member.zk_link.restore()
            member.redis_link.restore()
        if self.zookeeper.process is not None and self.zookeeper.process.poll() is None:
            os.kill(self.zookeeper.process.pid, signal.SIGCONT)
        await asyncio.to_thread(_stop_serves, [m.serve for m in self.members])
        for member in self.members:
            await member.zk_link.close()
            await member.redis_link.close()
        if self.observer is not None:
            await asyncio.to_thread(_close_observer, self.observer)
        await asyncio.to_thread(self.zookeeper.stop)
        await asyncio.to_thread(self.redis.stop)


def _stop_serves(serves: list[ServeProcess]) -> None:
    for serve in serves:
        serve.terminate()
    for serve in serves:
        if serve.process is not None:
            serve.wait(GRACE_MS / 1000 + 10)


def _close_observer(client: KazooClient) -> None:
    client.stop()
    client.close()
