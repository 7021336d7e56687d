"""A slot's waiting messages in buckets (storeBuckets; lua/includes/store_buckets.lua and
queue/store_buckets.py), on a real redis-server: the memory they save, that claims take every
due message in due order and none early across the buckets and the old `store`, that messages
move as they are written when the owner turns buckets on or off, and that the overview counts
them as a flat slot's (what holds for records and dues alike, the gate and a move's copy:
test_bucketed_parts.py)."""

from __future__ import annotations

import dataclasses
import functools
import random
from typing import cast

import pytest
import redis

from delayq.local.waiting import wait_until
from delayq.queue.client import Queue
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import Mode, Retry, ScheduleRequest
from delayq.queue.plans import Arg, Plan, ScriptCall
from delayq.queue.record_buckets import bucket_of
from delayq.queue.scripts import Script
from delayq.queue.store_buckets import store_bucket_count, store_bucket_key
from delayq.queue.topic import Topic

from . import bucketed as shared
from .bucketed import HOUR_MS, bytes_an_entry, calls_of, drain, now_ms, schedule_at

# every waiting message into a bucket, however soon due: these tests are of the buckets' own
# rules (test_near_dues_stay_out_of_the_buckets is of storeBucketsAfter)
TOPIC = Topic("waiting", namespace="shop", slot_amount=1, redis_store_buckets_after_ms=0)
KEYS = slot_keys(TOPIC, 0)


publish = functools.partial(shared.publish, topic=TOPIC, field=shared.STORE.field)
queue = shared.queue_fixture(TOPIC)


