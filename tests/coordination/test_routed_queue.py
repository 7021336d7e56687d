"""RoutedQueue on two real redis-servers and the session's ZooKeeper: every call lands on its
slot's broker, a multi-broker topic without routing is refused, and writes into a slot being
moved are sent again to its new broker once the watched routing switches (nothing lost)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

import pytest
import redis
from kazoo.client import KazooClient

from delayq.coordination.layout import TopicPaths
from delayq.coordination.migration import SlotMover, Step
from delayq.coordination.routed_queue import RoutedQueue, RoutingError, RoutingTable
from delayq.coordination.routing import Routing
from delayq.coordination.routing_watch import ZkConnection
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue import (
    Code,
    ExpiresBeforeDueError,
    PartlyStoredError,
    Queue,
    ReplicationTimeoutError,
    ScheduleFailure,
    ScheduleRequest,
    ScheduleResult,
    SlotMovingError,
    State,
    Topic,
    consume_plans,
)
from delayq.queue.keys import Part, slot_keys

SLOTS = 8
SPLIT = (0, 1) * (SLOTS // 2)  # even slots on broker 0, odd ones on broker 1


@dataclass
class TwoBrokers:
    urls: list[str]
    topic: Topic
    zk: KazooClient
    hosts: str

    @property
    def paths(self) -> TopicPaths:
        return TopicPaths(self.topic.namespace, self.topic.name)

    def publish(self, routing: tuple[int, ...]) -> None:
        self.zk.create(self.paths.routing, Routing(SLOTS, 2, routing).to_json(), makepath=True)

    def stored_on(self, broker: int, slot: int) -> set[str]:
        client = redis.Redis.from_url(self.urls[broker])
        try:
            members = client.zrange(slot_keys(self.topic, slot).key(Part.STORE), 0, -1)
            return {bytes(m).decode() for m in cast(list[bytes], members)}
        finally:
            client.close()

    def mover(self) -> SlotMover:
        return SlotMover(self.zk, self.paths, [Queue.from_url(u, self.topic) for u in self.urls])


@pytest.fixture
def brokers(
    redis_server: RedisServer, second_broker: RedisServer, zookeeper_server: ZooKeeperServer
) -> Iterator[TwoBrokers]:
    topic = Topic("orders", namespace=f"rq-{uuid.uuid4().hex[:8]}", slot_amount=SLOTS)
    zk = KazooClient(hosts=zookeeper_server.hosts)
    zk.start(timeout=10)
    try:
        yield TwoBrokers([redis_server.url, second_broker.url], topic, zk, zookeeper_server.hosts)
    finally:
        zk.stop()
        zk.close()


def ids_in(topic: Topic, slot: int, count: int) -> list[str]:
    """`count` fresh ids whose slot is `slot`."""
    found: list[str] = []
    while len(found) < count:
        candidate = uuid.uuid4().hex
        if topic.slot_of(candidate) == slot:
            found.append(candidate)
    return found


def test_every_call_goes_to_its_slots_broker(brokers: TwoBrokers):
    with RoutedQueue.connect(brokers.urls, brokers.topic, routing=SPLIT) as queue:
        ids = [f"m-{i}" for i in range(64)]
        results = queue.schedule_many([ScheduleRequest(i, b"x", delay_ms=60_000) for i in ids])
        assert [r.code for r in results] == [Code.CREATED] * len(ids)
        one = queue.schedule("single", b"y", delay_ms=60_000)
        for message_id in [*ids, "single"]:
            slot = brokers.topic.slot_of(message_id)
            assert message_id in brokers.stored_on(SPLIT[slot], slot)
            assert message_id not in brokers.stored_on(1 - SPLIT[slot], slot)
        assert queue.get("single").state is State.SCHEDULED
        assert queue.reschedule("single", delay_ms=120_000).code is Code.RESCHEDULED
        assert (queue.get("single").due_ms or 0) > one.due_ms
        assert queue.cancel("single").code is Code.CANCELLED
        assert {queue.get(i).state for i in ids} == {State.SCHEDULED}


def test_one_broker_needs_no_routing(redis_server: RedisServer):
    topic = Topic("single", namespace=f"rq-{uuid.uuid4().hex[:8]}", slot_amount=SLOTS)
    with RoutedQueue.connect([redis_server.url], topic) as queue:
        assert queue.schedule("a", delay_ms=1000).code is Code.CREATED
        with pytest.raises(ExpiresBeforeDueError):  # raised, as Queue.schedule does
            queue.schedule("b", at_ms=2**41, expire_at_ms=2**41)
        assert queue.get("a").state is State.SCHEDULED


def test_a_multi_broker_topic_without_routing_is_refused(brokers: TwoBrokers):
    with pytest.raises(RoutingError, match="has 2 brokers") as refused:
        RoutedQueue.connect(brokers.urls, brokers.topic)
    assert "\n" not in str(refused.value)
    zookeeper = ZkConnection(brokers.hosts)
    with pytest.raises(RoutingError, match="no routing for 8 slots in ZooKeeper"):
        RoutedQueue.connect(brokers.urls, brokers.topic, zookeeper=zookeeper)
    brokers.publish(SPLIT)
    with pytest.raises(RoutingError, match="names broker 1, but 1 broker URL"):
        RoutedQueue.connect(brokers.urls[:1], brokers.topic, zookeeper=zookeeper)


def test_a_write_into_a_frozen_slot_is_sent_to_its_new_broker_after_the_switch(
    brokers: TwoBrokers,
):
    brokers.publish((0,) * SLOTS)
    slot = 3
    message_id, late = ids_in(brokers.topic, slot, 2)
    mover = brokers.mover()
    zookeeper = ZkConnection(brokers.hosts)
    with RoutedQueue.connect(brokers.urls, brokers.topic, zookeeper=zookeeper) as queue:
        migration, version = mover.start(slot, 1)
        current = mover.step(migration, version)  # frozen: its writes are refused from now
        assert current is not None
        assert current[0].step is Step.COPY
        with ThreadPoolExecutor(1) as pool:
            writing = pool.submit(queue.schedule, message_id, b"x", delay_ms=60_000)
            wait_until(
                lambda: not writing.done() and queue.routing[slot] == 0, 5.0, "a write waiting"
            )
            while current is not None:  # copy, switch, clean
                current = mover.step(*current)
            assert writing.result(timeout=10).code is Code.CREATED
        assert queue.routing[slot] == 1  # followed the watch
        assert message_id in brokers.stored_on(1, slot)
        assert queue.get(message_id).state is State.SCHEDULED
        # a client that gives up at once sees the refusal (the bound is what makes it wait)
        frozen = mover.step(*mover.start(slot, 0))
        assert frozen is not None
        queue.move_wait_ms = 0
        with pytest.raises(SlotMovingError):
            queue.schedule(late, delay_ms=1000)
    for queue_ in mover.queues:
        queue_.close()


def test_slots_moved_while_the_client_writes_lose_nothing(brokers: TwoBrokers):
    brokers.publish((0,) * SLOTS)
    zookeeper = ZkConnection(brokers.hosts)
    mover = brokers.mover()
    written: list[str] = []
    stop = threading.Event()

    def write(queue: RoutedQueue) -> None:
        while not stop.is_set():
            batch = [ScheduleRequest(uuid.uuid4().hex, b"x", delay_ms=60_000) for _ in range(50)]
            results = queue.schedule_many(batch)
            assert {r.code for r in results} == {Code.CREATED}
            written.extend(r.id for r in results)

    with (
        RoutedQueue.connect(brokers.urls, brokers.topic, zookeeper=zookeeper) as queue,
        ThreadPoolExecutor(1) as pool,
    ):
        writing = pool.submit(write, queue)
        for slot in (1, 2, 5):
            mover.move(slot, 1)
        wait_until(lambda: queue.routing == [0, 1, 1, 0, 0, 1, 0, 0], 5.0, "routing followed")
        stop.set()
        writing.result(timeout=30)
    stored = {
        message_id: broker
        for broker in (0, 1)
        for slot in range(SLOTS)
        for message_id in brokers.stored_on(broker, slot)
    }
    assert len(written) == len(set(written)) > 0
    assert set(written) == set(stored)  # nothing lost, nothing stranded on another broker
    routing = Routing.from_json(brokers.zk.get(brokers.paths.routing)[0]).broker_of_slot
    assert all(stored[i] == routing[brokers.topic.slot_of(i)] for i in written)
    for queue_ in mover.queues:
        queue_.close()


def requests_in(topic: Topic, *slots: int) -> list[ScheduleRequest]:
    """Two requests per slot, in the order of `slots`."""
    return [
        ScheduleRequest(message_id, b"x", delay_ms=60_000)
        for slot in slots
        for message_id in ids_in(topic, slot, 2)
    ]


def test_each_item_of_a_broker_keeps_the_error_of_its_own_slots_call(brokers: TwoBrokers):
    """Broker 0 refuses slot 2 as moving and stores slot 4, broker 1 stores slot 1: every item
    reports its own slot's answer, not the first error of its broker. (A full broker refuses
    every write function before it runs, moving slot or not: `queue/functions.py`.)"""
    frozen, other, stored = 2, 4, 1
    requests = requests_in(brokers.topic, frozen, other, stored)
    with RoutedQueue.connect(brokers.urls, brokers.topic, routing=SPLIT, move_wait_ms=0) as queue:
        queue.queues[0].run(consume_plans.freeze(brokers.topic, frozen))
        with pytest.raises(PartlyStoredError) as partly:
            queue.schedule_many(requests)
    answers = partly.value.results
    assert [a.id for a in answers] == [r.id for r in requests]
    errors = [type(a.error) if isinstance(a, ScheduleFailure) else a.code for a in answers]
    assert errors == [SlotMovingError] * 2 + [Code.CREATED] * 4
    assert {r.id for r in requests[4:]} == brokers.stored_on(1, stored)


def test_a_broker_whose_replicas_lag_fails_only_its_items_after_others_stored(
    redis_server: RedisServer, second_broker: RedisServer
):
    """syncReplicas 1: broker 0 has a replica, broker 1 none, so its writes go unconfirmed.
    Broker 0's items are stored; broker 1's are failures carrying their own result (written on
    its master), never an error escaping after broker 0 stored."""
    topic = Topic(
        "orders",
        namespace=f"rq-{uuid.uuid4().hex[:8]}",
        slot_amount=SLOTS,
        redis_sync_replicas=1,
        redis_sync_timeout_ms=1000,
    )
    confirmed, unconfirmed = 2, 1
    requests = requests_in(topic, confirmed, unconfirmed)
    with RedisServer(extra_config={"replicaof": f"127.0.0.1 {redis_server.port}"}):
        admin = redis.Redis.from_url(redis_server.url)
        wait_until(
            lambda: admin.info("replication").get("slave0", {}).get("state") == "online",
            20.0,
            "the replica in sync",
        )
        admin.close()
        urls = [redis_server.url, second_broker.url]
        with (
            RoutedQueue.connect(urls, topic, routing=SPLIT) as queue,
            pytest.raises(PartlyStoredError) as partly,
        ):
            queue.schedule_many(requests)
    answers = partly.value.results
    assert [a.code for a in answers[:2] if isinstance(a, ScheduleResult)] == [Code.CREATED] * 2
    lagging = [a for a in answers[2:] if isinstance(a, ScheduleFailure)]
    assert [f.id for f in lagging] == [r.id for r in requests[2:]]
    for failure in lagging:
        assert isinstance(failure.error, ReplicationTimeoutError)
        assert failure.error.confirmed == 0
        result = failure.error.result
        assert isinstance(result, ScheduleResult)
        assert (result.id, result.code) == (failure.id, Code.CREATED)


def test_a_get_on_a_stale_routing_after_a_move_asks_the_new_broker(brokers: TwoBrokers):
    """After a move's clean step the source keeps only the slot's frozen epoch: a client whose
    routing still names it is refused (SLOT_MOVING), not told the message is absent, and
    asks again once its routing names the new broker."""
    brokers.publish((0,) * SLOTS)
    slot = 3
    [message_id] = ids_in(brokers.topic, slot, 1)
    mover = brokers.mover()
    table = RoutingTable(Routing(SLOTS, 2, (0,) * SLOTS), 2)  # fed by hand: the watch is late
    queue = RoutedQueue(mover.queues, table, move_wait_ms=0)
    queue.schedule(message_id, b"x", delay_ms=60_000)
    mover.move(slot, 1)  # freeze, copy, switch, clean
    with pytest.raises(SlotMovingError):
        queue.get(message_id)
    queue.move_wait_ms = 10_000
    with ThreadPoolExecutor(1) as pool:
        reading = pool.submit(queue.get, message_id)
        table.update(mover.routing()[0])
        assert reading.result(timeout=10).state is State.SCHEDULED
    for queue_ in mover.queues:
        queue_.close()
