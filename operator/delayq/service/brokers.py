"""The topic's Redis brokers and the slot → broker routing the operator fixed.

A slot's messages live on one broker (docs/contracts.md §2), whichever process owns the slot:
after a failover the survivor claims the moved slots from *their* broker, and the HTTP API writes
each message to the broker of its slot. The routing comes from ZooKeeper's `routing` node when
there is one, else it is the operator's first routing (contiguous ranges). A slot move
(`delayq routing move-slot`) changes the node, so the service watches it (`RoutingWatch`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

import redis.asyncio

from delayq.coordination.acl import ZkIdentity
from delayq.coordination.routing import initial_routing
from delayq.coordination.tls import ZkTls, kazoo_options
from delayq.queue.client import AsyncQueue
from delayq.queue.model import TopicStats
from delayq.queue.packing import use_hiredis_packing
from delayq.queue.topic import Topic

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")

# A bound on one reply, so a dead peer is noticed; generous, because a Redis busy with a large
# claim or a failover may answer late without being dead. (No blocking command uses these
# pools: the wake-up waits have their own connections, `delayq.queue.slots`.)
SOCKET_TIMEOUT_S = 20.0
PING_TIMEOUT_S = 1.0


def connect(url: str, max_connections: int) -> redis.asyncio.Redis:
    """A client whose pool waits for a free connection instead of failing when all are busy,
    so a burst of deliveries queues for Redis rather than erroring into retries."""
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=None, socket_timeout=SOCKET_TIMEOUT_S
    )
    return use_hiredis_packing(redis.asyncio.Redis(connection_pool=pool))


def default_routing(slot_amount: int, broker_count: int) -> list[int]:
    return list(initial_routing(slot_amount, broker_count).broker_of_slot)


class Brokers:
    """One engine client per broker, and the broker of every slot."""

    def __init__(self, queues: Sequence[AsyncQueue], routing: Sequence[int]) -> None:
        if not queues:
            raise ValueError("a topic needs at least one broker")
        topic = queues[0].topic
        if len(routing) != topic.slot_amount or any(not 0 <= b < len(queues) for b in routing):
            raise ValueError(f"routing does not map {topic.slot_amount} slots to brokers")
        self.queues = list(queues)
        self.routing = list(routing)
        self.topic: Topic = topic

    def queue_for(self, slot: int) -> AsyncQueue:
        return self.queues[self.routing[slot]]

    def split(self, slots: Iterable[int]) -> dict[int, list[int]]:
        """broker index → the given slots it stores."""
        grouped: dict[int, list[int]] = defaultdict(list)
        for slot in slots:
            grouped[self.routing[slot]].append(slot)
        return grouped

    async def each(
        self,
        items: Sequence[T],
        slot_of: Callable[[T], int],
        call: Callable[[AsyncQueue, list[T]], Awaitable[list[R]]],
    ) -> list[R]:
        """Run a batch operation on each broker with its items; results in the items' order."""
        positions: dict[int, list[int]] = defaultdict(list)
        for index, item in enumerate(items):
            positions[self.routing[slot_of(item)]].append(index)
        results: list[R | None] = [None] * len(items)
        for broker, indexes in positions.items():
            answers = await call(self.queues[broker], [items[i] for i in indexes])
            for index, answer in zip(indexes, answers, strict=True):
                results[index] = answer
        return [r for r in results if r is not None]

    async def stats(self, slots: Iterable[int] | None = None) -> TopicStats:
        wanted = list(self.topic.slots if slots is None else slots)
        parts = [
            await self.queues[broker].stats(broker_slots)
            for broker, broker_slots in self.split(wanted).items()
        ]
        return TopicStats(sorted((s for p in parts for s in p.slots), key=lambda s: s.slot))

    async def each_broker(self, call: Callable[[AsyncQueue, list[int]], Awaitable[int]]) -> int:
        """Sum of `call(queue, its slots)` over the brokers (redrive or purge everything)."""
        return sum(
            [await call(self.queues[b], slots) for b, slots in self.split(self.topic.slots).items()]
        )

    async def reachable(self, slots: Iterable[int]) -> bool:
        """Every broker storing one of `slots` (or broker 0 when none) answers a PING."""
        brokers = set(self.split(slots)) or {0}
        try:
            for broker in brokers:
                pong = self.queues[broker].redis.ping()
                if not await asyncio.wait_for(pong, PING_TIMEOUT_S):
                    return False
        except (redis.RedisError, OSError, TimeoutError):
            return False
        return True

    async def close(self) -> None:
        for queue in self.queues:
            await queue.close()


RoutingCallback = Callable[[list[int]], None]


class RoutingWatch:
    """The routing node, watched (kazoo DataWatch) on a ZooKeeper session of its own: every new
    version of the node is handed to `on_change` on the event loop. Logs in as the topic
    (`identity`): with ZooKeeper ACLs the node is readable by the topic and the operator only."""

    def __init__(
        self,
        hosts: str,
        namespace: str,
        topic: str,
        slot_amount: int,
        identity: ZkIdentity | None,
        tls: ZkTls | None = None,
    ) -> None:
        from kazoo.client import KazooClient  # kazoo only with ZooKeeper

        from delayq.coordination.layout import TopicPaths

        auth = [identity.auth_data] if identity else None
        self._client = KazooClient(hosts=hosts, timeout=10.0, auth_data=auth, **kazoo_options(tls))
        self._path = TopicPaths(namespace, topic).routing
        self._slot_amount = slot_amount

    async def start(self, on_change: RoutingCallback) -> list[int] | None:
        """Connect, read the node and watch it; returns the routing now (None when absent or
        unreadable). A refusal (wrong or missing credentials) raises instead of falling back to
        the first routing: on a topic whose brokers were added later that routing sends
        messages to the wrong broker, stranding the ones stored where the routing put them."""
        from kazoo.exceptions import NoAuthError, NoNodeError
        from kazoo.recipe.watchers import DataWatch

        from delayq.coordination.layout import decode_routing

        loop = asyncio.get_running_loop()

        def decoded(payload: bytes | None) -> list[int] | None:
            return None if payload is None else decode_routing(payload, self._slot_amount)

        def changed(payload: bytes | None, _stat: object) -> None:
            routing = decoded(payload)
            if routing is not None:
                loop.call_soon_threadsafe(on_change, routing)

        def connect() -> list[int] | None:
            self._client.start(timeout=10.0)
            try:
                payload: bytes | None = self._client.get(self._path)[0]
            except NoNodeError:
                payload = None
            DataWatch(self._client, self._path, changed)
            return decoded(payload)

        try:
            return await asyncio.to_thread(connect)
        except NoAuthError:
            await self.stop()
            raise
        except Exception:
            log.exception("could not read the routing from ZooKeeper; using the first routing")
            return None

    async def stop(self) -> None:
        def close() -> None:
            self._client.stop()
            self._client.close()

        await asyncio.to_thread(close)
