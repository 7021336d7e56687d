"""In-process fleets of `ZkOwnership` members on the session's real ZooKeeper, and topics on two
real redis-servers for the tests that move or split their slots (brokers.py, splits.py).

Every member has its own KazooClient (its own session), exactly like separate processes; they
share the test's event loop, so the `Timeline` sees every `on_change` in one total order and can
check the handoff rule exactly: no slot is ever in two members' consumed sets at once.
"""

from __future__ import annotations

import contextlib
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace

import pytest
from kazoo.client import KazooClient

from delayq.coordination.zookeeper import ZkOwnership, ZkSettings
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue import Queue

from .brokers import two_brokers
from .splits import NAMESPACE, ROUTING, Cluster

SLOTS = 16
TEST_SESSION_TIMEOUT_S = 4.0


@dataclass
class Timeline:
    """Every on_change of every member, and each moment two members shared a slot."""

    events: list[tuple[float, str, frozenset[int]]] = field(default_factory=list)
    consumed: dict[str, frozenset[int]] = field(default_factory=dict)
    overlaps: list[tuple[float, str, str, frozenset[int]]] = field(default_factory=list)

    def record(self, member: str, slots: frozenset[int]) -> None:
        now = time.monotonic()
        self.events.append((now, member, slots))
        self.consumed[member] = slots
        for other, other_slots in self.consumed.items():
            if other != member and slots & other_slots:
                self.overlaps.append((now, member, other, slots & other_slots))

    def last_empty(self, member: str) -> float | None:
        times = [t for t, m, slots in self.events if m == member and not slots]
        return times[-1] if times else None

    def first_taken(self, slots: frozenset[int], by_other_than: str, after: float) -> float:
        """When another member first consumed one of `slots` after `after` (inf: never)."""
        times = [
            t for t, m, owned in self.events
            if t > after and m != by_other_than and owned & slots
        ]  # fmt: skip
        return min(times, default=float("inf"))


@dataclass
class Fleet:
    hosts: str
    topic: str
    timeline: Timeline = field(default_factory=Timeline)
    members: dict[str, ZkOwnership] = field(default_factory=dict)
    session_timeout_s: float = TEST_SESSION_TIMEOUT_S

    async def join(
        self, member_id: str, broker: str = "", hosts: str = "", slot_amount: int = SLOTS
    ) -> ZkOwnership:
        settings = ZkSettings(
            hosts=hosts or self.hosts,
            namespace="tests",
            topic=self.topic,
            slot_amount=slot_amount,
            member_id=member_id,
            preferred_broker=broker,
            session_timeout_s=self.session_timeout_s,
        )
        member = ZkOwnership(settings)

        async def on_change(slots: frozenset[int]) -> None:
            self.timeline.record(member_id, slots)

        await member.start(on_change)
        self.members[member_id] = member
        return member

    async def leave(self, member_id: str) -> None:
        await self.members.pop(member_id).stop()

    def owned(self) -> dict[str, frozenset[int]]:
        return {member_id: member.owned for member_id, member in self.members.items()}

    def settled(self) -> bool:
        """Every member ready, and together they consume every slot exactly once."""
        owned = list(self.owned().values())
        return (
            all(member.ready for member in self.members.values())
            and sum(len(slots) for slots in owned) == SLOTS
            and frozenset().union(*owned) == frozenset(range(SLOTS))
        )

    async def settle(self, timeout_s: float = 15.0) -> float:
        """Wait until the fleet has settled and return how long it took."""
        started = time.monotonic()
        await eventually(self.settled, timeout_s, f"fleet {sorted(self.members)} settled")
        return time.monotonic() - started

    def sizes(self) -> list[int]:
        return sorted(len(slots) for slots in self.owned().values())

    async def close(self) -> None:
        for member_id in list(self.members):
            await self.leave(member_id)


@pytest.fixture
async def fleet(zookeeper_server: ZooKeeperServer) -> AsyncIterator[Fleet]:
    fleet = Fleet(zookeeper_server.hosts, f"t-{uuid.uuid4().hex[:10]}")
    try:
        yield fleet
    finally:
        await fleet.close()


def expire_session(hosts: str, victim: KazooClient) -> None:
    """The classic trick: attach a second client to the victim's session and close it, which
    makes the server expire the session (and delete its ephemeral nodes) while the victim's
    own connection is still up."""
    client_id = victim.client_id
    assert client_id is not None
    twin = KazooClient(hosts=hosts, client_id=client_id, timeout=TEST_SESSION_TIMEOUT_S)
    twin.start(timeout=10)
    twin.stop()
    twin.close()


@contextlib.contextmanager
def traced_peak() -> Iterator[Callable[[], int]]:
    """Yields what tells the most Python memory held at once since the block began."""
    tracemalloc.start()
    try:
        yield lambda: tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest,
    redis_server: RedisServer,
    second_broker: RedisServer,
    zookeeper_server: ZooKeeperServer,
) -> Iterator[Cluster]:
    """A topic of 4 slots on two brokers, to be doubled (splits.py; the test_split*.py files).
    Parametrized indirectly with "buckets", its settings record turns recordBuckets and
    storeBuckets on."""
    servers = (redis_server, second_broker)
    with two_brokers(Cluster, servers, zookeeper_server, NAMESPACE, "s", ROUTING) as built:
        if getattr(request, "param", None) == "buckets":
            bucketed = replace(built.topic, redis_record_buckets=True, redis_store_buckets=True)
            for admin in built.admins:
                Queue(admin, bucketed).publish_settings("tests", 1)
        yield built
