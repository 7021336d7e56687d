"""Doubling a topic's slots 4 -> 8 on two real redis-servers, recorded in a real ZooKeeper
(`delayq.coordination.splitting`, `queue.slot_split`): every part of every slot divided
exactly, what changes during the copy copied again, stale writers of either slot amount
refused, and each slot frozen for a few round trips only.

A splitter stopped or killed midway: test_split_crashes.py; the command and its locks:
test_split_cli.py."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

import pytest
import redis
from kazoo.client import KazooClient

from delayq.coordination.layout import TopicPaths
from delayq.coordination.migration import Step
from delayq.coordination.routed_queue import RoutedQueue
from delayq.coordination.routing import Routing
from delayq.coordination.routing_watch import ZkConnection
from delayq.coordination.splitting import SlotSplitter, Split
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue import (
    Queue,
    SlotMovingError,
    StaleEpochError,
    Topic,
    consume_plans,
    reply_cap,
    slot_split,
)
from delayq.queue.codes import Code
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import ScheduleRequest, State
from delayq.queue.record_buckets import bucket_count
from delayq.queue.slot_split import Division, catch_up, split_slot
from delayq.queue.store_buckets import store_bucket_count
from delayq.queue.topic import slot_of

from .conftest import traced_peak
from .splits import (
    NAMESPACE,
    PER_MESSAGE,
    ROUTING,
    SLOTS,
    Cluster,
    assert_split_exactly,
    basis_in,
    broker_queue,
    churn,
    doubled,
    fill,
    frozen_before,
    old_frozen,
    snapshot,
)


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


@dataclass
class RoundTrips:
    """Round trips to Redis (one per command or pipeline sent) and ZooKeeper requests."""

    redis: int = 0
    zookeeper: int = 0


def test_a_doubling_of_large_messages_reads_no_page_of_them_whole(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
):
    """The doubling runs in the operator's leader too: its reads are capped in bytes like a
    move's (`reply_cap`), the copy's pages and the catch-up's records of the changes alike.
    With 80 payloads of 256 KiB (half copied by the rounds, half changed after them: the
    catch-up reads those) and pages of 64 KiB, the halves are exact and the peak is a few
    entries, not a slot's 5 MB (it read a slot's records in one page)."""
    monkeypatch.setattr(reply_cap, "PAGE_MAX_BYTES", 64 * 1024)
    fill(cluster)

    def large(tag: str) -> None:
        for i in range(40):
            message_id = f"{tag}{i:02d}"
            cluster.basis[message_id] = message_id
            queue = broker_queue(cluster, cluster.topic.slot_of(message_id))
            queue.schedule(message_id, os.urandom(256 * 1024), delay_ms=600_000)

    large("copied")
    splitter = cluster.splitter()
    with traced_peak() as peak:  # the copy's rounds
        current: tuple[Split, int] | None = splitter.start(2 * SLOTS)
        while current is not None and current[0].step is Step.COPY:
            current = splitter.step(*current)
        copied = peak()
    assert old_frozen(cluster) == []
    large("changed")
    before = frozen_before(cluster)
    with traced_peak() as peak:  # the freeze's catch-up, and the rest
        while current is not None:
            current = splitter.step(*current)
        caught_up = peak()
    splitter.release()
    assert_split_exactly(cluster, before)
    assert copied < 3 * 1024 * 1024, copied
    assert caught_up < 3 * 1024 * 1024, caught_up


def test_a_slot_of_many_custom_bases_is_split_without_reading_them_all_first(
    redis_server: RedisServer, redis_client: redis.Redis
):
    """The halves of a page are decided from the bases its own messages recorded, read with
    the page: the doubling runs in the operator, and a slot's bases read whole first (20,000
    here, of 200 bytes: ~8 MB in Python) grow with the tenant's slot, not with a page."""
    topic = Topic("bases", namespace=NAMESPACE, slot_amount=1)
    queue = Queue.from_url(redis_server.url, topic)
    bases = {f"m{i}": f"{i:05d}" + "b" * 195 for i in range(20_000)}
    for start in range(0, len(bases), 1000):
        queue.schedule_many(
            [
                ScheduleRequest(message_id, b"p", delay_ms=600_000, slot_basis=basis)
                for message_id, basis in list(bases.items())[start : start + 1000]
            ]
        )
    new = replace(topic, slot_amount=2, slot_generation=1)
    division = Division(slot_keys(topic, 0), slot_keys(new, 0), slot_keys(new, 1))
    with traced_peak() as peak:
        split_slot(redis_client, division)
        held = peak()
    halves = (division.lower, division.upper)
    for message_id, basis in list(bases.items())[::500]:
        half = halves[slot_of(basis, 2)]
        assert redis_client.hexists(half.key(Part.MSG), message_id), message_id
    lengths = cast("list[int]", [redis_client.hlen(half.key(Part.MSG)) for half in halves])
    assert lengths[0] + lengths[1] == 20_000
    assert held < 4 * 1024 * 1024, held


