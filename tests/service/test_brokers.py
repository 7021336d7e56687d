"""Multi-broker topics: each slot's messages live on the broker the routing names, and the
service schedules, claims, acks and counts them there."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kazoo.client import KazooClient

from delayq.coordination import migration, splitting
from delayq.coordination.layout import TopicPaths
from delayq.coordination.migration import SlotMover, Step
from delayq.coordination.routing import Routing
from delayq.coordination.splitting import SlotSplitter
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.queue import Queue, consume_plans
from delayq.queue.keys import Part, slot_keys
from delayq.queue.topic import Topic, TopicType
from delayq.service import api, overview
from delayq.service.brokers import default_routing
from tests.redis_memory import FULL, memory_for
from tests.routing_support import read_routing
from tests.service.conftest import NAMESPACE, TOPIC, Receiver, StartService

SLOTS = 4


def stored_on(url: str, slot: int, namespace: str = NAMESPACE) -> int:
    client = redis.Redis.from_url(url)
    try:
        key = slot_keys(Topic(TOPIC, namespace=namespace, slot_amount=SLOTS), slot).key(Part.STORE)
        return int(client.zcard(key))
    finally:
        client.close()


def test_first_routing_is_contiguous_ranges():
    assert default_routing(4, 2) == [0, 0, 1, 1]
    assert default_routing(4, 1) == [0, 0, 0, 0]


async def test_messages_live_on_their_slots_broker_and_are_leased_from_it(
    second_broker: RedisServer, redis_server: RedisServer, start_service: StartService
):
    urls = [redis_server.url, second_broker.url]
    running = await start_service(slot_amount=SLOTS, broker_urls=",".join(urls))
    messages = [{"id": f"b{i}", "delayMs": 0} for i in range(40)]
    answer = await running.client.post(
        f"{running.base}/messages/batch", json={"messages": messages}
    )
    slots = {r["id"]: r["slot"] for r in (await answer.json())["results"]}
    for slot in range(SLOTS):
        here, elsewhere = (urls[0], urls[1]) if slot < 2 else (urls[1], urls[0])
        assert stored_on(here, slot) == sum(1 for s in slots.values() if s == slot)
        assert stored_on(elsewhere, slot) == 0
    got = await (await running.client.get(f"{running.base}/messages/b7")).json()
    assert got["slot"] == slots["b7"]

    leased = (
        await (await running.client.post(f"{running.base}/leases", json={"max": 100})).json()
    )["leases"]
    assert sorted(m["id"] for m in leased) == sorted(slots)
    tokens = [m["token"] for m in leased]
    acked = await running.client.post(f"{running.base}/leases/ack", json={"tokens": tokens})
    assert acked.status == 200
    stats = await (await running.client.get(f"{running.base}/stats")).json()
    assert stats["scheduled"] + stats["prepared"] == 0


async def test_webhook_delivers_from_every_broker(
    second_broker: RedisServer,  # first: torn down after the service stops
    redis_server: RedisServer,
    start_service: StartService,
    receiver: Receiver,
):
    running = await start_service(
        slot_amount=SLOTS,
        broker_urls=f"{redis_server.url},{second_broker.url}",
        topic_type="webhook",
        webhook_url=receiver.url,
    )
    messages = [{"id": f"w{i}", "delayMs": i} for i in range(30)]
    await running.client.post(f"{running.base}/messages/batch", json={"messages": messages})
    await eventually(lambda: len(receiver.requests) == 30, 10, "30 deliveries")
    assert {json.loads(b)["id"] for b in receiver.bodies()} == {m["id"] for m in messages}
    assert stored_on(second_broker.url, 3) == 0


async def test_a_batch_answers_each_message_with_its_own_slots_refusal(
    second_broker: RedisServer, redis_server: RedisServer, start_service: StartService
):
    """Broker 0 refuses slot 0 as moving and stores slot 1 while broker 1 stores slot 2: the
    207 gives each message its own slot's answer, not the first error of its broker. (A full
    broker refuses every write function before it runs, moving slot or not.)"""
    urls = [redis_server.url, second_broker.url]
    running = await start_service(slot_amount=SLOTS, broker_urls=",".join(urls))
    topic = running.service.topic
    candidates = [f"p{i}" for i in range(200)]
    ids = {s: [i for i in candidates if topic.slot_of(i.encode()) == s][:2] for s in (0, 1, 2)}
    source = Queue.from_url(urls[0], topic)
    source.run(consume_plans.freeze(topic, 0))
    source.close()
    messages = [{"id": i, "delayMs": 60_000} for slot in (0, 1, 2) for i in ids[slot]]
    batch = {"messages": messages}
    answer = await running.client.post(f"{running.base}/messages/batch", json=batch)
    assert answer.status == 207
    results = {r["id"]: r for r in (await answer.json())["results"]}
    kinds = {
        slot: {results[i].get("error", results[i]["result"]).split(":")[0] for i in ids[slot]}
        for slot in (0, 1, 2)
    }
    assert kinds == {0: {"SlotMovingError"}, 1: {"created"}, 2: {"created"}}
    assert stored_on(second_broker.url, 2) == 2


async def test_a_batch_on_brokers_whose_replicas_lag_fails_only_their_messages(
    second_broker: RedisServer, redis_server: RedisServer, start_service: StartService
):
    """syncReplicas 1: broker 0 has a replica, broker 1 none. Broker 1's messages are written
    on its master but unconfirmed: each is reported `unknown` in a 207, broker 0's stored;
    not a 503 for the whole batch after broker 0 stored."""
    with RedisServer(extra_config={"replicaof": f"127.0.0.1 {redis_server.port}"}):
        admin = redis.Redis.from_url(redis_server.url)
        await eventually(
            lambda: admin.info("replication").get("slave0", {}).get("state") == "online",
            20.0,
            "the replica in sync",
        )
        admin.close()
        urls = [redis_server.url, second_broker.url]
        running = await start_service(
            slot_amount=SLOTS,
            broker_urls=",".join(urls),
            redis_sync_replicas=1,
            redis_sync_timeout_ms=1000,
        )
        topic = running.service.topic
        candidates = [f"r{i}" for i in range(100)]  # the routing: slots 0, 1 on broker 0
        on_0 = [i for i in candidates if topic.slot_of(i.encode()) < 2][:3]
        on_1 = [i for i in candidates if topic.slot_of(i.encode()) >= 2][:3]
        messages = [{"id": i, "delayMs": 60_000} for i in on_0 + on_1]
        answer = await running.client.post(
            f"{running.base}/messages/batch", json={"messages": messages}
        )
    assert answer.status == 207
    results = {r["id"]: r for r in (await answer.json())["results"]}
    assert {results[i]["result"] for i in on_0} == {"created"}
    assert {results[i]["result"] for i in on_1} == {"unknown"}
    assert {results[i]["error"].split(":")[0] for i in on_1} == {"ReplicationTimeoutError"}


@pytest.mark.slow
async def test_routing_is_read_from_zookeeper_when_the_operator_wrote_it(zookeeper_server: Any):
    from kazoo.client import KazooClient

    from delayq.coordination.layout import TopicPaths
    from delayq.coordination.routing import Routing

    topic = "routed"
    assert await read_routing(zookeeper_server.hosts, "shop", topic, 4, None) is None
    client = KazooClient(hosts=zookeeper_server.hosts)
    client.start()
    try:
        path = TopicPaths("shop", topic).routing
        client.create(path, Routing(4, 3, (2, 0, 1, 1)).to_json(), makepath=True)
    finally:
        client.stop()
        client.close()
    assert await read_routing(zookeeper_server.hosts, "shop", topic, 4, None) == [2, 0, 1, 1]
    assert await read_routing(zookeeper_server.hosts, "shop", topic, 8, None) is None  # other size


@pytest.fixture
def moving_topic(
    redis_server: RedisServer, second_broker: RedisServer, zookeeper_server: Any
) -> Iterator[tuple[str, list[str], SlotMover]]:
    """A namespace of its own with every slot routed to broker 0, and a mover for it."""
    namespace = f"mv-{uuid.uuid4().hex[:8]}"
    urls = [redis_server.url, second_broker.url]
    topic = Topic(TOPIC, namespace=namespace, slot_amount=SLOTS)
    zk = KazooClient(hosts=zookeeper_server.hosts)
    zk.start(timeout=10)
    paths = TopicPaths(namespace, TOPIC)
    zk.create(paths.routing, Routing(SLOTS, 2, (0,) * SLOTS).to_json(), makepath=True)
    queues = [Queue.from_url(url, topic) for url in urls]
    try:
        yield namespace, urls, SlotMover(zk, paths, queues)
    finally:
        zk.stop()
        zk.close()
        for queue in queues:
            queue.close()


def moving_waits(running: Any) -> float:
    labels = {"topic_namespace": running.service.topic.namespace, "topic": TOPIC}
    value = running.service.metrics.registry.get_sample_value(
        "delayq_slot_moving_waits_total", labels
    )
    return float(value or 0)


async def test_an_api_write_into_a_moving_slot_waits_for_the_switch(
    moving_topic: tuple[str, list[str], SlotMover],
    zookeeper_server: Any,
    start_service: StartService,
    monkeypatch: pytest.MonkeyPatch,
):
    """Refused with SLOT_MOVING while the slot is frozen, the call is run again when the
    routing watch sees the switch, and lands on the new broker; a slot that stays frozen
    longer than SLOT_MOVE_WAIT_S answers 503 SLOT_MOVING with Retry-After."""
    namespace, urls, mover = moving_topic
    running = await start_service(
        slot_amount=SLOTS,
        namespace=namespace,
        broker_urls=",".join(urls),
        zookeeper_connect=zookeeper_server.hosts,
    )
    topic = running.service.topic
    ids = [f"x{i}" for i in range(50) if topic.slot_of(f"x{i}".encode()) == 0]
    current = mover.step(*mover.start(0, 1))  # frozen
    assert current is not None

    monkeypatch.setattr(api, "SLOT_MOVE_WAIT_S", 0.2)
    refused = await running.client.post(
        f"{running.base}/messages", json={"id": ids[0], "delayMs": 0}
    )
    assert refused.status == 503
    assert (await refused.json())["error"].startswith("SLOT_MOVING")
    assert refused.headers["Retry-After"]
    monkeypatch.undo()

    waits = moving_waits(running)
    post = asyncio.create_task(
        running.client.post(f"{running.base}/messages", json={"id": ids[1], "delayMs": 0})
    )
    await eventually(lambda: moving_waits(running) > waits, 10.0, "the write refused once")
    await asyncio.to_thread(mover.move, 0, 1)
    answer = await post
    assert answer.status == 201, await answer.text()
    assert stored_on(urls[1], 0, namespace) == 1
    # the process follows the routing: the slot is consumed from broker 1 now
    leased = await running.client.post(f"{running.base}/leases", json={"max": 10})
    assert [m["id"] for m in (await leased.json())["leases"]] == [ids[1]]


async def test_a_batch_refused_on_one_broker_and_unconfirmed_on_the_other_is_a_207(
    second_broker: RedisServer, redis_server: RedisServer, start_service: StartService
):
    """syncReplicas 1 and no replica anywhere: broker 0 is full (its messages refused, nothing
    stored there), broker 1 writes its messages on its master unconfirmed. Something was
    written, so the answer is the per-message 207, not the plain 429 "nothing stored" that
    would have the client resend the whole batch (creating again what was delivered meanwhile)."""
    urls = [redis_server.url, second_broker.url]
    running = await start_service(
        slot_amount=SLOTS,
        broker_urls=",".join(urls),
        redis_sync_replicas=1,
        redis_sync_timeout_ms=100,
    )
    topic = running.service.topic
    candidates = [f"u{i}" for i in range(100)]  # the routing: slots 0, 1 on broker 0
    on_0 = [i for i in candidates if topic.slot_of(i.encode()) < 2][:3]
    on_1 = [i for i in candidates if topic.slot_of(i.encode()) >= 2][:3]
    messages = [{"id": i, "delayMs": 60_000} for i in on_0 + on_1]
    admin = redis.Redis.from_url(urls[0])
    with memory_for(admin, FULL):
        answer = await running.client.post(
            f"{running.base}/messages/batch", json={"messages": messages}
        )
    admin.close()
    assert answer.status == 207, await answer.text()
    results = {r["id"]: r for r in (await answer.json())["results"]}
    assert {results[i]["error"].split(":")[0] for i in on_0} == {"BrokerFullError"}
    assert {results[i]["result"] for i in on_0} == {"failed"}
    assert {results[i]["result"] for i in on_1} == {"unknown"}
    assert {results[i]["error"].split(":")[0] for i in on_1} == {"ReplicationTimeoutError"}
    assert stored_on(second_broker.url, 2) + stored_on(second_broker.url, 3) == 3


class Killed(Exception):
    """The splitter dies here."""


async def killed_after_switching_broker_0(
    mover: SlotMover, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A splitter of SLOTS -> 2 x SLOTS slots (routed 0, 0, 1, 1) dies in its freeze after
    switching broker 0's old slots, 0 and 1, to their halves, with 2 frozen (being switched)
    and 3 not yet."""
    splitter = SlotSplitter(mover.zk, mover.paths, mover.queues)
    current = splitter.start(2 * SLOTS)
    while current is not None and current[0].step is not Step.FREEZE:
        current = splitter.step(*current)
    assert current is not None
    thaw, thaws = migration.thaw_replicated, []

    def dies_at_its_third_thaw(*args: Any) -> None:
        thaws.append(args)
        if len(thaws) == 3:
            raise Killed
        thaw(*args)

    monkeypatch.setattr(splitting, "thaw_replicated", dies_at_its_third_thaw)
    with pytest.raises(Killed):
        await asyncio.to_thread(splitter.step, *current)
    splitter.release()


