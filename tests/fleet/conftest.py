"""A fleet of three real `delayq serve` processes on the session's redis-server and ZooKeeper.

Each process serves one `stream` topic (deliveries are XADDed to the topic's output stream) with
a 4 s ZooKeeper session timeout; they are started by `delayq.local.processes` in their own
process groups and stopped by PID (SIGTERM, then SIGKILL after a deadline). The test watches
the fleet from outside, as an operator would: owner nodes in ZooKeeper, deliveries in the
output stream (whose entry ids are Redis server milliseconds, the same clock as due times and
the kill instant). `two_broker_fleet` puts the fleet on two brokers for the tests that move or
split its slots.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest
import redis.asyncio
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from delayq.coordination.layout import TopicPaths
from delayq.coordination.routing import Routing
from delayq.local.processes import ServeProcess, stop_all
from delayq.local.redis_server import RedisServer
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue.client import AsyncQueue
from delayq.queue.model import ScheduleRequest
from delayq.queue.topic import Topic, TopicType
from delayq.service.config import ServiceConfig

NAMESPACE = "fleet"
SLOTS = 16
SESSION_TIMEOUT_S = 4.0
ACK_TIMEOUT_MS = 2000
RATE_PER_S = 200
DELAY_MS = 300


@dataclass
class Delivery:
    at_ms: int  # server ms of the XADD (the stream entry id)
    message_id: str
    attempt: int


@dataclass
class ProcessFleet:
    redis_url: str
    zookeeper: ZooKeeperServer
    topic: Topic
    log_dir: Path
    broker_urls: str = ""  # comma-separated, broker index order; empty: `redis_url` only
    processes: dict[str, ServeProcess] = field(default_factory=dict)
    deliveries: list[Delivery] = field(default_factory=list)
    scheduled: set[str] = field(default_factory=set)
    _last_entry: str = "-"
    _observer: KazooClient | None = None  # the test's own view of ZooKeeper, opened on use

    def config(self, member: str) -> ServiceConfig:
        return ServiceConfig(
            redis_url=self.redis_url,
            broker_urls=self.broker_urls,
            namespace=NAMESPACE,
            topic=self.topic.name,
            slot_amount=SLOTS,
            topic_type=TopicType.STREAM,
            ack_timeout_ms=ACK_TIMEOUT_MS,
            port=0,
            zookeeper_connect=self.zookeeper.hosts,
            zookeeper_session_timeout_ms=int(SESSION_TIMEOUT_S * 1000),
            member_id=member,
            log_level="INFO",
        )

    def start(self, member: str) -> None:
        self.processes[member] = ServeProcess(
            self.config(member), self.log_dir / f"{member}.log"
        ).start()

    @property
    def output(self) -> str:
        return self.config("any").target_stream

    def observer(self) -> KazooClient:
        """The test's own ZooKeeper session, opened on first use."""
        if self._observer is None:
            self._observer = KazooClient(hosts=self.zookeeper.hosts)
            self._observer.start(timeout=10)
        return self._observer

    def owners(self) -> dict[int, str]:
        """slot -> member holding its owner node, read from ZooKeeper right now."""
        paths = TopicPaths(NAMESPACE, self.topic.name)
        client = self.observer()
        try:
            children = client.get_children(paths.owners)
        except NoNodeError:
            return {}
        result = {}
        for child in children:
            try:
                result[int(child)] = client.get(paths.owner(int(child)))[0].decode()
            except NoNodeError:
                continue
        return result

    def close(self) -> None:
        stop_all(list(self.processes.values()))
        if self._observer is not None:
            self._observer.stop()
            self._observer.close()

    async def read_deliveries(self, client: redis.asyncio.Redis) -> None:
        """Append stream entries written since the last read."""
        while True:
            low = "-" if self._last_entry == "-" else f"({self._last_entry}"
            answer = await client.xrange(self.output, low, "+", count=5000)
            # redis-py types the answer loosely; a client without decode_responses reads bytes.
            entries = cast(list[tuple[bytes, dict[bytes, bytes]]], answer)
            if not entries:
                return
            for entry_id, fields in entries:
                self.deliveries.append(
                    Delivery(
                        int(entry_id.split(b"-")[0]),
                        fields[b"id"].decode(),
                        int(fields[b"attempt"]),
                    )
                )
            self._last_entry = entries[-1][0].decode()

    def missing(self) -> set[str]:
        return self.scheduled - {delivery.message_id for delivery in self.deliveries}

    def redeliveries(self) -> int:
        return sum(1 for delivery in self.deliveries if delivery.attempt > 1)

    def duplicates(self) -> int:
        counts = Counter(delivery.message_id for delivery in self.deliveries)
        return sum(count - 1 for count in counts.values())

    async def produce(self, queue: AsyncQueue, stop: asyncio.Event) -> None:
        """A steady stream at RATE_PER_S, each due DELAY_MS later, ids spread over all slots."""
        tick_s = 0.05
        per_tick = int(RATE_PER_S * tick_s)
        started = time.monotonic()
        ticks = 0
        while not stop.is_set():
            ids = [uuid.uuid4().hex for _ in range(per_tick)]
            await queue.schedule_many([ScheduleRequest(i, b"x", delay_ms=DELAY_MS) for i in ids])
            self.scheduled.update(ids)
            ticks += 1
            # pace by the schedule, not by sleeping a fixed amount after each batch
            await asyncio.sleep(max(0.0, started + ticks * tick_s - time.monotonic()))


FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """Remember whether the test body failed, so the fixture shows process logs only then."""
    report = yield
    if call.when == "call":
        item.stash[FAILED] = bool(getattr(report, "failed", False))
    return report


@pytest.fixture
async def process_fleet(
    request: pytest.FixtureRequest, redis_server: RedisServer, zookeeper_server: ZooKeeperServer
) -> AsyncIterator[ProcessFleet]:
    topic = Topic(
        f"f-{uuid.uuid4().hex[:10]}",
        namespace=NAMESPACE,
        slot_amount=SLOTS,
        ack_timeout_ms=ACK_TIMEOUT_MS,
    )
    with tempfile.TemporaryDirectory(prefix="delayq-fleet-") as log_dir:
        fleet = ProcessFleet(redis_server.url, zookeeper_server, topic, Path(log_dir))
        try:
            yield fleet
        finally:
            await asyncio.to_thread(fleet.close)
            for member in fleet.processes if request.node.stash.get(FAILED, True) else ():
                print(f"--- {member} log (tail) ---")
                print((Path(log_dir) / f"{member}.log").read_text()[-4000:])


@pytest.fixture
async def two_broker_fleet(
    process_fleet: ProcessFleet, second_broker: RedisServer
) -> tuple[ProcessFleet, list[str]]:
    """The fleet on two brokers, every slot routed to broker 0 (a broker just added)."""
    urls = [process_fleet.redis_url, second_broker.url]
    process_fleet.broker_urls = ",".join(urls)
    paths = TopicPaths(NAMESPACE, process_fleet.topic.name)
    process_fleet.observer().create(
        paths.routing, Routing(SLOTS, 2, (0,) * SLOTS).to_json(), makepath=True
    )
    return process_fleet, urls
