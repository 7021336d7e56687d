"""The processes under test: two brokers (redis-server, AOF, fsync always; the topic's slots
spread over both by the first routing, so a move has somewhere to go), one ZooKeeper, three
serves.

Every serve process reaches ZooKeeper and Redis through its own `Link`s, so one of them can be
partitioned alone; two of them run with their wall clock +5 s and -5 s off the real one
(`tests.faketime.skewed_clock_env`: monotonic time stays real, as on a host whose NTP is off).
A supervisor plays the kubelet: a serve process that exits on its own (a Redis outage it does
not survive) is restarted, and the exit is recorded. Everything started here is stopped by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from delayq.coordination.layout import TopicPaths
from delayq.coordination.routing import Routing, initial_routing
from delayq.local.ports import free_port
from delayq.local.processes import ServeProcess
from delayq.local.redis_server import RedisServer
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue.topic import TopicType
from delayq.service.config import ServiceConfig
from tests.faketime import skewed_clock_env

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
    redis_links: tuple[Link, ...]  # one per broker, by broker index
    serve: ServeProcess
    held_down: bool = False  # stopped on purpose: the supervisor leaves it alone
    unexpected_exits: list[tuple[float, int]] = field(default_factory=list)  # (wall ms, code)

    @property
    def url(self) -> str:
        return self.serve.url

    def signal(self, signum: signal.Signals) -> None:
        if self.serve.running():
            os.kill(self.serve.pid, signum)


def _broker() -> RedisServer:
    return RedisServer(
        appendonly=True, extra_config={"appendfsync": "always", "enable-debug-command": "local"}
    )


@dataclass
class Cluster:
    workdir: Path
    receiver_url: str
    redis: RedisServer = field(default_factory=_broker)  # broker 0, the Redis faults' target
    broker1: RedisServer = field(default_factory=_broker)  # the moves' other broker
    zookeeper: ZooKeeperServer = field(default_factory=ZooKeeperServer)
    members: list[Member] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)  # ServiceConfig fields to override
    topic_type: TopicType = TopicType.WEBHOOK  # PULL: leased by the pull consumers (puller.py)
    observer: KazooClient | None = None
    _supervisor: asyncio.Task[None] | None = None

    @property
    def paths(self) -> TopicPaths:
        return TopicPaths(NAMESPACE, TOPIC)

    @property
    def brokers(self) -> list[RedisServer]:
        return [self.redis, self.broker1]

    def config(
        self, name: str, zk_port: int, redis_ports: list[int], http_port: int
    ) -> ServiceConfig:
        urls = [f"redis://127.0.0.1:{port}/0" for port in redis_ports]
        config = ServiceConfig(
            redis_url=urls[0],
            broker_urls=",".join(urls),
            namespace=NAMESPACE,
            topic=TOPIC,
            slot_amount=SLOTS,
            topic_type=self.topic_type,
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
        return dataclasses.replace(config, **self.settings)

    async def start(self) -> None:
        for broker in self.brokers:
            await asyncio.to_thread(broker.start)
        await asyncio.to_thread(self.zookeeper.start)
        # Every link listens before any HTTP port is picked: a link binds a port the kernel
        # chooses, which may be one picked for a serve and not bound yet (c1's once was taken by
        # c2's ZooKeeper link: c1 never became ready).
        links: list[tuple[Link, list[Link]]] = []
        for _ in SKEWS_S:
            zk_link = Link(self.zookeeper.port)
            redis_links = [Link(broker.port) for broker in self.brokers]
            for link in (zk_link, *redis_links):
                await link.start()
            links.append((zk_link, redis_links))
        for index, (skew, (zk_link, redis_links)) in enumerate(zip(SKEWS_S, links, strict=True)):
            name = f"c{index}"
            ports = [link.port for link in redis_links]
            config = self.config(name, zk_link.port, ports, free_port())
            log_path = self.workdir / f"{name}.log"
            serve = ServeProcess(config, log_path, extra_env=skewed_clock_env(skew))
            self.members.append(Member(name, skew, zk_link, tuple(redis_links), serve))
        self.observer = KazooClient(hosts=self.zookeeper.hosts, timeout=4.0)
        await asyncio.to_thread(self.observer.start, 30)
        first = initial_routing(SLOTS, len(self.brokers)).to_json()  # what a fleet would use
        await asyncio.to_thread(self.observer.create, self.paths.routing, first, makepath=True)
        for member in self.members:
            member.serve.start()
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

    def routing(self) -> Routing | None:
        """The topic's routing node (None: not written yet or ZooKeeper unreadable now): its
        slot amount doubles with a doubling."""
        client = self.observer
        if client is None or not client.connected:
            return None
        try:
            return Routing.from_json(client.get(self.paths.routing)[0])
        except (NoNodeError, KazooException, KazooTimeoutError):
            return None

    def slot_amount(self) -> int:
        routing = self.routing()
        return SLOTS if routing is None else routing.slot_amount

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
            for link in (member.zk_link, *member.redis_links):
                link.restore()
        if self.zookeeper.process is not None and self.zookeeper.process.poll() is None:
            os.kill(self.zookeeper.process.pid, signal.SIGCONT)
        await asyncio.to_thread(_stop_serves, [m.serve for m in self.members])
        for member in self.members:
            for link in (member.zk_link, *member.redis_links):
                await link.close()
        if self.observer is not None:
            await asyncio.to_thread(_close_observer, self.observer)
        await asyncio.to_thread(self.zookeeper.stop)
        for broker in self.brokers:
            await asyncio.to_thread(broker.stop)


def _stop_serves(serves: list[ServeProcess]) -> None:
    for serve in serves:
        serve.terminate()
    for serve in serves:
        if serve.process is not None:
            serve.wait(GRACE_MS / 1000 + 10)


def _close_observer(client: KazooClient) -> None:
    client.stop()
    client.close()