async def test_an_api_write_into_a_slot_a_doubling_switched_goes_to_its_half_at_once(
    moving_topic: tuple[str, list[str], SlotMover],
    zookeeper_server: Any,
    start_service: StartService,
    monkeypatch: pytest.MonkeyPatch,
):
    """A splitter dies in its freeze after switching the old slots of broker 0 (0 and 1) to
    their halves, with slot 2 frozen: the API writes, reads and cancels messages of slots 0
    and 1 in their halves (the next generation) at once, while slot 2 answers SLOT_MOVING
    (before: every old slot refused until the doubling was completed)."""
    namespace, urls, mover = moving_topic
    mover.zk.set(mover.paths.routing, Routing(SLOTS, 2, (0, 0, 1, 1)).to_json())
    running = await start_service(
        slot_amount=SLOTS,
        namespace=namespace,
        broker_urls=",".join(urls),
        zookeeper_connect=zookeeper_server.hosts,
    )
    topic = running.service.topic
    await killed_after_switching_broker_0(mover, monkeypatch)
    monkeypatch.setattr(api, "SLOT_MOVE_WAIT_S", 3.0)  # the routing watch wakes it sooner
    ids = {
        slot: next(f"h{i}" for i in range(100) if topic.slot_of(f"h{i}") == slot)
        for slot in range(SLOTS)
    }
    for slot in (0, 1):
        answer = await running.client.post(
            f"{running.base}/messages", json={"id": ids[slot], "delayMs": 600_000}
        )
        assert answer.status == 201, await answer.text()
        doubled = Topic(TOPIC, namespace=namespace, slot_amount=2 * SLOTS, slot_generation=1)
        assert (await answer.json())["slot"] == doubled.slot_of(ids[slot])
        got = await running.client.get(f"{running.base}/messages/{ids[slot]}")
        assert got.status == 200
        assert (await got.json())["state"] == "scheduled"
    monkeypatch.setattr(api, "SLOT_MOVE_WAIT_S", 0.2)
    refused = await running.client.post(
        f"{running.base}/messages", json={"id": ids[2], "delayMs": 600_000}
    )
    assert refused.status == 503
    assert (await refused.json())["error"].startswith("SLOT_MOVING")
    cancelled = await running.client.delete(f"{running.base}/messages/{ids[0]}")
    assert cancelled.status == 200, await cancelled.text()


