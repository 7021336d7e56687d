"""`RoutedQueue`: the blocking client of a topic on one or several brokers, by slot routing.

A slot's messages live on the Redis of the broker the routing names (docs/contracts.md §2), so
a producer writing to any other broker strands its messages where no owner claims them. This
client sends each call to its slot's broker: the routing comes from ZooKeeper's `routing` node,
watched (a slot move switches a slot's broker while the client runs), or is given explicitly
(one broker, tests). A multi-broker topic without a routing is refused (`RoutingError`), never
guessed: the operator's first routing is not the topic's once a slot has moved.

Writes into a slot being moved are refused by its broker with SLOT_MOVING and store nothing
(docs/coordination.md, "Moving a slot"); the client waits for the routing node to change (or a
backoff step, for a move rolled back) and sends them again to the slot's broker then, for up to
`move_wait_ms`, after which the SlotMovingError is raised. Sending again is safe: a refused call
stored nothing, and every write is create-only, idempotent or answers its own repeat. A read by
id (`get`) is refused and asked again the same way: once the move is done its old broker keeps
only the slot's frozen epoch, so answering there would call every message absent.

A doubling of the slot amount (docs/coordination.md "Doubling the slots") is followed the same
way: its freeze refuses writes into the old slots with SLOT_MOVING, its switch writes a routing
of twice the slots and a newer key generation, and the client then computes each item's slot
again under the new amount and sends it to the new slot's keys (`topic` follows the routing).
While the doubling's freeze switches the old slots one by one (`Routing.doubled_slots`), an
item of a switched slot goes to its new slot already (`_placed`): its writes pause for its own
slot only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar, Unpack

import redis

from delayq.coordination.layout import TopicPaths
from delayq.coordination.routing import Routing, halves
from delayq.coordination.routing_watch import RoutingWatch, ZkConnection
from delayq.queue import plans, produce_plans
from delayq.queue.backoff import Backoff
from delayq.queue.client import Queue
from delayq.queue.codes import ReplicationTimeoutError, SlotMovingError
from delayq.queue.model import (
    MessageInfo,
    Mode,
    Outcome,
    PartlyStoredError,
    ScheduleFailure,
    ScheduleOptions,
    ScheduleRequest,
    ScheduleResult,
    Target,
)
from delayq.queue.topic import Topic

log = logging.getLogger(__name__)
T = TypeVar("T")
#: How long a write refused with SLOT_MOVING is sent again (a move's write pause is a fraction
#: of this; the HTTP API waits as long, service/api.py SLOT_MOVE_WAIT_S).
DEFAULT_MOVE_WAIT_MS = 10_000
#: Between two sends of a refused write when the routing did not change meanwhile.
MOVE_BACKOFF = Backoff(base_ms=50, multiplier=2.0, max_ms=1000)


class RoutingError(ValueError):
    """The client cannot know which broker stores a slot; one line, naming what to give."""


class RoutingTable:
    """The current routing (slot -> broker, slot amount, key generation) and its version
    (routings seen), shared by the watch's thread, which replaces it, and the callers, which
    wait for a newer one."""

    def __init__(self, routing: Routing, broker_count: int) -> None:
        self.broker_count = broker_count
        self._routing = _checked(routing, broker_count)
        self._version = 0
        self._changed = threading.Condition()

    def snapshot(self) -> tuple[int, Routing]:
        with self._changed:
            return self._version, self._routing

    def update(self, routing: Routing) -> None:
        """A new routing from the watch; one naming a broker this client has no URL for is
        ignored (its writes then wait, and fail after `move_wait_ms`, rather than misroute),
        and so is one of an older key generation than the current (never back)."""
        try:
            checked = _checked(routing, self.broker_count)
        except RoutingError as error:
            log.error("routing ignored: %s", error)
            return
        with self._changed:
            if checked.generation < self._routing.generation:
                return
            self._routing = checked
            self._version += 1
            self._changed.notify_all()

    def wait_newer(self, version: int, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for a routing newer than `version`; True when there is one."""
        with self._changed:
            return self._changed.wait_for(lambda: self._version > version, timeout_s)


def _checked(routing: Routing, broker_count: int) -> Routing:
    if any(not 0 <= broker < broker_count for broker in routing.broker_of_slot):
        raise RoutingError(
            f"the routing names broker {max(routing.broker_of_slot)}, but {broker_count} "
            "broker URL(s) were given: give every broker's URL, in broker index order"
        )
    return routing


