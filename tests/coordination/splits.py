"""What the tests of doubling a topic's slots share: a topic of 4 slots on two real
redis-servers (`Cluster`, the `cluster` fixture of conftest.py), filling and churning every part
of its slots, and checking that each old slot's parts are exactly the union of its halves'.

One module for the three test files of a doubling (test_split*.py), so each states its own
concern and none copies another's helpers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, cast

import redis

from delayq.coordination.splitting import SlotSplitter, Split
from delayq.local.waiting import wait_until
from delayq.queue import Queue, Recurrence, Schedule, Topic
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import Message
from delayq.queue.record_buckets import record_pages
from delayq.queue.schedules import occurrence_id
from delayq.queue.slot_split import PART_RULES, Rule
from delayq.queue.store_buckets import store_pages
from delayq.queue.topic import slot_of

from .brokers import TwoBrokers

NAMESPACE = "splits"
SLOTS = 4
ROUTING = (0, 0, 1, 1)
PER_MESSAGE = [part for part, rule in PART_RULES.items() if rule is Rule.BY_MESSAGE]
PER_SCHEDULE = [part for part, rule in PART_RULES.items() if rule is Rule.BY_SCHEDULE]


@dataclass
class Cluster(TwoBrokers):
    basis: dict[str, str] = field(default_factory=dict)  # message id -> its slot basis
    schedules: set[str] = field(default_factory=set)
    held: list[Message] = field(default_factory=list)  # leases of the old owners, still held

    def splitter(self) -> SlotSplitter:
        """A splitter of its own (its own ZooKeeper session), as a fresh run of the command."""
        return SlotSplitter(self.session(), self.paths, self.queues)

    def queue_of(self, topic: Topic, slot: int) -> Queue:
        """A client of slot `slot`'s broker under `topic` (its amount and generation)."""
        return self.login(ROUTING[slot % SLOTS], topic)


def broker_queue(cluster: Cluster, slot: int) -> Queue:
    return cluster.queues[ROUTING[slot]]


def fill(cluster: Cluster, count: int = 60) -> None:
    """Every slot with something in every part: scheduled (by id, by a custom basis, with a
    priority),
    leased, dead with a reason, acked and cancelled (outcomes), recurring schedules (their
    occurrences waiting, one claimed and its top-up owed), the journal."""
    topic = cluster.topic
    for i in range(count):
        message_id = f"m{i}"
        custom = i % 4 == 3
        basis = f"basis-{i}" if custom else message_id
        slot = topic.slot_of(basis)
        broker_queue(cluster, slot).schedule(
            message_id,
            b"p%d" % i,
            delay_ms=0 if i % 3 else 600_000,
            slot_basis=basis if custom else None,
            priority=0 if i % 3 else 1 + i % 9,  # the waiting ones: the priority index
        )
        cluster.basis[message_id] = basis
    for i in range(8):
        schedule_id = f"s{i}"
        slot = topic.slot_of(schedule_id)
        result = broker_queue(cluster, slot).put_schedule(
            Schedule(schedule_id, Recurrence(every_ms=1000), payload="s")
        )
        cluster.basis[occurrence_id(schedule_id, result.first_due_ms)] = schedule_id
        cluster.schedules.add(schedule_id)
    for slot in topic.slots:
        queue = broker_queue(cluster, slot)
        epoch = queue.take_over(slot)
        leased = list(queue.claim(slot, epoch, max_count=6, ack_timeout_ms=600_000).messages)
        for message in leased[:2]:
            queue.ack(message.lease)
        for message in leased[2:4]:
            queue.nack(message.lease, dead=True, reason="broken")
        for message in leased:
            cluster.basis.setdefault(message.id, message.id.rpartition("@")[0] or message.id)
        cluster.held.extend(leased[4:])
    claim_an_occurrence(cluster, "s0")
    for i in range(0, count, 7):  # cancelled: outcomes
        message_id = f"m{i}"
        basis = cluster.basis[message_id]
        broker_queue(cluster, topic.slot_of(basis)).cancel(message_id, basis)


def churn(cluster: Cluster, tag: str) -> None:
    """Changes in every old slot, as its writers and its owner make them while it is not
    frozen: messages scheduled (by id, by a custom basis; due now, later), cancelled,
    rescheduled, claimed (each slot delivers one at least), acked, dead."""
    topic = cluster.topic
    for slot in topic.slots:
        queue = broker_queue(cluster, slot)
        names = (f"{tag}{slot}-{i}" for i in range(100_000))
        landing = [name for name in names if topic.slot_of(name) == slot][:5]
        for i, message_id in enumerate(landing[:4]):
            custom = i == 3
            basis = landing[4] if custom else message_id  # the custom basis lands here too
            due_now = i % 2 == 1
            queue.schedule(
                message_id,
                b"c",
                delay_ms=0 if due_now else 600_000,
                slot_basis=basis if custom else None,
                priority=i,
            )
            cluster.basis[message_id] = basis
        queue.cancel(landing[0])
        queue.reschedule(landing[2], delay_ms=900_000)
        epoch = queue.take_over(slot)
        leased = queue.claim(slot, epoch, max_count=3, ack_timeout_ms=600_000).messages
        assert leased, f"slot {slot} delivers"
        queue.ack(leased[0].lease)
        for message in leased[1:2]:
            queue.nack(message.lease, dead=True, reason="churned")