async def test_the_dead_of_a_slot_a_doubling_switched_are_listed_redriven_and_purged_in_its_halves(
    moving_topic: tuple[str, list[str], SlotMover],
    zookeeper_server: Any,
    start_service: StartService,
    monkeypatch: pytest.MonkeyPatch,
):
    """Dead messages of slots 0 and 1, copied into their halves, which a splitter killed in
    its freeze switched: the dead page lists them from the halves (under their old slot
    numbers, so a redrive by slot is refused, never sent to the wrong slot), and a redrive or
    purge by id acts in the half at once (before: SLOT_MOVING from the frozen old slot, and
    the page listed the old slot's stale copy)."""
    namespace, urls, mover = moving_topic
    mover.zk.set(mover.paths.routing, Routing(SLOTS, 2, (0, 0, 1, 1)).to_json())
    running = await start_service(
        slot_amount=SLOTS,
        namespace=namespace,
        broker_urls=",".join(urls),
        zookeeper_connect=zookeeper_server.hosts,
        topic_type=TopicType.PULL,
    )
    topic = running.service.topic
    doubled = Topic(TOPIC, namespace=namespace, slot_amount=2 * SLOTS, slot_generation=1)
    # one id in each half of slots 0 and 1
    ids = sorted(
        {
            doubled.slot_of(i): i
            for i in (f"d{n}" for n in range(200))
            if topic.slot_of(i) in (0, 1)
        }.values()
    )
    assert len(ids) == 4
    stored = await running.client.post(
        f"{running.base}/messages/batch",
        json={"messages": [{"id": i, "delayMs": 0} for i in ids]},
    )
    assert stored.status == 200, await stored.text()
    tokens: list[str] = []

    async def all_leased() -> bool:
        leased = await running.client.post(f"{running.base}/leases", json={"max": 4})
        tokens.extend(m["token"] for m in (await leased.json())["leases"])
        return len(tokens) == 4

    await eventually(all_leased, 10, "the 4 messages leased")
    nacked = await running.client.post(
        f"{running.base}/leases/nack", json={"tokens": tokens, "dead": True, "reason": "poison"}
    )
    assert [r["result"] for r in (await nacked.json())["results"]] == ["dead"] * 4
    await killed_after_switching_broker_0(mover, monkeypatch)
    await eventually(
        lambda: running.service.brokers.doubled_slots == {0, 1}, 10, "the switch seen"
    )

    async def dead_listed() -> list[tuple[str, int]]:
        listed, cursor = [], ""
        while cursor is not None:  # pages of one: across both halves of each slot
            url = f"{running.base}/dead?count=1" + (f"&cursor={cursor}" if cursor else "")
            page = await (await running.client.get(url)).json()
            listed += [(m["id"], m["slot"]) for m in page["messages"]]
            cursor = page["nextCursor"]
        return sorted(listed)

    assert await dead_listed() == sorted((i, topic.slot_of(i)) for i in ids)
    monkeypatch.setattr(api, "SLOT_MOVE_WAIT_S", 0.2)
    redriven = await running.client.post(f"{running.base}/dead/redrive", json={"ids": ids[:2]})
    assert redriven.status == 200, await redriven.text()
    assert [r["result"] for r in (await redriven.json())["results"]] == ["redriven"] * 2
    purged = await running.client.post(f"{running.base}/dead/purge", json={"ids": ids[2:3]})
    assert [r["result"] for r in (await purged.json())["results"]] == ["purged"]
    assert await dead_listed() == [(ids[3], topic.slot_of(ids[3]))]
    for redriven_id in ids[:2]:
        got = await running.client.get(f"{running.base}/messages/{redriven_id}")
        assert (await got.json())["state"] == "scheduled"
    by_slot = {"ids": [{"id": ids[3], "slot": topic.slot_of(ids[3])}]}
    refused = await running.client.post(f"{running.base}/dead/redrive", json=by_slot)
    assert refused.status == 503  # its old slot, frozen: refused until the doubling ends


