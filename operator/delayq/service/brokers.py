"""The topic's Redis brokers and the slot → broker routing the operator fixed.

A slot's messages live on one broker (docs/contracts.md §2), whichever process owns the slot:
after a failover the survivor claims the moved slots from *their* broker, and the HTTP API writes
each message to the broker of its slot. The routing comes from ZooKeeper's `routing` node when
there is one, else it is the operator's first routing (contiguous ranges). A slot move
(`delayq routing move-slot`) changes the node, so the service watches it
(`delayq.coordination.routing_watch.RoutingWatch`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import redis.asyncio

from delayq.coordination.routing import by_broker, halves, initial_routing
from delayq.queue import functions
from delayq.queue.client import AsyncQueue
from delayq.queue.functions import FunctionsMissingError
from delayq.queue.model import SlotStats, Target, TopicStats
from delayq.queue.packing import use_hiredis_packing
from delayq.queue.topic import Topic
from delayq.queue.topic_record import SERVE_OWNER
from delayq.service.delivery.stream import guarded_pool_options
from delayq.service.delivery.targets import TargetPolicy

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

# A bound on one reply, so a dead peer is noticed; generous, because a Redis busy with a large
# claim or a failover may answer late without being dead. (No blocking command uses these
# pools: the wake-up waits have their own connections, `delayq.queue.slots`.)
SOCKET_TIMEOUT_S = 20.0
PING_TIMEOUT_S = 1.0


def connect(
    url: str, max_connections: int, targets: TargetPolicy | None = None
) -> redis.asyncio.Redis:
    """A client whose pool waits for a free connection instead of failing when all are busy,
    so a burst of deliveries queues for Redis rather than erroring into retries. With
    `targets` (a tenant's URL: an external stream target) it connects only where they admit."""
    sizing: dict[str, Any] = {
        "max_connections": max_connections,
        "timeout": None,
        "socket_timeout": SOCKET_TIMEOUT_S,
    }
    if targets is None:
        pool = redis.asyncio.BlockingConnectionPool.from_url(url, **sizing)
    else:
        pool = redis.asyncio.BlockingConnectionPool(**guarded_pool_options(url, targets), **sizing)
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
        # the old slots a doubling under way switched to their halves (`Routing.doubled_slots`)
        self.doubled_slots: frozenset[int] = frozenset()
        self._doubled: list[AsyncQueue] | None = None  # per broker, at 2N and generation + 1
        self._halves: Brokers | None = None  # those, as Brokers (made once)

    def queue_for(self, slot: int) -> AsyncQueue:
        return self.queues[self.routing[slot]]

    def place(self, target: Target) -> tuple[AsyncQueue, int]:
        """The client and slot a message is written to and read from: its slot's, or, once a
        doubling switched that slot, its half's (twice the slot amount, the next generation,
        the same broker; docs/coordination.md "Doubling the slots"). A slot given explicitly
        is one of this topic's: its old keys, refused until the doubling ends."""
        slot = target.slot(self.topic)
        broker = self.routing[slot]
        if slot in self.doubled_slots and target.explicit_slot is None:
            queue = self._doubled_queue(broker)
            return queue, target.slot(queue.topic)
        return self.queues[broker], slot

    def stored_in(self, slot: int) -> tuple[AsyncQueue, list[int]]:
        """The client and slots that hold slot `slot`'s messages now: the slot itself, or once
        a doubling switched it, its halves s and s + N at the next generation (same broker).
        For the readers of a whole slot (the dead pages, redrive and purge of everything)."""
        broker = self.routing[slot]
        if slot in self.doubled_slots:
            return self._doubled_queue(broker), halves(slot, self.topic.slot_amount)
        return self.queues[broker], [slot]

    def stored(self, slots: Iterable[int]) -> list[tuple[int, AsyncQueue, dict[int, int]]]:
        """Where `slots` are stored now (`stored_in`), by client: (broker, client, {stored
        slot: slot}), one per broker, two on a broker while a doubling switches its slots.
        Without a doubling by broker at once (16,384 slots read 5 times as fast)."""
        if not self.doubled_slots:
            split = self.split(slots).items()
            return [(b, self.queues[b], dict(zip(ss, ss, strict=True))) for b, ss in split]
        groups: dict[int, tuple[int, AsyncQueue, dict[int, int]]] = {}
        for slot in slots:
            queue, stored = self.stored_in(slot)
            group = groups.setdefault(id(queue), (self.routing[slot], queue, {}))
            group[2].update(dict.fromkeys(stored, slot))
        return list(groups.values())

    def halves(self) -> Brokers:
        """The brokers at twice the slot amount and the next generation, s and s + N on the
        broker of s: where a doubling under way stores the slots it switched. It shares this
        one's Redis clients (closed with it, never on its own). Made once: the routing of a
        doubling under way does not change (no slot moves meanwhile)."""
        if self._halves is None:
            doubled = [self._doubled_queue(broker) for broker in range(len(self.queues))]
            self._halves = Brokers(doubled, self.routing * 2)
        return self._halves

    def _doubled_queue(self, broker: int) -> AsyncQueue:
        """The broker's client at twice the slot amount and the next generation (made once)."""
        if self._doubled is None:
            amount, generation = 2 * self.topic.slot_amount, self.topic.slot_generation + 1
            doubled = replace(self.topic, slot_amount=amount, slot_generation=generation)
            self._doubled = [AsyncQueue(queue.redis, doubled) for queue in self.queues]
        return self._doubled[broker]

    def split(self, slots: Iterable[int]) -> dict[int, list[int]]:
        """broker index → the given slots it stores."""
        wanted = list(slots)
        return {
            broker: [wanted[i] for i in positions]
            for broker, positions in by_broker(self.routing, wanted).items()
        }

    async def each(
        self,
        items: Sequence[T],
        slot_of: Callable[[T], int],
        call: Callable[[AsyncQueue, list[T]], Awaitable[Sequence[R]]],
    ) -> list[R]:
        """Run a batch operation on each broker with its items; results in the items' order."""
        positions = by_broker(self.routing, map(slot_of, items))
        results: list[R | None] = [None] * len(items)
        for broker, indexes in positions.items():
            answers = await call(self.queues[broker], [items[i] for i in indexes])
            for index, answer in zip(indexes, answers, strict=True):
                results[index] = answer
        return [r for r in results if r is not None]

    async def each_placed(
        self,
        items: Sequence[T],
        target_of: Callable[[T], Target],
        call: Callable[[AsyncQueue, list[T]], Awaitable[list[R]]],
    ) -> list[R]:
        """`each` by where each item is written (`place`): one call per broker, two on a
        broker while a doubling switches its slots; results in the items' order."""
        groups: dict[int, tuple[AsyncQueue, list[int]]] = {}
        for index, item in enumerate(items):
            queue, _ = self.place(target_of(item))
            groups.setdefault(id(queue), (queue, []))[1].append(index)
        results: list[R | None] = [None] * len(items)
        for queue, indexes in groups.values():
            answers = await call(queue, [items[i] for i in indexes])
            for index, answer in zip(indexes, answers, strict=True):
                results[index] = answer
        return [r for r in results if r is not None]

    async def stats(self, slots: Iterable[int] | None = None, groups: bool = False) -> TopicStats:
        """The depths of `slots` (all when None), one per slot in slot order: a slot a doubling
        switched is counted in its halves (`stored`), under its own number; with `groups`, the
        fair groups' counts too."""
        counted: dict[int, SlotStats] = {}
        for _, queue, named in self.stored(self.topic.slots if slots is None else slots):
            for part in (await queue.stats(list(named), groups)).slots:
                slot = named[part.slot]
                counted[slot] = _added(counted.get(slot), replace(part, slot=slot))
        return TopicStats(sorted(counted.values(), key=lambda s: s.slot))

    async def each_broker(self, call: Callable[[AsyncQueue, list[int]], Awaitable[int]]) -> int:
        """Sum of `call(queue, its slots)` over where the slots are stored (`stored`: one
        call per broker, two on a broker while a doubling switches its slots): redrive or
        purge everything."""
        return sum([await call(q, list(named)) for _, q, named in self.stored(self.topic.slots)])

    async def unavailable(self, slots: Iterable[int]) -> str | None:
        """Why a broker storing one of `slots` (or broker 0 when none) cannot serve, None when
        every one can: it does not answer, or it lacks the engine's functions library (loaded
        here when this process's Redis user may; the restricted user of a pod waits for the
        operator's health pass). The probe is the library's read-only `version` function, so
        it answers only where the engine's calls would run."""
        brokers = sorted(set(self.split(slots)) or {0})
        for broker in brokers:
            try:
                await asyncio.wait_for(
                    functions.ensure_async(self.queues[broker].redis), PING_TIMEOUT_S
                )
            except FunctionsMissingError:
                return (
                    f"broker {broker} lacks the engine's functions library "
                    f"{functions.library().name} (the operator of this version loads it)"
                )
            except (redis.RedisError, OSError, TimeoutError):
                return "a broker does not answer"
        return None

    async def publish_settings(self, version: int) -> bool:
        """Publish the topic's settings record on every broker as `delayq serve` (a process
        running a topic on Redis of its own owns it, `queue/topic_record.py`), at `version`
        (the ms it read its settings): every client's scripts then obey them. False when this
        process's Redis user may not write the record (a pod's restricted user: the operator
        publishes) or may not load the functions it needs (the operator loads them)."""
        for broker, queue in enumerate(self.queues):
            try:
                versions = await queue.publish_settings(SERVE_OWNER, version)
            except (redis.exceptions.NoPermissionError, FunctionsMissingError):
                return False
            if max(versions, default=version) > version:
                log.warning(
                    "a newer settings record stands on a broker: its settings apply",
                    extra={"broker": broker, "version": max(versions)},
                )
        return True

    async def close(self) -> None:
        for queue in self.queues:
            await queue.close()


def _added(counted: SlotStats | None, half: SlotStats) -> SlotStats:
    """`half` added to what was counted of its slot so far (its other half, or nothing)."""
    if counted is None:
        return half
    return replace(
        counted,
        now_ms=max(counted.now_ms, half.now_ms),
        scheduled=counted.scheduled + half.scheduled,
        due=counted.due + half.due,
        prepared=counted.prepared + half.prepared,
        dead=counted.dead + half.dead,
        next_due_ms=_earliest(counted.next_due_ms, half.next_due_ms),
        next_deadline_ms=_earliest(counted.next_deadline_ms, half.next_deadline_ms),
        groups=counted.groups.plus(half.groups),
    )


def _earliest(first: int | None, second: int | None) -> int | None:
    return min((t for t in (first, second) if t is not None), default=None)