def claim_an_occurrence(cluster: Cluster, schedule_id: str) -> None:
    """Claim the schedule's first occurrence once due (its top-up is then owed: `topup`)."""
    slot = cluster.topic.slot_of(schedule_id)
    queue = broker_queue(cluster, slot)
    epoch = queue.take_over(slot)

    def claimed() -> bool:
        leased = queue.claim(slot, epoch, max_count=100, ack_timeout_ms=600_000).messages
        for message in leased:
            cluster.basis.setdefault(message.id, message.id.rpartition("@")[0] or message.id)
        cluster.held.extend(leased)
        return any(message.id.startswith(f"{schedule_id}@") for message in leased)

    wait_until(claimed, 10.0, "an occurrence claimed")


def read_part(client: redis.Redis, key: str) -> Any:
    kind = str(client.type(key), "ascii")  # type: ignore[arg-type]
    if kind == "zset":
        return dict(cast("list[tuple[bytes, float]]", client.zrange(key, 0, -1, withscores=True)))
    if kind == "hash":
        return client.hgetall(key)
    if kind == "string":
        return client.get(key)
    if kind == "list":
        return client.lrange(key, 0, -1)
    if kind == "stream":
        return client.xrange(key)
    return None


def snapshot(cluster: Cluster, topic: Topic, slot: int) -> dict[Part, Any]:
    """The slot's parts; its records and waiting messages wherever they are kept
    (`record_buckets.py`, `store_buckets.py`), each part as one."""
    client = cluster.admins[ROUTING[slot % SLOTS]]
    keys = slot_keys(topic, slot)
    layout = (Part.BUCKETS, Part.STORE_BUCKETS, Part.HEADS)
    found = {part: read_part(client, keys.key(part)) for part in Part if part not in layout}
    found[Part.MSG] = dict(pair for page in record_pages(client, keys) for pair in page) or None
    found[Part.STORE] = dict(pair for page in store_pages(client, keys) for pair in page) or None
    return {part: value for part, value in found.items() if value is not None}


def doubled(topic: Topic) -> Topic:
    return replace(topic, slot_amount=2 * SLOTS, slot_generation=1)


def expected_half(cluster: Cluster, member: bytes) -> int:
    """By the message's slot basis: its custom one (recorded), its schedule's id for an
    occurrence, else its id."""
    text = member.decode()
    schedule_id, _, due = text.rpartition("@")
    if schedule_id in cluster.schedules and due.isdigit():  # an occurrence, by its schedule
        return slot_of(schedule_id, 2 * SLOTS)
    return slot_of(cluster.basis.get(text, text), 2 * SLOTS)


def assert_split_exactly(cluster: Cluster, before: dict[int, dict[Part, Any]]) -> None:
    """Each old slot's parts are the union of its two halves', each member in its half."""
    new = doubled(cluster.topic)
    for old_slot, parts in before.items():
        halves = {s: snapshot(cluster, new, s) for s in (old_slot, old_slot + SLOTS)}
        for part in PER_MESSAGE + PER_SCHEDULE:
            merged: dict[bytes, Any] = {}
            for half_slot, half in halves.items():
                for member, value in half.get(part, {}).items():
                    if part in PER_SCHEDULE:
                        assert slot_of(member, 2 * SLOTS) == half_slot, (part, member)
                    else:
                        assert expected_half(cluster, member) == half_slot, (part, member)
                    merged[member] = value
            assert merged == parts.get(part, {}), (old_slot, part)
        lower, upper = halves[old_slot], halves[old_slot + SLOTS]
        assert lower.get(Part.JOURNAL) == parts.get(Part.JOURNAL)
        assert Part.JOURNAL not in upper
        for half in (lower, upper):
            assert half.get(Part.LEASES) == parts.get(Part.LEASES)
            frozen = parts[Part.EPOCH]
            assert frozen.startswith(b"moving:")
            thawed = frozen.removeprefix(b"moving:")
            assert half.get(Part.EPOCH) == (None if thawed == b"0" else thawed)
            assert half[Part.WAKE] == [b"1"]


def frozen_before(cluster: Cluster) -> dict[int, dict[Part, Any]]:
    """Every old slot as the split reads it (after its freeze, which changes only epochs)."""
    found = {}
    for slot in cluster.topic.slots:
        parts = snapshot(cluster, cluster.topic, slot)
        epoch = parts.get(Part.EPOCH, b"0")
        parts[Part.EPOCH] = epoch if epoch.startswith(b"moving:") else b"moving:" + epoch
        found[slot] = parts
    return found


def basis_in(topic: Topic, slot: int) -> str:
    """A slot basis that lands in `slot` of `topic`."""
    return next(f"b{i}" for i in range(100_000) if topic.slot_of(f"b{i}") == slot)


def run_steps(splitter: SlotSplitter, count: int) -> tuple[Split, int]:
    """Record a doubling and do `count` steps of it (each slot of the copy is one); the
    splitter holds the lock."""
    current = splitter.start(2 * SLOTS)
    for _ in range(count):
        assert current is not None
        current = splitter.step(*current)
    assert current is not None
    return current


def old_frozen(cluster: Cluster) -> list[int]:
    """The old slots whose epoch is frozen on their broker."""
    return [
        slot
        for slot in cluster.topic.slots
        if (snapshot(cluster, cluster.topic, slot).get(Part.EPOCH) or b"").startswith(b"moving:")
    ]