class RoutedQueue:
    """schedule, schedule_many, cancel, reschedule and get, each on its slot's broker.

    Build it with `connect`; `queues[b]` is broker b's engine client (`Queue`) under the
    current routing's slot amount and generation, for what the routed calls do not cover (a
    consumer claims from the broker of the slots it owns)."""

    def __init__(
        self,
        queues: Sequence[Queue],
        table: RoutingTable,
        watch: RoutingWatch | None = None,
        move_wait_ms: int = DEFAULT_MOVE_WAIT_MS,
    ) -> None:
        if len(queues) != table.broker_count:
            raise ValueError(f"{len(queues)} brokers for a routing of {table.broker_count}")
        self._given = list(queues)
        self.move_wait_ms = move_wait_ms
        self._table = table
        self._watch = watch
        # (slot amount, generation) -> a client per broker with that topic; every one shares
        # the given clients' connection pools
        given = queues[0].topic
        self._clients = {(given.slot_amount, given.slot_generation): self._given}

    @classmethod
    def connect(
        cls,
        broker_urls: Sequence[str],
        topic: Topic,
        *,
        zookeeper: ZkConnection | None = None,
        routing: Sequence[int] | None = None,
        move_wait_ms: int = DEFAULT_MOVE_WAIT_MS,
        **redis_options: Any,
    ) -> RoutedQueue:
        """A client of `topic` on `broker_urls` (broker index order), routed by ZooKeeper's
        routing node (watched) or by `routing`; one URL alone needs neither. Raises
        RoutingError for a multi-broker topic without either, a routing node that is missing
        or for another slot amount (unless of a newer key generation: the slots doubled,
        which the client follows), or one naming more brokers than URLs."""
        if not broker_urls:
            raise RoutingError("give the Redis URL of every broker of the topic")
        if zookeeper is not None and routing is not None:
            raise RoutingError("give the routing or ZooKeeper, not both")
        table, watch = None, None
        if zookeeper is not None:
            table, watch = _watched(zookeeper, topic, len(broker_urls))
        elif routing is not None:
            if len(routing) != topic.slot_amount:
                raise RoutingError(
                    f"the routing maps {len(routing)} slots, the topic has {topic.slot_amount}"
                )
            table = RoutingTable(_fixed(topic, len(broker_urls), routing), len(broker_urls))
        elif len(broker_urls) == 1:
            table = RoutingTable(_fixed(topic, 1, [0] * topic.slot_amount), 1)
        else:
            raise RoutingError(
                f"topic {topic.namespace}/{topic.name} has {len(broker_urls)} brokers: its "
                "routing (ZooKeeper, or given) says which one stores each slot"
            )
        queues = [Queue.from_url(url, topic, **redis_options) for url in broker_urls]
        return cls(queues, table, watch, move_wait_ms)

    # routing -------------------------------------------------------------------------------

    @property
    def routing(self) -> list[int]:
        """slot -> broker index, as the client routes right now."""
        return list(self._table.snapshot()[1].broker_of_slot)

    @property
    def topic(self) -> Topic:
        """The topic under the current routing's slot amount and key generation."""
        return self.queues[0].topic

    @property
    def queues(self) -> list[Queue]:
        """Broker b's engine client at index b, under the current routing."""
        routing = self._table.snapshot()[1]
        return self._queues(routing.slot_amount, routing.generation)

    def _queues(self, slot_amount: int, generation: int) -> list[Queue]:
        """The clients of that slot amount and generation, made once."""
        key = (slot_amount, generation)
        found = self._clients.get(key)
        if found is None:
            topic = replace(
                self._given[0].topic, slot_amount=slot_amount, slot_generation=generation
            )
            found = self._clients[key] = [Queue(q.redis, topic) for q in self._given]
        return found

    def _placed(self, routing: Routing, target: Target) -> tuple[Queue, int]:
        """The client and slot of `target` under `routing`: the half of its slot (twice the
        slot amount, the next generation, the same broker) once a doubling switched that
        slot (`Routing.doubled_slots`). A slot given explicitly is one of the routing's
        amount: its old keys (refused until the doubling ends)."""
        queues = self._queues(routing.slot_amount, routing.generation)
        slot = target.slot(queues[0].topic)
        broker = routing.broker_of_slot[slot]
        if slot in routing.doubled_slots and target.explicit_slot is None:
            queues = self._queues(2 * routing.slot_amount, routing.generation + 1)
            slot = target.slot(queues[0].topic)
        return queues[broker], slot

    def queue_for(self, slot: int) -> Queue:
        """The engine client of the broker storing `slot` now."""
        return self.queues[self.routing[slot]]

    def stored_in(self, slot: int) -> tuple[Queue, list[int]]:
        """The engine client and slots holding slot `slot`'s messages now, as the service's
        `Brokers.stored_in`: the slot itself on its broker, or once a doubling switched it
        (`Routing.doubled_slots`), its halves at twice the slot amount and the next key
        generation on the same broker. For the readers of a whole slot (`pipeline archive`)."""
        routing = self._table.snapshot()[1]
        broker = routing.broker_of_slot[slot]
        if slot in routing.doubled_slots:
            queues = self._queues(2 * routing.slot_amount, routing.generation + 1)
            return queues[broker], halves(slot, routing.slot_amount)
        return self._queues(routing.slot_amount, routing.generation)[broker], [slot]

    def _on_slot(self, target: Target, call: Callable[[Queue], T]) -> T:
        """`call` on the target's broker, sent again while its slot is moving; its slot is
        computed again each time (under a doubled slot amount it changes)."""
        deadline, attempt = time.monotonic() + self.move_wait_ms / 1000, 0
        while True:
            version, routing = self._table.snapshot()
            queue, _ = self._placed(routing, target)
            try:
                return call(queue)
            except SlotMovingError:
                attempt += 1
                if not self._await_move(version, deadline, attempt):
                    raise

    def _await_move(self, version: int, deadline: float, attempt: int) -> bool:
        """After a SLOT_MOVING refusal of a call routed by routing `version`: wait for a newer
        routing or one backoff step; False once `move_wait_ms` is over."""
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self._table.wait_newer(version, min(left, MOVE_BACKOFF.delay_ms(attempt) / 1000))
        return True

    # producing -----------------------------------------------------------------------------

    def schedule(
        self, message_id: str, payload: bytes | str = b"", **options: Unpack[ScheduleOptions]
    ) -> ScheduleResult:
        """As Queue.schedule."""
        return self._on_slot(
            Target(message_id, options.get("slot_basis")),
            lambda queue: queue.schedule(message_id, payload, **options),
        )

    def schedule_many(
        self, requests: Sequence[ScheduleRequest], mode: Mode = Mode.CREATE
    ) -> list[ScheduleResult]:
        """As Queue.schedule_many: one call per broker, every broker called whatever another
        answered; items refused with SLOT_MOVING are sent again (only they) on the newer
        routing. Every request is validated before any is sent, so InvalidMessageError means
        nothing was stored.

        When some items failed (or kept being refused past `move_wait_ms`) and others were
        written, raises PartlyStoredError whose `results` give each item the answer of its own
        slot's call: a ScheduleResult, or a ScheduleFailure with that call's error (a slot
        refused with SLOT_MOVING and another with BrokerFullError on one broker each keep
        their own). On a topic with `redis_sync_replicas`, an item written on its broker's
        master that too few replicas confirmed is a ScheduleFailure whose error is a
        ReplicationTimeoutError carrying the item's ScheduleResult: resending it is safe.
        When nothing was written at all, the first error is raised (resend the whole batch)."""
        targets = [Target(r.id, r.slot_basis) for r in requests]
        results: list[ScheduleResult | ScheduleFailure | None] = [None] * len(requests)
        pending = list(range(len(requests)))
        deadline, attempt = time.monotonic() + self.move_wait_ms / 1000, 0
        while pending:
            version, routing = self._table.snapshot()
            # a doubling re-slots what it refused: every pass; one call per client (a broker
            # has two while a doubling is switched slot by slot)
            placed = {i: self._placed(routing, targets[i]) for i in pending}
            groups: dict[int, list[int]] = {}
            clients: dict[int, Queue] = {}
            for i in pending:
                clients[id(placed[i][0])] = placed[i][0]
                groups.setdefault(id(placed[i][0]), []).append(i)
            built = {  # built before anything is sent: a refused request stops them all
                key: produce_plans.schedule_answers(
                    clients[key].topic, [requests[i] for i in indexes], mode
                )
                for key, indexes in groups.items()
            }
            moving: list[int] = []
            for key, indexes in groups.items():
                items = [(requests[i].id, placed[i][1]) for i in indexes]
                answers = self._send(clients[key], built[key], items)
                for index, answer in zip(indexes, answers, strict=True):
                    if isinstance(answer, ScheduleFailure) and isinstance(
                        answer.error, SlotMovingError
                    ):
                        moving.append(index)
                    results[index] = answer
            pending = sorted(moving)
            attempt += 1
            if pending and not self._await_move(version, deadline, attempt):
                break
        return _stored(results)

    @staticmethod
    def _send(
        queue: Queue,
        plan: plans.Plan[list[ScheduleResult | ScheduleFailure]],
        items: Sequence[tuple[str, int]],
    ) -> list[ScheduleResult | ScheduleFailure]:
        """One broker's schedule call of `items` (id, slot): each item's own answer. Only a
        call that failed as a whole (the connection, or its one slot refused) fails all."""
        try:
            return queue.run(plan)
        except ReplicationTimeoutError as error:
            return produce_plans.unconfirmed(error)
        except redis.RedisError as error:
            return [ScheduleFailure(message_id, slot, error) for message_id, slot in items]

    def cancel(self, message_id: str, slot_basis: str | None = None) -> Outcome:
        target = Target(message_id, slot_basis)
        return self._on_slot(target, lambda queue: queue.cancel(message_id, slot_basis))

    def reschedule(
        self,
        message_id: str,
        *,
        delay_ms: int | None = None,
        at_ms: int | None = None,
        slot_basis: str | None = None,
        slot: int | None = None,
    ) -> Outcome:
        """As Queue.reschedule."""
        return self._on_slot(
            Target(message_id, slot_basis, slot),
            lambda queue: queue.reschedule(
                message_id, delay_ms=delay_ms, at_ms=at_ms, slot_basis=slot_basis, slot=slot
            ),
        )

    def get(self, message_id: str, slot_basis: str | None = None) -> MessageInfo:
        target = Target(message_id, slot_basis)
        return self._on_slot(target, lambda queue: queue.get(message_id, slot_basis))

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
        for queue in self._given:  # the other generations' clients share their connections
            queue.close()

    def __enter__(self) -> RoutedQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _watched(
    zookeeper: ZkConnection, topic: Topic, broker_count: int
) -> tuple[RoutingTable, RoutingWatch]:
    """The routing node read and watched; refused when absent or unusable (the watch closed).
    The watch reports the node as it registers and on every change from then: what it saw
    before the table existed is the newest routing, newer than the read."""
    watch = RoutingWatch(
        zookeeper.hosts,
        topic.namespace,
        topic.name,
        topic.slot_amount,
        zookeeper.identity,
        zookeeper.tls,
        generation=topic.slot_generation,
    )
    lock = threading.Lock()
    tables: list[RoutingTable] = []
    early: list[Routing] = []

    def changed(routing: Routing) -> None:
        with lock:
            if tables:
                tables[0].update(routing)
            else:
                early.append(routing)

    try:
        read = watch.open(changed)
        with lock:
            routing = early[-1] if early else read
            if routing is None:
                raise RoutingError(
                    f"no routing for {topic.slot_amount} slots in ZooKeeper at "
                    f"{TopicPaths(topic.namespace, topic.name).routing}: is the topic applied, "
                    "with this slot amount?"
                )
            tables.append(RoutingTable(routing, broker_count))
    except BaseException:
        watch.close()
        raise
    return tables[0], watch


def _fixed(topic: Topic, broker_count: int, routing: Sequence[int]) -> Routing:
    """A routing given rather than watched: the topic's slot amount and generation."""
    return Routing(topic.slot_amount, broker_count, tuple(routing), topic.slot_generation)


def _stored(results: list[ScheduleResult | ScheduleFailure | None]) -> list[ScheduleResult]:
    """The results, or PartlyStoredError when some items failed and something was written,
    or the first error when nothing was (every item refused)."""
    final = [r for r in results if r is not None]
    failures = [r for r in final if isinstance(r, ScheduleFailure)]
    if not failures:
        return [r for r in final if isinstance(r, ScheduleResult)]
    unconfirmed = [f for f in failures if isinstance(f.error, ReplicationTimeoutError)]
    if len(failures) == len(final) and not unconfirmed:
        raise failures[0].error
    raise PartlyStoredError(final)
