"""Doubling a topic's slots 4 -> 8 on two real redis-servers, recorded in a real ZooKeeper
(`delayq.coordination.splitting`, `queue.slot_split`, `delayq routing split`): every part of
every slot divided exactly, stale writers of either slot amount refused, and a splitter stopped
before any step (or any slot of its copy) completed by the next run or rolled back."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest
import redis
from kazoo.client import KazooClient

from delayq.cli import main
from delayq.coordination import migration, splitting
from delayq.coordination.layout import TopicPaths
from delayq.coordination.migration import MoveError, SlotMover, Step
from delayq.coordination.routed_queue import RoutedQueue
from delayq.coordination.routing import Routing
from delayq.coordination.routing_watch import ZkConnection
from delayq.coordination.splitting import SlotSplitter, Split, SplitLocked
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue import (
    Queue,
    Recurrence,
    Schedule,
    SlotMovingError,
    StaleEpochError,
    Topic,
    consume_plans,
)
from delayq.queue.codes import Code
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import Message, ScheduleRequest, State
from delayq.queue.schedules import occurrence_id
from delayq.queue.slot_split import PART_RULES, Rule
from delayq.queue.topic import slot_of

from .conftest import TwoBrokers, two_brokers

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


@pytest.fixture
def cluster(
    redis_server: RedisServer, second_broker: RedisServer, zookeeper_server: ZooKeeperServer
) -> Iterator[Cluster]:
    servers = (redis_server, second_broker)
    with two_brokers(Cluster, servers, zookeeper_server, NAMESPACE, "s", ROUTING) as built:
        yield built


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
    client = cluster.admins[ROUTING[slot % SLOTS]]
    keys = slot_keys(topic, slot)
    found = {part: read_part(client, keys.key(part)) for part in Part}
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


def test_a_doubling_splits_every_part_exactly_and_refuses_stale_writers(cluster: Cluster):
    fill(cluster)
    before = frozen_before(cluster)
    assert all(set(parts) >= set(PER_MESSAGE) | {Part.JOURNAL} for parts in before.values())
    assert any(Part.SCHEDULES in parts and Part.TOPUP in parts for parts in before.values())
    assert cluster.held

    done = cluster.splitter().split(2 * SLOTS)

    assert done == Split(SLOTS, 0, ROUTING, Step.CLEAN, SLOTS)
    assert cluster.routing() == Routing(2 * SLOTS, 2, ROUTING + ROUTING, 1)
    assert not cluster.zk.exists(cluster.paths.split)
    assert_split_exactly(cluster, before)
    # the old generation is tombstones only, which refuse a writer of either stale amount:
    # N slots (its routing watch has not fired yet) or 2N misconfigured at the old generation
    stale_doubled = replace(cluster.topic, slot_amount=2 * SLOTS)
    for slot in range(2 * SLOTS):
        for admin in cluster.admins:
            keys = slot_keys(stale_doubled, slot)
            assert admin.keys(keys.key(Part.EPOCH).replace(":epoch", ":*")) == [
                keys.key(Part.EPOCH).encode()
            ]
        writers = [Queue(admin, stale_doubled) for admin in cluster.admins]  # any routing
        if slot < SLOTS:
            assert set(snapshot(cluster, cluster.topic, slot)) == {Part.EPOCH}
            writers.append(cluster.queue_of(cluster.topic, slot))  # its (old) routing
        for queue in writers:
            with pytest.raises(SlotMovingError, match=r"^SLOT_MOVING"):
                queue.schedule("late", b"p", delay_ms=0, slot_basis=basis_in(queue.topic, slot))
    # every message is found by (its slot basis, its id) under the new amount
    new = doubled(cluster.topic)
    for message_id, basis in cluster.basis.items():
        info = cluster.queue_of(new, new.slot_of(basis)).get(message_id, basis)
        assert info.state is not State.ABSENT, message_id
    # the new owners fence above the old epochs: the old leases are stale everywhere
    for message in cluster.held:
        queue = cluster.queue_of(new, new.slot_of(cluster.basis[message.id]))
        with pytest.raises(StaleEpochError):
            broker_queue(cluster, message.slot).ack(message.lease)
        assert queue.take_over(new.slot_of(cluster.basis[message.id])) > message.epoch
    # and the new slots take writes
    for slot in range(2 * SLOTS):
        cluster.queue_of(new, slot).schedule(
            "after", b"p", delay_ms=0, slot_basis=basis_in(new, slot)
        )


def test_a_doubling_places_each_message_by_its_custom_slot_basis(cluster: Cluster):
    """Scheduled, leased, dead, acked and cancelled messages whose custom basis lands in the
    upper half and whose id does not: after the doubling get by (basis, id) finds each, a
    create-only resend answers EXISTS (ALREADY_DONE for a finished one: its outcome moved
    with its basis), not a second copy in the other half, and cancel finds the live ones.
    Before the basis was recorded they all stayed in the lower half."""
    topic, new = cluster.topic, doubled(cluster.topic)
    states = (State.SCHEDULED, State.PREPARED, State.DEAD, State.DONE, State.CANCELLED)
    expected: dict[str, tuple[str, State]] = {}  # id -> (basis, state after the doubling)
    for slot in topic.slots:
        queue = broker_queue(cluster, slot)
        bases = (f"b{i}" for i in range(10_000) if slot_of(f"b{i}", 2 * SLOTS) == slot + SLOTS)
        ids = (f"c{i}" for i in range(10_000) if slot_of(f"c{i}", 2 * SLOTS) != slot + SLOTS)
        for state in states:
            message_id, basis = next(ids), next(bases)
            delay_ms = 600_000 if state in (State.SCHEDULED, State.CANCELLED) else 0
            queue.schedule(message_id, b"p", delay_ms=delay_ms, slot_basis=basis)
            expected[message_id] = (basis, state)
            if state is State.CANCELLED:
                queue.cancel(message_id, basis)
        leased = queue.claim(slot, queue.take_over(slot), max_count=10, ack_timeout_ms=600_000)
        for message in leased.messages:
            if expected[message.id][1] is State.DEAD:
                queue.nack(message.lease, dead=True, reason="broken")
            elif expected[message.id][1] is State.DONE:
                queue.ack(message.lease)

    cluster.splitter().split(2 * SLOTS)

    for message_id, (basis, state) in expected.items():
        slot = new.slot_of(basis)
        queue = cluster.queue_of(new, slot)
        bases_key = slot_keys(new, slot).key(Part.BASIS)
        assert cluster.admins[ROUTING[slot % SLOTS]].hget(bases_key, message_id) == basis.encode()
        assert queue.get(message_id, basis).state is state, message_id
        resent = queue.schedule(message_id, b"again", delay_ms=0, slot_basis=basis)
        assert resent.code is (Code.ALREADY_DONE if state.is_finished else Code.EXISTS), message_id
        if not state.is_finished:
            assert queue.cancel(message_id, basis).code is Code.CANCELLED, message_id


def run_steps(splitter: SlotSplitter, count: int) -> tuple[Split, int]:
    """Record a doubling and do `count` steps of it (each slot of the copy is one); the
    splitter holds the lock."""
    current = splitter.start(2 * SLOTS)
    for _ in range(count):
        assert current is not None
        current = splitter.step(*current)
    assert current is not None
    return current


# the copy of each of the 4 slots, its rounds, freeze (and catch-up), switch, clean
ALL_STEPS = 1 + SLOTS + 1 + 1 + 1


@pytest.mark.parametrize("steps_done", range(ALL_STEPS))
def test_a_splitter_stopped_before_any_step_is_completed_by_the_next_run(
    cluster: Cluster, steps_done: int
):
    fill(cluster)
    before = frozen_before(cluster)
    first = cluster.splitter()
    split, _ = run_steps(first, steps_done)
    first.zk.stop()  # killed: its lock goes with its session
    assert cluster.splitter().state() == split
    assert cluster.splitter().split(2 * SLOTS) == replace(
        split, step=Step.CLEAN, copied_slots=SLOTS
    )
    assert cluster.routing() == Routing(2 * SLOTS, 2, ROUTING + ROUTING, 1)
    assert_split_exactly(cluster, before)


@pytest.mark.parametrize("steps_done", [1, 2, 1 + SLOTS, 2 + SLOTS])
def test_a_step_repeated_after_a_crash_before_its_record_changes_nothing(
    cluster: Cluster, steps_done: int
):
    """A crash between doing a step and recording what follows: the next run does it again
    (a slot's split deletes its halves first)."""
    fill(cluster)
    before = frozen_before(cluster)
    splitter = cluster.splitter()
    split, _ = run_steps(splitter, steps_done)
    stat = cluster.zk.set(cluster.paths.split, split.encode())
    splitter.step(split, stat.version)  # done, then "crashed": the record says it again
    stat = cluster.zk.set(cluster.paths.split, split.encode())
    assert splitter.split(2 * SLOTS) is not None
    assert_split_exactly(cluster, before)


@pytest.mark.parametrize("steps_done", range(ALL_STEPS - 2))
def test_a_doubling_rolled_back_before_its_switch_leaves_the_slots_as_they_were(
    cluster: Cluster, steps_done: int
):
    fill(cluster)
    before = {slot: snapshot(cluster, cluster.topic, slot) for slot in cluster.topic.slots}
    splitter = cluster.splitter()
    run_steps(splitter, steps_done)
    splitter.zk.stop()
    assert cluster.splitter().abort().to_amount == 2 * SLOTS
    for slot in cluster.topic.slots:
        assert snapshot(cluster, cluster.topic, slot) == before[slot]
    for admin in cluster.admins:
        assert admin.keys(f"dq:{{{NAMESPACE}/{cluster.topic.name}/g1/*") == []
    assert cluster.routing() == Routing(SLOTS, 2, ROUTING)
    assert not cluster.zk.exists(cluster.paths.split)
    for slot in cluster.topic.slots:  # takes writes again
        broker_queue(cluster, slot).schedule(
            "after", b"p", delay_ms=0, slot_basis=basis_in(cluster.topic, slot)
        )


def old_frozen(cluster: Cluster) -> list[int]:
    """The old slots whose epoch is frozen on their broker."""
    return [
        slot
        for slot in cluster.topic.slots
        if (snapshot(cluster, cluster.topic, slot).get(Part.EPOCH) or b"").startswith(b"moving:")
    ]


@pytest.mark.parametrize("steps_done", [1, SLOTS // 2, SLOTS, SLOTS + 1])
def test_a_splitter_killed_in_its_copy_leaves_every_old_slot_taking_writes_and_delivering(
    cluster: Cluster, steps_done: int
):
    """Killed after 1, 2 or 4 slots copied, or after the copy's rounds: no old slot is frozen
    (the copy freezes none), each takes writes and delivers; the next run copies again what
    changed meanwhile, and every part of every slot ends up in its half exactly."""
    fill(cluster)
    first = cluster.splitter()
    split, _ = run_steps(first, steps_done)
    first.zk.stop()  # killed: its lock goes with its session
    assert split.step is (Step.COPY if steps_done <= SLOTS else Step.FREEZE)
    assert old_frozen(cluster) == []
    churn(cluster, "k")
    before = frozen_before(cluster)
    assert cluster.splitter().split(2 * SLOTS) is not None
    assert cluster.routing() == Routing(2 * SLOTS, 2, ROUTING + ROUTING, 1)
    assert_split_exactly(cluster, before)


class Killed(Exception):
    """The splitter dies here (its session is then stopped: its lock goes)."""


@pytest.mark.parametrize("record", ["kept", "lost"])
def test_a_splitter_killed_in_its_freeze_leaves_one_slot_refusing_writes(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, record: str
):
    """Killed while it catches up old slot 1, slot 0 listed: only the slot it was catching up
    refuses a routed write; the others' writes go to their halves (slot 0) or their old slots
    (2 and 3, not frozen yet) at once (before: a batch of up to 4 slots of a broker refused
    them, and before that every old slot, until the doubling was completed). The rerun
    completes it exactly, without catching up a switched slot again: what was written into
    its halves meanwhile stays. Also when the `split` node
    was lost (ZooKeeper's data lost, the routing published again from status.routing with its
    doubledSlots): the rerun records it again at `freeze` (before: it started a new doubling,
    whose copy replaced the switched slots' halves with their frozen old slots)."""
    fill(cluster)
    first = cluster.splitter()
    split, version = run_steps(first, SLOTS + 1)
    assert split.step is Step.FREEZE
    churn(cluster, "k")  # after the rounds: only the catch-up copies these
    before = frozen_before(cluster)
    thaws: list[object] = []
    thaw = migration.thaw_replicated

    def dies_at_its_second_thaw(*args: Any) -> None:
        thaws.append(args)
        if len(thaws) == 2:
            raise Killed
        thaw(*args)

    monkeypatch.setattr(splitting, "thaw_replicated", dies_at_its_second_thaw)
    with pytest.raises(Killed):
        first.step(split, version)
    first.zk.stop()  # killed
    monkeypatch.undo()
    user, password = f"{NAMESPACE}.{cluster.topic.name}", "engine-secret"
    urls = [server.url for server in cluster.servers]
    client = RoutedQueue.connect(
        urls,
        cluster.topic,
        zookeeper=ZkConnection(cluster.hosts),
        move_wait_ms=300,
        username=user,
        password=password,
    )
    written: list[tuple[int, str, str]] = []
    refused: list[int] = []
    try:
        for slot in cluster.topic.slots:
            message_id = f"after-kill-{slot}"
            basis = basis_in(cluster.topic, slot)
            try:
                client.schedule(message_id, b"a", delay_ms=600_000, slot_basis=basis)
                written.append((slot, message_id, basis))
            except SlotMovingError:
                refused.append(slot)
    finally:
        client.close()
    assert refused == [1]
    if record == "lost":
        cluster.zk.delete(cluster.paths.split)
    with pytest.raises(MoveError, match=r"slots \[0\] are switched .* finish the doubling"):
        cluster.splitter().abort()  # their halves take writes: never dropped
    assert cluster.splitter().split(2 * SLOTS) is not None
    assert cluster.routing() == Routing(2 * SLOTS, 2, ROUTING + ROUTING, 1)
    assert_split_exactly(cluster, {1: before[1]})  # 2 and 3 took writes since: below
    new = doubled(cluster.topic)
    for slot, message_id, basis in written:
        found = cluster.login(ROUTING[slot], new).get(message_id, basis)
        assert found.state is State.SCHEDULED
    for slot in (0,):  # switched before the kill: every message of the old slot, in a half
        halves = [snapshot(cluster, new, half) for half in (slot, slot + SLOTS)]
        stored = {m for half in halves for m in half.get(Part.STORE, {})}
        assert set(before[slot].get(Part.STORE, {})) <= stored


@dataclass
class RoundTrips:
    """Round trips to Redis (one per command or pipeline sent) and ZooKeeper requests."""

    redis: int = 0
    zookeeper: int = 0


def freeze_round_trips(
    server: RedisServer, zookeeper: ZooKeeperServer, slots: int, monkeypatch: pytest.MonkeyPatch
) -> RoundTrips:
    """Double a one-broker topic of `slots` slots, each holding a message and, after the copy's
    rounds, a change for the catch-up; the round trips of its freeze step (the time its slots
    refuse writes), which must leave each change in its new slot."""
    topic = Topic(f"rt{slots}", namespace=NAMESPACE, slot_amount=slots)
    queue = Queue.from_url(server.url, topic)
    zk = KazooClient(hosts=zookeeper.hosts)
    zk.start(timeout=30)
    counted = RoundTrips()
    try:
        ids = {slot: [basis_in(topic, slot)] for slot in topic.slots}
        for names in ids.values():
            queue.schedule(names[0], b"x", delay_ms=600_000)
        splitter = SlotSplitter(zk, TopicPaths(NAMESPACE, topic.name), [queue])
        current = splitter.start(2 * slots)
        while current is not None and current[0].step is Step.COPY:
            current = splitter.step(*current)
        assert current is not None
        for slot, names in ids.items():  # changed after the rounds: the catch-up copies these
            later = next(f"c{i}" for i in range(100_000) if topic.slot_of(f"c{i}") == slot)
            queue.schedule(later, b"y", delay_ms=600_000)
            names.append(later)
        send = redis.connection.AbstractConnection.send_packed_command
        zk_get = zk.get

        def counting_send(connection: Any, *args: Any, **kwargs: Any) -> None:
            counted.redis += 1
            send(connection, *args, **kwargs)

        def counting_get(*args: Any, **kwargs: Any) -> Any:
            counted.zookeeper += 1
            return zk_get(*args, **kwargs)

        with monkeypatch.context() as patched:
            patched.setattr(
                redis.connection.AbstractConnection, "send_packed_command", counting_send
            )
            patched.setattr(zk, "get", counting_get)
            current = splitter.step(*current)
        assert current is not None
        assert current[0].step is Step.SWITCH
        splitter.release()
        new = replace(topic, slot_amount=2 * slots, slot_generation=1)
        doubled_queue = Queue(queue.redis, new)
        for names in ids.values():
            for name in names:
                assert doubled_queue.get(name).state is State.SCHEDULED, name
    finally:
        zk.stop()
        zk.close()
        queue.close()
    return counted


def test_each_slot_is_frozen_for_a_few_round_trips_whatever_the_slot_amount(
    redis_server: RedisServer, zookeeper_server: ZooKeeperServer, monkeypatch: pytest.MonkeyPatch
):
    """A slot's write pause is its own: frozen, caught up, thawed and listed in the routing
    one after the other, in a few pipelines and ZooKeeper calls, the same for every slot
    whatever the slot amount (its listing is written on the version the previous one wrote:
    no read of the routing per slot)."""
    one = freeze_round_trips(redis_server, zookeeper_server, 1, monkeypatch)
    two = freeze_round_trips(redis_server, zookeeper_server, 2, monkeypatch)
    many = freeze_round_trips(redis_server, zookeeper_server, 64, monkeypatch)
    slot = RoundTrips(two.redis - one.redis, two.zookeeper - one.zookeeper)
    assert slot.redis <= 10
    assert slot.zookeeper <= 3  # the lock's checks (reads) before its three writes
    assert many.redis - one.redis == 63 * slot.redis
    assert many.zookeeper - one.zookeeper == 63 * slot.zookeeper


def test_resume_frozen_completes_only_a_stopped_doubling_whose_freeze_began(cluster: Cluster):
    """What the frozen slots' owners run (service/stopped_moves.py): no doubling started, none
    taken from a splitter holding the lock, none still copying (it freezes nothing); one whose
    splitter stopped in its freeze (half the old slots frozen) completed exactly."""
    fill(cluster)
    assert cluster.splitter().resume_frozen() is None
    assert not cluster.zk.exists(cluster.paths.split)
    first = cluster.splitter()
    run_steps(first, 1)  # one slot copied, the lock held
    with pytest.raises(SplitLocked):
        cluster.splitter().resume_frozen()
    first.zk.stop()  # killed in its copy
    assert cluster.splitter().resume_frozen() is None
    assert cluster.splitter().state() == Split(SLOTS, 0, ROUTING, Step.COPY, 1)
    second = cluster.splitter()
    split, _ = run_steps(second, SLOTS)  # the other slots copied, the rounds
    assert split.step is Step.FREEZE
    churn(cluster, "r")  # after the rounds: only the catch-up copies these
    before = frozen_before(cluster)
    old, _ = second._topics(split)
    for slot in range(SLOTS // 2):
        second.queues[split.brokers[slot]].run(consume_plans.freeze(old, slot))
    second.zk.stop()  # killed in its freeze
    assert old_frozen(cluster) == list(range(SLOTS // 2))
    assert cluster.splitter().resume_frozen() == replace(split, step=Step.CLEAN)
    assert cluster.routing() == Routing(2 * SLOTS, 2, ROUTING + ROUTING, 1)
    assert_split_exactly(cluster, before)
    assert cluster.splitter().resume_frozen() is None


def test_what_changes_while_the_slots_are_copied_is_copied_again(cluster: Cluster):
    """A writer changes every old slot while each is scanned and copied, and again after the
    copy's rounds (seen by the catch-up under the freeze only): the halves are exact."""
    fill(cluster)
    splitter = cluster.splitter()
    stop = threading.Event()
    churned: list[int] = []

    def write() -> None:
        while not stop.is_set():
            churn(cluster, f"w{len(churned)}-")
            churned.append(1)

    writer = threading.Thread(target=write)
    current = splitter.start(2 * SLOTS)
    writer.start()
    try:
        wait_until(lambda: churned, 10.0, "a writer under way")
        while current is not None and current[0].step is Step.COPY:
            current = splitter.step(*current)
    finally:
        stop.set()
        writer.join(timeout=30)
    assert current is not None
    assert old_frozen(cluster) == []
    churn(cluster, "late")
    before = frozen_before(cluster)
    while current is not None:
        current = splitter.step(*current)
    splitter.release()
    assert_split_exactly(cluster, before)


@pytest.mark.parametrize(
    ("recorded", "resumed"),
    [
        ((Step.FREEZE, 0), (Step.COPY, 0)),
        ((Step.COPY, 3), (Step.COPY, 0)),  # frozen first, then copied: copied again, tracked
        ((Step.SWITCH, 4), (Step.SWITCH, 4)),
        ((Step.CLEAN, 4), (Step.CLEAN, 4)),
    ],
)
def test_a_node_of_the_freeze_first_format_is_resumed_in_the_copy_first_order(
    recorded: tuple[Step, int], resumed: tuple[Step, int]
):
    old = Split(SLOTS, 0, ROUTING, *recorded)
    document = json.loads(old.encode()) | {"version": 1}
    split = Split.decode(json.dumps(document).encode())
    assert (split.step, split.copied_slots) == resumed
    assert json.loads(split.encode())["version"] == 2


def test_a_switched_doubling_cannot_be_rolled_back(cluster: Cluster):
    splitter = cluster.splitter()
    run_steps(splitter, ALL_STEPS - 1)  # switched, the clean next
    with pytest.raises(MoveError, match="the routing has 8 slots already: finish the doubling"):
        splitter.abort()
    assert splitter.split(2 * SLOTS) is not None
    assert splitter.split(2 * SLOTS) is None  # nothing left to do
    with pytest.raises(MoveError, match="no doubling is under way"):
        splitter.abort()


def test_one_splitter_at_a_time_and_no_slot_move_meanwhile(cluster: Cluster):
    first = cluster.splitter()
    run_steps(first, 1)  # frozen
    second = cluster.splitter()
    for attempt in (lambda: second.split(2 * SLOTS), second.abort):
        with pytest.raises(SplitLocked, match=r"the split is being run by .*-\d+/"):
            attempt()
    assert second.locked()
    mover = SlotMover(cluster.splitter().zk, cluster.paths, cluster.queues)
    with pytest.raises(MoveError, match="the topic's slots are being doubled"):
        mover.move(0, 1)
    assert first.split(2 * SLOTS) is not None
    assert not second.locked()
    # a move under way refuses a doubling
    new_queues = [Queue(queue.redis, doubled(cluster.topic)) for queue in cluster.queues]
    mover = SlotMover(cluster.splitter().zk, cluster.paths, new_queues)
    mover.step(*mover.start(0, 1))  # frozen, the copy next
    with pytest.raises(MoveError, match=r"slots \[0\] are moving"):
        second.split(4 * SLOTS)
    mover.move(0, 1)
    mover.release(0)


@pytest.mark.parametrize(
    ("to_slots", "error"),
    [(6, "not 6"), (4, None), (2, "not 2"), (32768, "not 32768")],
)
def test_a_doubling_grows_to_a_power_of_two_only(
    cluster: Cluster, to_slots: int, error: str | None
):
    splitter = cluster.splitter()
    if error is None:
        assert splitter.split(to_slots) is None
        return
    with pytest.raises(MoveError, match=error):
        splitter.split(to_slots)
    assert splitter.state() is None


def test_two_doublings_in_one_call(cluster: Cluster):
    fill(cluster, count=20)
    done = cluster.splitter().split(4 * SLOTS)
    assert done is not None
    assert (done.to_amount, done.to_generation) == (4 * SLOTS, 2)
    routing = cluster.routing()
    assert (routing.slot_amount, routing.generation) == (4 * SLOTS, 2)
    quad = replace(cluster.topic, slot_amount=4 * SLOTS, slot_generation=2)
    for message_id, basis in cluster.basis.items():  # custom bases too, doubled twice
        slot = quad.slot_of(basis)
        queue = Queue(cluster.admins[routing.broker_of_slot[slot]], quad)
        assert queue.get(message_id, basis).state is not State.ABSENT, message_id


def cli(cluster: Cluster, *args: str) -> list[str]:
    return [
        "routing",
        *args,
        "--topic",
        cluster.topic.name,
        "--namespace",
        NAMESPACE,
        "--slot-amount",
        str(SLOTS),
        "--redis-url",
        cluster.servers[0].url,
        "--broker-urls",
        ",".join(server.url for server in cluster.servers),
        "--zookeeper-connect",
        cluster.hosts,
    ]


def test_the_cli_doubles_shows_and_refuses_bad_input_in_one_line(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
):
    fill(cluster, count=20)
    splitter = cluster.splitter()
    run_steps(splitter, 3)
    splitter.release()
    assert main(cli(cluster, "show")) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("4 slots (generation 0) over 2 brokers")
    assert "doubling 4 -> 8 slots (generation 1): next step copy, 3 of 4 slots copied" in shown
    assert main(cli(cluster, "split", "--to-slots", "4")) == 2
    err = capsys.readouterr().err
    assert err.startswith("delayq routing split: a doubling to 8 slots is under way: finish it")
    assert err.count("\n") == 1
    assert main(cli(cluster, "split", "--to-slots", "8")) == 0
    assert capsys.readouterr().out == "doubled to 8 slots (generation 1)\n"
    assert main(cli(cluster, "show", "--json")) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["routing"]["slotAmount"] == 8
    assert document["routing"]["generation"] == 1
    assert document["split"] is None
    assert main(cli(cluster, "split", "--to-slots", "8")) == 0
    assert capsys.readouterr().out == "the topic has 8 slots already\n"
    assert main(cli(cluster, "split", "--to-slots", "12")) == 2
    assert "not 12" in capsys.readouterr().err
    assert main(cli(cluster, "split", "--to-slots", "8", "--abort")) == 2
    assert capsys.readouterr().err == "delayq routing split: no doubling is under way\n"
    # a slot move after the doubling works at the new generation (the routing's, not --slot-amount)
    assert main(cli(cluster, "move-slot", "--slot", "7", "--to-broker", "0")) == 0
    assert capsys.readouterr().out == "slot 7: moved from broker 1 to broker 0\n"


def test_a_routed_client_writing_across_a_doubling_stores_every_id_once_in_its_new_slot(
    cluster: Cluster,
):
    """Writers of a stale slot amount are refused (SLOT_MOVING) from the freeze on; the
    RoutedQueue waits for the doubled routing and slots the refused items again: every id
    ends up exactly once, in the slot of 8 the routing names, on that slot's broker."""
    connection = ZkConnection(cluster.hosts)
    urls = [server.url for server in cluster.servers]
    user, password = f"{NAMESPACE}.{cluster.topic.name}", "engine-secret"
    client = RoutedQueue.connect(
        urls, cluster.topic, zookeeper=connection, username=user, password=password
    )
    written: list[str] = []
    stop = threading.Event()

    def write() -> None:
        batch = 0
        while not stop.is_set() or batch < 3:  # on at least a little past the switch
            ids = [f"r{batch}-{i}" for i in range(50)]
            requests = [ScheduleRequest(i, b"p", delay_ms=600_000) for i in ids]
            client.schedule_many(requests)
            written.extend(ids)
            single = f"one{batch}"
            client.schedule(single, b"p", delay_ms=600_000)
            written.append(single)
            batch += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        wait_until(lambda: len(written) > 200, 10.0, "writes before the doubling")
        cluster.splitter().split(2 * SLOTS)
        count = len(written)
        wait_until(lambda: len(written) > count + 200, 10.0, "writes after the doubling")
    finally:
        stop.set()
        writer.join(timeout=30)
        client.close()
    assert client.topic.slot_amount == 2 * SLOTS
    new = doubled(cluster.topic)
    stored: dict[str, list[int]] = {}
    for slot in range(2 * SLOTS):
        admin = cluster.admins[ROUTING[slot % SLOTS]]
        members = cast("list[bytes]", admin.zrange(slot_keys(new, slot).key(Part.STORE), 0, -1))
        for member in members:
            stored.setdefault(member.decode(), []).append(slot)
    assert sorted(stored) == sorted(written)
    assert all(slots == [new.slot_of(i)] for i, slots in stored.items())


def test_a_slot_move_refuses_to_start_while_a_splitter_holds_its_lock(cluster: Cluster):
    """The splitter takes `movers/split`, then looks for moves, then records `split`; a mover
    takes `movers/<slot>`, then looks for a doubling. A mover that looked only at `split`
    started in between (the splitter had found no move, then recorded its doubling): each
    must look at the other's lock, which both take before they look."""
    splitter = cluster.splitter()
    splitter.lock.acquire()  # as `start` does, before it reads the moves and records `split`
    try:
        mover = SlotMover(cluster.splitter().zk, cluster.paths, cluster.queues)
        with pytest.raises(MoveError, match="the topic's slots are being doubled"):
            mover.start(0, 1)
        assert mover.migrations() == []
        assert not mover.locked()  # the refused mover gave its slot's lock up
    finally:
        splitter.release()
    assert splitter.split(2 * SLOTS) is not None


def test_a_second_doubling_refuses_a_writer_configured_at_generation_zero(cluster: Cluster):
    """The generation is the routing's, never a setting: a plain Queue (or a routed client
    without ZooKeeper) built from the settings is at generation 0 whatever its slotAmount.
    After 4 -> 8 -> 16 one configured with the 16 slots the operator renders writes into
    generation 0's keys of slots 8..15, which the second doubling froze only for generation
    1: accepted there, nobody would ever claim it."""
    assert cluster.splitter().split(4 * SLOTS) is not None
    configured = replace(cluster.topic, slot_amount=4 * SLOTS)  # generation 0
    for slot in range(4 * SLOTS):
        for admin in cluster.admins:
            queue = Queue(admin, configured)
            with pytest.raises(SlotMovingError, match=r"^SLOT_MOVING"):
                queue.schedule("lost", b"p", delay_ms=0, slot_basis=basis_in(configured, slot))


def test_a_splitter_missing_a_broker_refuses_before_it_records_or_freezes(cluster: Cluster):
    """`delayq routing split` given the URL of broker 0 only, for a routing over 2 brokers:
    it recorded the doubling, froze broker 0's slots, then failed on an IndexError, leaving
    the topic's writes refused until a run with every URL; it refuses first now."""
    fill(cluster, count=8)
    splitter = SlotSplitter(cluster.splitter().zk, cluster.paths, cluster.queues[:1])
    with pytest.raises(MoveError, match="names broker 1, but 1 broker"):
        splitter.split(2 * SLOTS)
    assert splitter.state() is None
    assert not splitter.locked()
    for slot in range(SLOTS):  # nothing frozen: every slot takes writes
        broker_queue(cluster, slot).schedule(
            "after", b"p", delay_ms=0, slot_basis=basis_in(cluster.topic, slot)
        )


def test_a_schedule_accepted_at_2n_before_the_freeze_is_carried_into_its_new_slot(
    cluster: Cluster,
):
    """Reconcile renders the grown slotAmount (2N) at once, and the doubling comes with a
    later health pass. A writer that does not read the routing (`delayq pipeline` on one
    broker without ZooKeeper, a plain Queue) at 2N meanwhile stores into generation 0's keys
    of slot s + N on the broker it writes to, which nobody owns: accepted, then frozen by the
    doubling and never copied. The copy of slot s takes them along into the new slot s + N."""
    early = replace(cluster.topic, slot_amount=2 * SLOTS)  # generation 0, the rendered amount
    slot = SLOTS  # s + N of s = 0, whose broker is 0
    writer = Queue(cluster.admins[ROUTING[0]], early)
    message_id = basis_in(early, slot)  # its own basis
    writer.schedule(message_id, b"p", delay_ms=60_000)
    assert cluster.splitter().split(2 * SLOTS) is not None
    new = doubled(cluster.topic)
    info = cluster.queue_of(new, slot).get(message_id)
    assert info.state is State.SCHEDULED
    # the stray keys are cleaned as the old slots are: only their frozen epoch stays
    assert set(snapshot(cluster, early, slot)) == {Part.EPOCH}