async def test_the_owner_of_a_slot_a_doubling_switched_delivers_from_its_halves_at_once(
    moving_topic: tuple[str, list[str], SlotMover],
    zookeeper_server: Any,
    start_service: StartService,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
):
    """A splitter killed in its freeze after switching old slots 0 and 1: their owner
    consumes their halves (generation 1) at once, so a message written there, and one copied
    there from the old slot, is delivered when due (before: nothing of theirs until the
    doubling was completed, past twice the session timeout); slot 2 stays frozen."""
    namespace, urls, mover = moving_topic
    mover.zk.set(mover.paths.routing, Routing(SLOTS, 2, (0, 0, 1, 1)).to_json())
    running = await start_service(
        slot_amount=SLOTS,
        namespace=namespace,
        broker_urls=",".join(urls),
        zookeeper_connect=zookeeper_server.hosts,
        topic_type="webhook",
        webhook_url=receiver.url,
    )
    topic = running.service.topic
    doubled = Topic(TOPIC, namespace=namespace, slot_amount=2 * SLOTS, slot_generation=1)
    halves = {doubled.slot_of(i): i for i in (f"h{n}" for n in range(200)) if topic.slot_of(i) < 2}
    copied, written = halves[0], halves[1 + SLOTS]  # lower half of 0, upper half of 1
    delay_ms = 2500  # due after the kill: delivered from its half
    stored = await running.client.post(
        f"{running.base}/messages", json={"id": copied, "delayMs": delay_ms}
    )
    assert stored.status == 201
    await killed_after_switching_broker_0(mover, monkeypatch)
    await eventually(lambda: running.service.brokers.doubled_slots == {0, 1}, 10, "the switch")
    now = {"id": written, "delayMs": 0}
    answer = await running.client.post(f"{running.base}/messages", json=now)
    assert answer.status == 201, await answer.text()
    assert (await answer.json())["slot"] == 1 + SLOTS
    delivered = await eventually(
        lambda: {json.loads(b)["id"] for b in receiver.bodies()} >= {copied, written} or None,
        delay_ms / 1000 + 5,
        "both delivered from the halves",
    )
    assert delivered
    halves_engine = running.service.halves
    assert halves_engine is not None
    assert halves_engine.owned_slots == [0, 1, SLOTS, 1 + SLOTS]


