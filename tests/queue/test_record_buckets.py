"""A slot's records in buckets (recordBuckets; lua/includes/record_buckets.lua and
queue/record_buckets.py), on a real redis-server: the memory they save, that the Python readers
find each record where the scripts put it, whole, and that records move as they are written
when the topic's owner turns buckets on or off (what holds for records and dues alike, the gate
and a move's copy: test_bucketed_parts.py)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, cast

import redis

from delayq.local.redis_server import RedisServer
from delayq.queue.backup import snapshot
from delayq.queue.client import Queue
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import ScheduleRequest
from delayq.queue.record_buckets import (
    bucket_count,
    bucket_key,
    bucket_of,
    queue_record_reads,
    record_pages,
)
from delayq.queue.reply_cap import capped
from delayq.queue.slot_copy import copy_slot
from delayq.queue.slot_split import Division, recopy, split_slot
from delayq.queue.topic import Topic

from . import bucketed as shared
from .bucketed import HOUR_MS, bytes_an_entry, calls_of

TOPIC = Topic("records", namespace="shop", slot_amount=1)
KEYS = slot_keys(TOPIC, 0)


publish = functools.partial(shared.publish, topic=TOPIC, field=shared.RECORDS.field)
queue = shared.queue_fixture(TOPIC)


def schedule(queue: Queue, ids: list[str], payload: bytes = b"p" * 40) -> None:
    for start in range(0, len(ids), 1000):
        chunk = ids[start : start + 1000]
        queue.schedule_many([ScheduleRequest(i, payload, delay_ms=HOUR_MS) for i in chunk])


def test_records_in_buckets_cost_less_and_stay_listpacks(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """20,000 pending messages of 40 bytes in one slot: in buckets, each costs at least 40 B
    less than in the slot's one `msg` hash, and every bucket is a listpack."""
    ids = [f"{i:012d}" for i in range(20_000)]
    write = functools.partial(schedule, ids=ids)
    flat, bucketed = bytes_an_entry(redis_client, queue, shared.RECORDS, write, len(ids))
    assert flat - bucketed >= 40, (flat, bucketed)