def test_waiting_messages_in_buckets_cost_less_and_stay_listpacks(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """20,000 pending messages in one slot: with their dues in buckets, each costs at least
    60 B less than in the slot's one `store`, every bucket is a listpack, and the heads index
    names each bucket's earliest due."""
    later = now_ms(redis_client) + HOUR_MS
    dues = {f"{i:012d}": later + i for i in range(20_000)}
    write = functools.partial(schedule_at, dues=dues)
    flat, bucketed = bytes_an_entry(redis_client, queue, shared.STORE, write, len(dues))
    assert flat - bucketed >= 60, (flat, bucketed)
    count = store_bucket_count(redis_client, KEYS)
    heads = dict(
        cast(
            "list[tuple[bytes, float]]",
            redis_client.zrange(KEYS.key(Part.HEADS), 0, -1, withscores=True),
        )
    )
    for bucket in range(count):
        first = redis_client.zrange(store_bucket_key(KEYS, bucket), 0, 0, withscores=True)
        assert heads[str(bucket).encode()] == first[0][1]
    read = redis_client.pipeline(transaction=False)
    for message_id in dues:
        read.zscore(store_bucket_key(KEYS, bucket_of(message_id.encode(), count)), message_id)
    assert all(score is not None for score in read.execute())
    assert queue.stats().scheduled == 20_001


@pytest.mark.parametrize("layout", ["buckets", "both"])
def test_claims_take_every_due_message_in_due_order_and_none_early(
    queue: Queue, redis_client: redis.Redis, layout: str
) -> None:
    """3,000 messages over 63 buckets, a herd of them due at one instant, some still in the
    old `store` ("both": scheduled before the owner turned buckets on), the rest due in an
    hour: claims of 125 take exactly the due ones, in due order, each once; stats count them;
    the next due is the first of those in an hour."""
    now = now_ms(redis_client)
    rng = random.Random(7)
    due = {f"d{i}": now - rng.randrange(0, 60_000) for i in range(2000)}
    due |= {f"herd{i}": now - 30_000 for i in range(500)}
    later = {f"l{i}": now + HOUR_MS + i for i in range(500)}
    items = list((due | later).items())
    rng.shuffle(items)
    if layout == "both":
        schedule_at(queue, dict(items[:700]))
    publish(redis_client, True, 1)
    schedule_at(queue, dict(items[700:] if layout == "both" else items))
    assert store_bucket_count(redis_client, KEYS) > 40
    assert bool(redis_client.exists(KEYS.key(Part.STORE))) == (layout == "both")
    stats = queue.stats()
    # `due` is estimated from a sample of 32 buckets once more hold a due message
    assert stats.scheduled == 3000
    assert abs(stats.due - 2500) <= 125, stats.due
    epoch = queue.take_over(0)
    taken = drain(queue, epoch, 125)
    assert sorted(i for i, _ in taken) == sorted(due)
    assert [d for _, d in taken] == sorted(d for _, d in taken)
    assert all(d == due[i] for i, d in taken)
    assert queue.stats().scheduled == 500
    assert queue.claim(0, epoch, max_count=10).next_due_ms == min(later.values())


def test_a_herd_claim_reads_a_few_buckets_not_all(queue: Queue, redis_client: redis.Redis) -> None:
    """5,000 messages due at one instant spread over every bucket: a claim of 100 merges the
    buckets in (due, bucket) order and reads a handful of them (its first page of heads,
    three buckets of about 48 and the next due), not one per bucket."""
    publish(redis_client, True, 1)
    at = now_ms(redis_client) - 1000
    schedule_at(queue, {f"h{i}": at for i in range(5000)})
    count = store_bucket_count(redis_client, KEYS)
    assert count > 100
    epoch = queue.take_over(0)
    before = calls_of(redis_client, "zrangebyscore")
    assert len(queue.claim(0, epoch, max_count=100).messages) == 100
    assert calls_of(redis_client, "zrangebyscore") - before <= 5


def heads_agree(client: redis.Redis) -> bool:
    """Whether `heads` names each non-empty bucket with its first due, and no other."""
    heads = dict(
        cast(
            "list[tuple[bytes, float]]",
            client.zrange(KEYS.key(Part.HEADS), 0, -1, withscores=True),
        )
    )
    firsts = {}
    for bucket in range(store_bucket_count(client, KEYS)):
        first = client.zrange(store_bucket_key(KEYS, bucket), 0, 0, withscores=True)
        if first:
            firsts[str(bucket).encode()] = first[0][1]
    return heads == firsts


def test_claims_keep_the_heads_exact(queue: Queue, redis_client: redis.Redis) -> None:
    """After claims take due messages from buckets, `heads` names each non-empty bucket with
    its first due and no emptied one: a head later than its bucket's first due would hold that
    message back (the claims and the next due go by the heads), one left for an emptied bucket
    would be read for nothing."""
    publish(redis_client, True, 1)
    now = now_ms(redis_client)
    schedule_at(queue, {f"e{i}": now - 10 + i for i in range(3)})  # one bucket, all due
    epoch = queue.take_over(0)
    assert [m.id for m in queue.claim(0, epoch, max_count=100).messages] == ["e0", "e1", "e2"]
    assert redis_client.zcard(KEYS.key(Part.HEADS)) == 0

    schedule_at(queue, {f"l{i}": now + HOUR_MS + i for i in range(2000)})
    due = {f"d{i}": now - 1000 + i for i in range(60)}
    schedule_at(queue, due)
    assert store_bucket_count(redis_client, KEYS) > 40
    assert [m.id for m in queue.claim(0, epoch, max_count=40).messages] == list(due)[:40]
    assert heads_agree(redis_client)
    assert [m.id for m in queue.claim(0, epoch, max_count=100).messages] == list(due)[40:]
    assert heads_agree(redis_client)
    assert queue.claim(0, epoch, max_count=100).next_due_ms == now + HOUR_MS


def test_messages_move_as_they_are_written_when_buckets_are_turned_on_and_off(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """Before: dues in `store`. Turned on: reads find both; new and rescheduled messages go
    to buckets. Turned off: rewrites go back to `store`, and once the buckets are empty the
    slot drops `storebuckets` and `heads`. Every message is delivered once."""
    later = now_ms(redis_client) + HOUR_MS
    schedule_at(queue, {f"before-{i}": later for i in range(100)})
    publish(redis_client, True, 1)
    schedule_at(queue, {f"on-{i}": later for i in range(100)})
    assert redis_client.zcard(KEYS.key(Part.STORE)) == 100
    queue.reschedule("before-3", delay_ms=0)
    assert redis_client.zscore(KEYS.key(Part.STORE), "before-3") is None  # into its bucket
    assert queue.get("before-3") is not None
    publish(redis_client, False, 2)
    queue.reschedule("on-3", delay_ms=0)
    assert redis_client.zscore(KEYS.key(Part.STORE), "on-3") is not None  # back to `store`
    everything = [f"{tag}-{i}" for tag in ("before", "on") for i in range(100)]
    for message_id in everything:
        queue.reschedule(message_id, delay_ms=0)
    epoch = queue.take_over(0)
    assert sorted(i for i, _ in drain(queue, epoch, 50)) == sorted(everything)
    assert not redis_client.exists(KEYS.key(Part.STORE_BUCKETS), KEYS.key(Part.HEADS))
    assert redis_client.keys(f"{KEYS.key(Part.STORE)}*") == []


@pytest.mark.parametrize("count", [1000, 20_000])
def test_the_overview_counts_a_bucketed_slot_as_a_flat_one(
    queue: Queue, redis_client: redis.Redis, count: int
) -> None:
    """The dashboard's read (overview-4: totals, overdue, the due windows, the next due) of a
    slot whose dues sit in buckets and in the old `store`, against a slot holding the same
    dues in one `store`: equal while at most 32 buckets hold entries of a window (1,000
    messages, 834 of them in 18 buckets); beyond (20,000, in 348), each window estimated from
    32 buckets,
    within 15 % and reading about 32 buckets a window, not all of them."""
    now = now_ms(redis_client)
    rng = random.Random(3)
    # half a second off every window's bound while both reads run within that of `now`
    dues = {f"o{i}": now + 1000 * rng.randrange(-1800, 7200) + 500 for i in range(count)}
    flat = Queue(redis_client, dataclasses.replace(TOPIC, name="flat"))
    schedule_at(flat, dues)
    items = list(dues.items())
    schedule_at(queue, dict(items[: count // 6]))
    publish(redis_client, True, 1)
    schedule_at(queue, dict(items[count // 6 :]))
    assert store_bucket_count(redis_client, KEYS) == -(-(count - count // 6) // 48)

    def overview(topic: Topic) -> list[int]:
        keys = slot_keys(topic, 0).keys(Part.STORE, Part.PREPARE, Part.DEAD, Part.EPOCH)
        windows: list[Arg] = [str(w) for w in (1_800_000, 3_600_000)]
        plan = Plan([ScriptCall(Script.OVERVIEW, keys, windows)], list)
        return [int(v) for v in Queue(redis_client, topic).run(plan)[0][1:]]

    exact = overview(flat.topic)
    before = calls_of(redis_client, "zcount")
    bucketed = overview(TOPIC)
    if count == 1000:
        assert bucketed == exact
        return
    assert calls_of(redis_client, "zcount") - before <= 4 * (32 + 1)
    # epoch, scheduled, overdue, the two windows, later, prepared, dead, next due
    assert bucketed[:2] == exact[:2]
    assert bucketed[6:] == exact[6:]
    for estimate, truth in zip(bucketed[2:5], exact[2:5], strict=True):
        assert abs(estimate - truth) <= 0.15 * truth, (bucketed, exact)


NEAR_TOPIC = Topic("soon", namespace="shop", slot_amount=1)  # storeBucketsAfter: 10s, its default
NEAR_KEYS = slot_keys(NEAR_TOPIC, 0)
near_queue = shared.queue_fixture(NEAR_TOPIC)


def kept_in(client: redis.Redis, message_id: str) -> set[str]:
    """Where the slot keeps `message_id`'s due: {"store"}, {"bucket"}, both or neither."""
    count = store_bucket_count(client, NEAR_KEYS)
    bucket = store_bucket_key(NEAR_KEYS, bucket_of(message_id.encode(), count))
    places = {"store": NEAR_KEYS.key(Part.STORE), "bucket": bucket}
    return {name for name, key in places.items() if client.zscore(key, message_id) is not None}


def test_messages_due_soon_stay_out_of_the_buckets(
    near_queue: Queue, redis_client: redis.Redis
) -> None:
    """A message due within storeBucketsAfter of its write stays in `store`, one due later goes
    into its bucket. A claim of those due takes them from `store` alone: one ZREM and a look at
    the heads, not a bucket a message (buckets are picked by hash, and amid 10M pending each
    due message was alone in its bucket: claim -> ack cost 1.55x what it did amid 1M). A
    reschedule moves a message across, and an id written twice in one batch is kept once,
    where its last due puts it."""
    shared.publish(redis_client, True, 1, NEAR_TOPIC, shared.STORE.field)
    now = now_ms(redis_client)
    later = {f"l{i}": now + HOUR_MS + i for i in range(2000)}
    soon = {f"s{i}": now - 1000 + i for i in range(100)}
    schedule_at(near_queue, later | soon)
    store = NEAR_KEYS.key(Part.STORE)
    assert {
        member.decode() for member in cast("list[bytes]", redis_client.zrange(store, 0, -1))
    } == set(soon)
    assert store_bucket_count(redis_client, NEAR_KEYS) > 20

    near_queue.reschedule("l0", delay_ms=0)
    near_queue.reschedule("s99", delay_ms=HOUR_MS)
    assert kept_in(redis_client, "l0") == {"store"}
    assert kept_in(redis_client, "s99") == {"bucket"}
    twice = [
        ScheduleRequest("t", b"p", at_ms=now - 5),
        ScheduleRequest("t", b"p", at_ms=now + HOUR_MS),
        ScheduleRequest("u", b"p", at_ms=now + HOUR_MS),
        ScheduleRequest("u", b"p", at_ms=now - 5),
    ]
    near_queue.schedule_many(twice, Mode.UPSERT)
    assert kept_in(redis_client, "t") == {"bucket"}
    assert kept_in(redis_client, "u") == {"store"}
    assert near_queue.stats().scheduled == 2102

    due = {*soon, "l0", "u"} - {"s99"}
    epoch = near_queue.take_over(0)
    zrem, ranges = calls_of(redis_client, "zrem"), calls_of(redis_client, "zrangebyscore")
    taken = near_queue.claim(0, epoch, max_count=200).messages
    assert {message.id for message in taken} == due
    assert calls_of(redis_client, "zrem") - zrem <= 2
    assert calls_of(redis_client, "zrangebyscore") - ranges <= 3
    assert near_queue.stats().scheduled == 2102 - len(due)


def test_a_new_message_due_soon_deletes_nothing_in_the_buckets(
    near_queue: Queue, redis_client: redis.Redis
) -> None:
    """Ids without a record scheduled due soon go into `store` with no ZREM in their buckets: a
    live message always has its record, so such an id is in none (amid a deep backlog that
    ZREM was one more bucket a message). An id that has a record still leaves its bucket, and
    so does a new id written twice in one batch, its writes in two commands (500 messages a
    ZADD), wherever the last one puts it."""
    shared.publish(redis_client, True, 1, NEAR_TOPIC, shared.STORE.field)
    now = now_ms(redis_client)
    schedule_at(near_queue, {f"l{i}": now + HOUR_MS + i for i in range(2000)})
    assert store_bucket_count(redis_client, NEAR_KEYS) > 20
    zrem = calls_of(redis_client, "zrem")
    schedule_at(near_queue, {f"s{i}": now + i for i in range(200)})
    assert calls_of(redis_client, "zrem") == zrem
    assert all(kept_in(redis_client, f"s{i}") == {"store"} for i in range(200))

    filler = [ScheduleRequest(f"f{i}", b"p", at_ms=now + 5) for i in range(598)]
    near_queue.schedule_many(
        [ScheduleRequest("x", b"p", at_ms=now + HOUR_MS), ScheduleRequest("y", b"p", at_ms=now)]
        + [ScheduleRequest(f"l{i}", b"p", at_ms=now + 5) for i in range(10)]
        + filler
        + [ScheduleRequest("x", b"p", at_ms=now), ScheduleRequest("y", b"p", at_ms=now + HOUR_MS)],
        Mode.UPSERT,
    )
    assert kept_in(redis_client, "x") == {"store"}
    assert kept_in(redis_client, "y") == {"bucket"}
    assert all(kept_in(redis_client, f"l{i}") == {"store"} for i in range(10))
    assert near_queue.stats().scheduled == 2000 + 200 + 598 + 2


def test_a_retry_or_give_back_due_soon_deletes_nothing_in_the_buckets(
    near_queue: Queue, redis_client: redis.Redis
) -> None:
    """A message taken out of `prepare` by a nack, a give-back or its lease's expiry is in no
    bucket (a message is scheduled, prepared or dead, never two): put back due soon, into
    `store`, it costs the ZREM in `prepare` and none in a bucket. Each is delivered again."""
    shared.publish(redis_client, True, 1, NEAR_TOPIC, shared.STORE.field)
    now = now_ms(redis_client)
    schedule_at(near_queue, {f"l{i}": now + HOUR_MS + i for i in range(2000)})
    schedule_at(near_queue, {f"s{i}": now - 100 + i for i in range(60)})
    assert store_bucket_count(redis_client, NEAR_KEYS) > 20
    epoch = near_queue.take_over(0)
    taken = near_queue.claim(0, epoch, max_count=60).messages
    assert len(taken) == 60
    zrem = calls_of(redis_client, "zrem")
    near_queue.nack_many([Retry(message.lease) for message in taken[:20]])
    near_queue.giveback_many(taken[20:40])
    assert calls_of(redis_client, "zrem") - zrem == 40  # their entries in `prepare`
    expiring = near_queue.claim(0, epoch, max_count=60, ack_timeout_ms=1).messages
    assert {m.id for m in expiring} == {m.id for m in taken[:40]}
    after = now_ms(redis_client)
    wait_until(lambda: now_ms(redis_client) > after + 5, 5, "the 1 ms leases to run out")
    zrem = calls_of(redis_client, "zrem")
    again = near_queue.claim(0, epoch, max_count=60).messages  # rolls the 40 leases back first
    assert {m.id for m in again} == {m.id for m in taken[:40]}
    assert all(kept_in(redis_client, f"s{i}") == set() for i in range(40))
    # the 40 expired leases out of `prepare`, then out of `store` as claimed again
    assert calls_of(redis_client, "zrem") - zrem <= 40 + 2