async def test_the_owner_of_a_slot_a_doubling_switched_leases_its_halves_at_once(
    moving_topic: tuple[str, list[str], SlotMover],
    zookeeper_server: Any,
    start_service: StartService,
    monkeypatch: pytest.MonkeyPatch,
):
    """Pull: a splitter killed in its freeze after switching old slots 0 and 1. A message
    written into a half, one copied there due later, and one leased from old slot 0 before
    the switch (rolled back by the halves' fence) are leased from the halves at once (before:
    not until the doubling was completed, past twice the session timeout). Their tokens name
    generation 1, so ack, nack, extend and the ack of the next lease act in the halves; the
    token of old slot 0 from before the switch is answered stale_epoch at once (its keys are
    frozen for good), not a 503 after waiting for the routing."""
    namespace, urls, mover = moving_topic
    mover.zk.set(mover.paths.routing, Routing(SLOTS, 2, (0, 0, 1, 1)).to_json())
    running = await start_service(
        slot_amount=SLOTS,
        namespace=namespace,
        broker_urls=",".join(urls),
        zookeeper_connect=zookeeper_server.hosts,
        topic_type=TopicType.PULL,
    )
    topic, tokens = running.service.topic, running.service.lease_tokens
    doubled = Topic(TOPIC, namespace=namespace, slot_amount=2 * SLOTS, slot_generation=1)
    halves = {doubled.slot_of(i): i for i in (f"h{n}" for n in range(200)) if topic.slot_of(i) < 2}
    before, copied, written = halves[SLOTS], halves[0], halves[1 + SLOTS]
    batch = [{"id": before, "delayMs": 0}, {"id": copied, "delayMs": 1500}]
    stored = await running.client.post(f"{running.base}/messages/batch", json={"messages": batch})
    assert stored.status == 200, await stored.text()
    answer = await running.client.post(f"{running.base}/leases", json={"waitMs": 5000})
    [old] = (await answer.json())["leases"]
    assert old["id"] == before
    await killed_after_switching_broker_0(mover, monkeypatch)
    await eventually(lambda: running.service.brokers.doubled_slots == {0, 1}, 10, "the switch")
    for action in ("ack", "nack", "extend"):  # a nack reads the attempt first: SLOT_MOVING
        started = time.monotonic()
        refused = await running.client.post(
            f"{running.base}/leases/{action}",
            json={"tokens": [old["token"]], "ackTimeoutMs": 1000},
        )
        assert refused.status == 409, (action, await refused.text())
        assert [r["result"] for r in (await refused.json())["results"]] == ["stale_epoch"]
        assert time.monotonic() - started < 2.0  # not after SLOT_MOVE_WAIT_S
    answer = await running.client.post(
        f"{running.base}/messages", json={"id": written, "delayMs": 0}
    )
    assert (await answer.json())["slot"] == 1 + SLOTS
    leased: dict[str, dict[str, Any]] = {}

    async def all_leased() -> bool:
        answer = await running.client.post(
            f"{running.base}/leases", json={"max": 10, "waitMs": 500}
        )
        leased.update({m["id"]: m for m in (await answer.json())["leases"]})
        return leased.keys() == {before, copied, written}

    await eventually(all_leased, 10, "the halves' messages leased")  # copied: due in 1.5 s
    assert {tokens.decode(m["token"], 0).generation for m in leased.values()} == {1}
    assert leased[before]["attempt"] == 2  # its lease of old slot 0 rolled back
    nacked = await running.client.post(  # its backoff read from its record in the half
        f"{running.base}/leases/nack", json={"tokens": [leased[written]["token"]]}
    )
    assert [r["result"] for r in (await nacked.json())["results"]] == ["retry_scheduled"]
    answer = await running.client.post(
        f"{running.base}/leases",
        json={"waitMs": 5000, "ack": [leased[before]["token"], leased[copied]["token"]]},
    )
    again = await answer.json()
    assert [r["result"] for r in again["acks"]] == ["acked", "acked"]
    assert [m["id"] for m in again["leases"]] == [written]
    token = again["leases"][0]["token"]
    extended = await running.client.post(
        f"{running.base}/leases/extend", json={"tokens": [token], "ackTimeoutMs": 60_000}
    )
    assert [r["result"] for r in (await extended.json())["results"]] == ["extended"]
    acked = await running.client.post(f"{running.base}/leases/ack", json={"tokens": [token]})
    assert [r["result"] for r in (await acked.json())["results"]] == ["acked"]
    assert running.service.halves is not None
    assert running.service.halves.owned_slots == [0, 1, SLOTS, 1 + SLOTS]