def test_a_catch_up_of_several_slots_gives_each_half_its_own_slots_parts(
    redis_server: RedisServer, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
):
    """`catch_up` takes a broker's frozen slots together: each half gets its own old slot's
    journal (page by page past BATCH entries), lease counter and frozen epoch."""
    monkeypatch.setattr(slot_split, "BATCH", 7)
    topic = Topic("journals", namespace=NAMESPACE, slot_amount=2, journal_max_len=1000)
    queue = Queue.from_url(redis_server.url, topic)
    for i in range(40):  # 20 in each slot, half of them due now
        basis = basis_in(topic, i % 2)
        queue.schedule(f"m{i}", b"p", delay_ms=0 if i % 4 < 2 else 600_000, slot_basis=basis)
    for slot, claims in ((0, 1), (1, 3)):  # a lease counter of its own each
        epoch = queue.take_over(slot)
        for _ in range(claims):
            queue.claim(slot, epoch, max_count=1, ack_timeout_ms=600_000)
    for slot in topic.slots:
        queue.run(consume_plans.freeze(topic, slot))
    new = replace(topic, slot_amount=4, slot_generation=1)
    divisions = [
        Division(slot_keys(topic, slot), slot_keys(new, slot), slot_keys(new, slot + 2))
        for slot in topic.slots
    ]
    catch_up(redis_client, divisions)
    for division in divisions:
        journal = redis_client.xrange(division.source.key(Part.JOURNAL))
        assert len(cast("list[Any]", journal)) > 7
        assert redis_client.xrange(division.lower.key(Part.JOURNAL)) == journal
        for part in (Part.LEASES, Part.EPOCH):
            kept = redis_client.get(division.source.key(part))
            assert kept is not None
            for half in (division.lower, division.upper):
                assert redis_client.get(half.key(part)) == kept, (division.source, part)
    leases = [redis_client.get(d.source.key(Part.LEASES)) for d in divisions]
    assert leases[0] != leases[1]


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


def copied_while_writing(splitter: SlotSplitter, write: Callable[[int], None]) -> tuple[Split, int]:
    """Start a doubling and take it through its copies while another thread calls
    `write(0)`, `write(1)`, ... (from before the first copy on, until the last is done);
    returns the doubling at its next step."""
    stop = threading.Event()
    rounds: list[int] = []

    def writer() -> None:
        while not stop.is_set():
            write(len(rounds))
            rounds.append(1)

    thread = threading.Thread(target=writer)
    current = splitter.start(2 * SLOTS)
    thread.start()
    try:
        wait_until(lambda: rounds, 10.0, "a writer under way")
        while current is not None and current[0].step is Step.COPY:
            current = splitter.step(*current)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert current is not None
    return current


def test_what_changes_while_the_slots_are_copied_is_copied_again(cluster: Cluster):
    """A writer changes every old slot while each is scanned and copied, and again after the
    copy's rounds (seen by the catch-up under the freeze only): the halves are exact."""
    fill(cluster)
    splitter = cluster.splitter()
    current: tuple[Split, int] | None = copied_while_writing(
        splitter, lambda n: churn(cluster, f"w{n}-")
    )
    assert old_frozen(cluster) == []
    churn(cluster, "late")
    before = frozen_before(cluster)
    while current is not None:
        current = splitter.step(*current)
    splitter.release()
    assert_split_exactly(cluster, before)


def bucket_counts(cluster: Cluster) -> list[tuple[int, int]]:
    """Each old slot's bucket counts: its records' and its store's."""
    return [
        (
            bucket_count(cluster.admins[ROUTING[slot]], slot_keys(cluster.topic, slot)),
            store_bucket_count(cluster.admins[ROUTING[slot]], slot_keys(cluster.topic, slot)),
        )
        for slot in cluster.topic.slots
    ]


@pytest.mark.parametrize("cluster", ["buckets"], indirect=True)
def test_records_moving_into_new_buckets_while_the_slots_are_copied_are_copied(cluster: Cluster):
    """With recordBuckets and storeBuckets, writers grow every old slot while it is scanned
    and copied, so its buckets split and records and dues move into new ones under the scan:
    each still reaches its half, and those written before the switch (in `msg` and `store`)
    too."""

    def grow(tag: str, count: int) -> None:
        for slot in cluster.topic.slots:
            ids = [f"{tag}{slot}-{i}" for i in range(count * 2 * SLOTS)]
            landing = [i for i in ids if cluster.topic.slot_of(i) == slot][:count]
            requests = [ScheduleRequest(i, b"grown", delay_ms=600_000) for i in landing]
            broker_queue(cluster, slot).schedule_many(requests)
            cluster.basis.update((i, i) for i in landing)

    legacy = replace(cluster.topic, redis_record_buckets=False, redis_store_buckets=False)
    for admin in cluster.admins:  # records in `msg`, from before the topic's switch
        Queue(admin, legacy).publish_settings("tests", 2)
    grow("old-", 20)
    for admin in cluster.admins:
        bucketed = replace(legacy, redis_record_buckets=True, redis_store_buckets=True)
        Queue(admin, bucketed).publish_settings("tests", 3)
    fill(cluster, 400)
    splitter = cluster.splitter()
    counts = bucket_counts(cluster)

    def write(n: int) -> None:  # one round grows every slot's buckets, records and dues
        churn(cluster, f"w{n}-")
        grow(f"g{n}-", 100)

    current: tuple[Split, int] | None = copied_while_writing(splitter, write)
    grown = bucket_counts(cluster)
    assert all(
        all(a > b for a, b in zip(after, before, strict=True))
        for before, after in zip(counts, grown, strict=True)
    ), (counts, grown)
    before = frozen_before(cluster)
    while current is not None:
        current = splitter.step(*current)
    splitter.release()
    assert_split_exactly(cluster, before)


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
