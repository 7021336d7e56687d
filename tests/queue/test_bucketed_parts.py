"""What a slot's two bucketed parts, its records (recordBuckets) and its waiting messages' dues
(storeBuckets), do alike (lua/includes/bucketed_part.lua; docs/contracts.md §1), on a real
redis-server, run once for each: the owner keeps a part's buckets off while an older library
on the broker would not read them, and a move's copy, its deletion and a backup carry every
entry, into the target's buckets or its one flat key as the target's settings record says."""

from __future__ import annotations

import pytest
import redis

from delayq.local.redis_server import RedisServer
from delayq.queue import functions
from delayq.queue.backup import Kind, snapshot
from delayq.queue.client import Queue
from delayq.queue.keys import slot_keys
from delayq.queue.slot_copy import copy_slot, delete_slot
from delayq.queue.topic import Topic

from .bucketed import RECORDS, STORE, Layout, drain, now_ms, publish, queue_fixture, schedule_at

# every waiting message into a bucket, however soon due (storeBucketsAfter 0s)
TOPIC = Topic("bucketed", namespace="shop", slot_amount=1, redis_store_buckets_after_ms=0)
KEYS = slot_keys(TOPIC, 0)
EACH_PART = pytest.mark.parametrize("layout", [RECORDS, STORE], ids=["records", "store"])


queue = queue_fixture(TOPIC)


@EACH_PART
def test_the_owner_keeps_a_part_s_buckets_off_while_an_older_library_is_on_the_broker(
    redis_client: redis.Redis, layout: Layout
) -> None:
    """A library from before the part's buckets (it lacks the function that says it reads
    them) would take an entry in a bucket for absent: while one is loaded, the published
    record has no field that turns them on; once it is gone, the next publish turns them on."""
    functions.load(redis_client)
    old = "delayq_00000000000000ff"
    redis_client.function_load(
        f"#!lua name={old}\n"
        f"redis.register_function('{old}_{layout.older_function}', function() return 1 end)"
    )
    publish(redis_client, True, 1, TOPIC, layout.field)
    assert redis_client.hget(KEYS.settings, layout.field) is None
    redis_client.function_delete(old)
    publish(redis_client, True, 2, TOPIC, layout.field)
    assert redis_client.hget(KEYS.settings, layout.field) == b"True"


@EACH_PART
@pytest.mark.parametrize("target_record", [None, "False"])
def test_a_move_and_a_backup_carry_every_entry_in_buckets(
    queue: Queue,
    redis_client: redis.Redis,
    second_broker: RedisServer,
    layout: Layout,
    target_record: str | None,
) -> None:
    """A slot with entries in its flat key and in buckets: a move's copy, its deletion on the
    source and a backup each take all of them. Onto a broker whose record of the slot lacks
    the part's field (none published there yet) the copy brings them into the flat key, where
    the scripts there look; onto one whose record has it, into their buckets, with the part's
    index. A stale bucket from an earlier copy is replaced. Either way a claim there delivers
    every message."""
    now = now_ms(redis_client)
    schedule_at(queue, {f"before-{i}": now - 10 for i in range(30)})
    publish(redis_client, True, 1, TOPIC, layout.field)
    schedule_at(queue, {f"on-{i}": now - 5 for i in range(300)})
    expected = layout.contents(redis_client, KEYS)
    assert len(expected) == 330
    assert {item.id for item in snapshot(redis_client, KEYS) if item.kind is Kind.WAITING} == {
        member.decode() for member in expected
    }
    target = redis.Redis.from_url(second_broker.url)
    try:
        layout.write_one(target, layout.bucket(KEYS, 40), "stale")
        target.hset(KEYS.key(layout.meta), mapping={"n": 41, "count": 1})
        if target_record is not None:
            target.hset(KEYS.settings, layout.field, target_record)
        copy_slot(redis_client, target, KEYS)
        assert layout.contents(target, KEYS) == expected
        in_flat = layout.flat_size(target, KEYS.key(layout.flat))
        assert (layout.count(target, KEYS), in_flat) == (
            (0, 330) if target_record is None else (layout.count(redis_client, KEYS), 30)
        )
        for sibling in layout.siblings:
            assert bool(target.exists(KEYS.key(sibling))) == (target_record is not None)
        moved = Queue(target, TOPIC)
        epoch = moved.take_over(0)
        assert len(drain(moved, epoch, 100)) == 330
        delete_slot(redis_client, KEYS)
        assert redis_client.keys("dq:*") == []
    finally:
        target.close()