async def test_a_half_that_cannot_be_taken_over_is_reported_and_taken_once_it_can(
    moving_topic: tuple[str, list[str], SlotMover],
    zookeeper_server: Any,
    start_service: StartService,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
):
    """A service started after a splitter died with slots 0 and 1 switched, the lower half of
    0 frozen (as by a move): the other halves are consumed, that one is reported by `/readyz`
    as `g1/0` (the next generation's slot 0, not the old slot 0) and the metric, and taken
    over by the probe's retry once it thaws."""
    namespace, urls, mover = moving_topic
    mover.zk.set(mover.paths.routing, Routing(SLOTS, 2, (0, 0, 1, 1)).to_json())
    await killed_after_switching_broker_0(mover, monkeypatch)
    doubled = Topic(TOPIC, namespace=namespace, slot_amount=2 * SLOTS, slot_generation=1)
    half = Queue.from_url(urls[0], doubled)
    try:
        half.run(consume_plans.freeze(doubled, 0))
        running = await start_service(
            slot_amount=SLOTS,
            namespace=namespace,
            broker_urls=",".join(urls),
            zookeeper_connect=zookeeper_server.hosts,
            topic_type="webhook",
            webhook_url=receiver.url,
        )
        halves = running.service.halves
        assert halves is not None
        assert halves.owned_slots == [1, SLOTS, 1 + SLOTS]
        ready = await (await running.client.get("/readyz")).json()
        frozen_old = ["0", "1", "2"]  # old slots frozen, 0 and 1 switched
        assert list(ready["unconsumedSlots"]) == [*frozen_old, "g1/0"]
        assert ready["unconsumedSlots"]["g1/0"].startswith("moving: SLOT_MOVING")
        half.run(consume_plans.thaw(doubled, 0))

        async def only_old_slots_reported() -> bool:
            ready = await (await running.client.get("/readyz")).json()
            return list(ready["unconsumedSlots"]) == frozen_old

        # the half joins the owned slots inside the take-over and leaves the report right after
        # it: wait for the report, then check the take-over
        await eventually(only_old_slots_reported, 5, "g1/0 no longer reported")
        assert halves.owned_slots == [0, 1, SLOTS, 1 + SLOTS]
    finally:
        half.close()