def test_a_first_large_batch_leaves_no_bucket_a_hash_table(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """A batch of 1,000 into an empty slot fills its one bucket past Redis's listpack limit
    before the bucket splits: the split writes it anew, so no bucket stays a hash table."""
    publish(redis_client, True, 1)
    schedule(queue, [f"first-{i}" for i in range(1000)])
    assert bucket_count(redis_client, KEYS) >= 1000 // 48
    assert shared.encodings(redis_client, shared.RECORDS, KEYS) == {b"listpack"}


def test_python_finds_each_record_in_the_bucket_the_scripts_chose(
    queue: Queue, redis_client: redis.Redis
) -> None:
    publish(redis_client, True, 1)
    ids = [f"id-{i}-{'x' * (i % 40)}" for i in range(3000)]
    schedule(queue, ids)
    count = bucket_count(redis_client, KEYS)
    read = redis_client.pipeline(transaction=False)
    for message_id in ids:
        read.hexists(bucket_key(KEYS, bucket_of(message_id.encode(), count)), message_id)
    assert all(read.execute())


def test_a_scan_sees_every_record_while_the_buckets_split_under_it(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """`record_pages` has read bucket 0 of 4 when writers split buckets 0, 1 and 2 into
    4, 5 and 6: the scan goes on into the new buckets and misses no record."""
    publish(redis_client, True, 1)
    ids = [f"old-{i}" for i in range(4 * 48 - 10)]
    schedule(queue, ids)
    assert bucket_count(redis_client, KEYS) == 4
    pages = record_pages(redis_client, KEYS)
    seen = {field for field, _ in next(pages)}  # bucket 0 (msg is empty)
    schedule(queue, [f"new-{i}" for i in range(3 * 48)])
    assert bucket_count(redis_client, KEYS) == 7
    seen |= {field for page in pages for field, _ in page}
    assert {i.encode() for i in ids} <= seen


def test_records_move_as_they_are_written_when_buckets_are_turned_on_and_off(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """Before: records in `msg`. Turned on: reads find both; a claim (which rewrites the
    record) and new messages go to buckets. Turned off: rewrites go back to `msg`, and once the
    buckets are empty the slot drops its `buckets` hash. Every message is delivered once."""
    schedule(queue, [f"before-{i}" for i in range(100)])
    publish(redis_client, True, 1)
    schedule(queue, [f"on-{i}" for i in range(100)])
    assert redis_client.hlen(KEYS.key(Part.MSG)) == 100
    assert queue.get("before-7") is not None
    assert queue.get("on-7") is not None
    epoch = queue.take_over(0)
    queue.reschedule("before-3", delay_ms=0)
    queue.reschedule("on-3", delay_ms=0)
    (first, second) = sorted(queue.claim(0, epoch, max_count=10).messages, key=lambda m: m.id)
    assert (first.id, second.id) == ("before-3", "on-3")
    assert redis_client.hexists(KEYS.key(Part.MSG), "before-3") is False  # into its bucket
    publish(redis_client, False, 2)
    queue.nack(first.lease, delay_ms=0)
    queue.nack(second.lease, delay_ms=0)
    assert redis_client.hexists(KEYS.key(Part.MSG), "on-3")  # back to `msg`
    everything = [f"{tag}-{i}" for tag in ("before", "on") for i in range(100)]
    for message_id in everything:
        queue.reschedule(message_id, delay_ms=0)
    delivered: list[str] = []
    while batch := queue.claim(0, epoch, max_count=50).messages:
        for message in batch:
            queue.ack(message.lease)
        delivered += [message.id for message in batch]
    assert sorted(delivered) == sorted(everything)
    assert not redis_client.exists(KEYS.key(Part.BUCKETS))
    assert redis_client.keys(f"{KEYS.key(Part.MSG)}*") == []


def test_a_fresh_record_is_short_in_its_bucket_and_whole_to_every_reader(
    queue: Queue, redis_client: redis.Redis, second_broker: RedisServer
) -> None:
    """A message scheduled anew (`0:::0:` + payload) is kept in its bucket as `.` + payload,
    and every reader sees the whole record: get, a claim (which writes it leased, whole), the
    Python readers, a backup, a move onto a broker that reads `msg` alone and a doubling's
    halves. A record with headers, a tagged field or a lease is kept as it is."""
    payload = b"p" * 40
    publish(redis_client, True, 1)
    queue.schedule_many(
        [
            ScheduleRequest("fresh", payload, delay_ms=HOUR_MS),
            ScheduleRequest("headed", payload, delay_ms=HOUR_MS, headers={"h": "v"}),
            ScheduleRequest("expiring", payload, delay_ms=HOUR_MS, ttl_ms=HOUR_MS),
            ScheduleRequest("grouped", payload, delay_ms=HOUR_MS, priority=3, group="g"),
            ScheduleRequest("leased", payload, delay_ms=0),
        ]
    )
    count = bucket_count(redis_client, KEYS)

    def stored(message_id: str) -> bytes:
        bucket = bucket_key(KEYS, bucket_of(message_id.encode(), count))
        return cast("bytes", redis_client.hget(bucket, message_id))

    assert stored("leased") == b"." + payload
    (claimed,) = queue.claim(0, queue.take_over(0)).messages
    assert (claimed.id, claimed.payload, claimed.attempt) == ("leased", payload, 1)
    ids = ["fresh", "headed", "expiring", "grouped", "leased"]
    raw = {message_id.encode(): stored(message_id) for message_id in ids}
    assert raw[b"fresh"] == b"." + payload
    assert all(not value.startswith(b".") for id_, value in raw.items() if id_ != b"fresh")
    whole = {**raw, b"fresh": b"0:::0:" + payload}

    info = queue.get("fresh")
    assert (info.payload, info.headers, info.attempts) == (payload, {}, 0)
    assert shared.records(redis_client, KEYS) == whole
    read = redis_client.pipeline(transaction=False)
    parse = queue_record_reads(read, KEYS, list(whole), count)
    assert dict(zip(whole, parse(iter(read.execute())), strict=True)) == whole
    backup = {item.id.encode(): item.value for item in snapshot(redis_client, KEYS)}
    assert {**backup, b"leased": whole[b"leased"]} == whole  # a backup drops the lease
    target = redis.Redis.from_url(second_broker.url)
    try:
        copy_slot(redis_client, target, KEYS)  # its record of the slot lacks the field
        assert target.hgetall(KEYS.key(Part.MSG)) == whole
    finally:
        target.close()
    halves = dataclasses.replace(TOPIC, slot_amount=2, slot_generation=1)
    division = Division(KEYS, slot_keys(halves, 0), slot_keys(halves, 1))
    split_slot(redis_client, division)
    divided = {
        **redis_client.hgetall(division.lower.key(Part.MSG)),
        **redis_client.hgetall(division.upper.key(Part.MSG)),
    }
    assert divided == whole


class SplitBeforeTheReads(redis.Redis):
    """A client whose second pipeline (a recopy's reads, after its look at the sources) waits
    until `meanwhile` has run on another connection: a write that splits a bucket."""

    meanwhile: Callable[[], None]
    pipelines = 0

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        self.pipelines += 1
        if self.pipelines == 2:
            run = pipe.execute

            def execute(raise_on_error: bool = True) -> Any:
                self.meanwhile()
                return run(raise_on_error)

            pipe.execute = execute  # type: ignore[method-assign]
        return pipe


def test_a_recopy_reads_again_a_record_whose_bucket_split_under_its_reads(
    queue: Queue, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """A doubling's recopy of a changed message has queued the read of its record in bucket
    0 of 4 when a write splits bucket 0 and moves the record to bucket 4: the recopy reads
    again and copies the record to its half, instead of taking it for deleted."""
    publish(redis_client, True, 1)
    ids = [f"m{i}" for i in range(20_000)]
    moving = next(i for i in ids if bucket_of(i.encode(), 4) == 0 and bucket_of(i.encode(), 5) == 4)
    filler = [i for i in ids if i != moving]
    schedule(queue, [moving, *filler[: 4 * 48 - 1]])
    assert bucket_count(redis_client, KEYS) == 4  # the next split: bucket 0 into 0 and 4
    halves = dataclasses.replace(TOPIC, slot_amount=2, slot_generation=1)
    division = Division(KEYS, slot_keys(halves, 0), slot_keys(halves, 1))
    redis_client.sadd(KEYS.key(Part.RECOPY), b"m" + moving.encode())
    # capped as the doubling's reads are (reply_cap), so `recopy` reads through this client
    pool = capped(redis.Redis.from_url(redis_server.url)).connection_pool
    client = SplitBeforeTheReads(connection_pool=pool)
    client.meanwhile = lambda: schedule(queue, filler[4 * 48 : 4 * 48 + 60])
    try:
        recopy(client, division)
    finally:
        client.close()
    assert bucket_count(redis_client, KEYS) > 4
    half = division.lower if halves.slot_of(moving) == 0 else division.upper
    assert (
        redis_client.hget(half.key(Part.MSG), moving)
        == shared.records(redis_client, KEYS)[moving.encode()]
    )


def test_a_topic_that_never_had_buckets_pays_no_lookup_and_one_that_had_keeps_reading_them(
    redis_client: redis.Redis,
) -> None:
    """Off, the owner publishes no redis_record_buckets, and the scripts do not ask a slot
    whether it has buckets: a call over 64 slots makes one EXISTS less than the same call of
    a topic whose record has the field, and a get one HMGET less. Once a topic had buckets on,
    turning them off publishes False, and publish-1 keeps it when an owner, this one or
    another, publishes without the field (its slots' records in buckets stay readable);
    publishing that again writes nothing."""
    never = Topic("never", namespace="shop", slot_amount=64)
    had = Topic("had", namespace="shop", slot_amount=64)
    publish(redis_client, False, 1, topic=never)
    publish(redis_client, True, 1, topic=had)
    publish(redis_client, False, 2, topic=had)
    assert redis_client.hget(slot_keys(never, 5).settings, "redis_record_buckets") is None
    assert redis_client.hget(slot_keys(had, 5).settings, "redis_record_buckets") == b"False"
    calls: dict[str, list[int]] = {}
    for topic in (never, had):
        queue = Queue(redis_client, topic)
        before = calls_of(redis_client, "exists")
        schedule(queue, [f"m{i}" for i in range(1000)])
        scheduling = calls_of(redis_client, "exists") - before
        before = calls_of(redis_client, "hmget")
        assert queue.get("m7") is not None
        calls[topic.name] = [scheduling, calls_of(redis_client, "hmget") - before]
    assert [h - n for h, n in zip(calls["had"], calls["never"], strict=True)] == [1, 1], calls

    Queue(redis_client, had).publish_settings("another owner", 1)
    assert redis_client.hget(slot_keys(had, 5).settings, "redis_record_buckets") == b"False"
    writes = calls_of(redis_client, "hset")
    Queue(redis_client, had).publish_settings("another owner", 1)
    assert calls_of(redis_client, "hset") == writes