async def test_the_depths_and_forecast_of_a_slot_a_doubling_switched_count_its_halves(
    moving_topic: tuple[str, list[str], SlotMover],
    zookeeper_server: Any,
    start_service: StartService,
    monkeypatch: pytest.MonkeyPatch,
):
    """A splitter killed in its freeze after switching old slots 0 and 1: their depths (the
    depth metric's and `/stats`' `Brokers.stats`), their views (`/overview`, `/slots`, the
    heat map) and the forecast count what their halves hold, the copied messages and those
    written there since, under the old slot numbers (before: the frozen old slots' stale
    copies, without what was written since)."""
    namespace, urls, mover = moving_topic
    mover.zk.set(mover.paths.routing, Routing(SLOTS, 2, (0, 0, 1, 1)).to_json())
    running = await start_service(
        slot_amount=SLOTS,
        namespace=namespace,
        broker_urls=",".join(urls),
        zookeeper_connect=zookeeper_server.hosts,
    )
    topic = running.service.topic
    names = (f"f{i}" for i in range(1_000))
    ids: dict[int, list[str]] = {slot: [] for slot in range(SLOTS)}
    for name in names:
        if len(ids[topic.slot_of(name)]) < 2:
            ids[topic.slot_of(name)].append(name)
    for slot_ids in ids.values():  # one before the doubling: copied into the halves
        stored = await running.client.post(
            f"{running.base}/messages", json={"id": slot_ids[0], "delayMs": 600_000}
        )
        assert stored.status == 201, await stored.text()
    await killed_after_switching_broker_0(mover, monkeypatch)
    await eventually(lambda: running.service.brokers.doubled_slots == {0, 1}, 10, "the switch")
    for slot in (0, 1):  # one into the halves since, due within the forecast's minute
        stored = await running.client.post(
            f"{running.base}/messages", json={"id": ids[slot][1], "delayMs": 30_000}
        )
        assert stored.status == 201, await stored.text()
    expected = {0: 2, 1: 2, 2: 1, 3: 1}
    depths = await running.service.brokers.stats()
    assert {s.slot: s.scheduled for s in depths.slots} == expected
    views = await overview.read_slots(running.service)
    assert {v.slot: v.scheduled for v in views} == expected
    assert [v.due_in[0] for v in views] == [1, 1, 0, 0]  # due within the next minute
    assert [v.due_in[1] for v in views] == [1, 1, 1, 1]  # then within the hour
    forecast = await overview.TopicViews(running.service).forecast.get()
    assert forecast[0]["1m"] == 2
