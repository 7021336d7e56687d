"""The topic's settings record (queue/topic_record.py) on a real redis-server: published by the
topic's owner, read by the scripts in place of each caller's own `Topic`, read-only to the
topic's users."""

from __future__ import annotations

import dataclasses
import time
from typing import cast

import pytest
import redis
from redis.exceptions import NoPermissionError

from delayq.queue import functions, produce_plans, topic_record
from delayq.queue.client import Queue
from delayq.queue.codes import Code
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import Mode, ScheduleRequest, State
from delayq.queue.scripts import Script
from delayq.queue.slot_copy import delete_slot
from delayq.queue.topic import EndAction, Topic

from .conftest import TOPIC, MakeQueue, claim

HOUR_MS = 3_600_000
OWNER = "3f1c-uid"


def publish(admin: redis.Redis, topic: Topic, version: int, owner: str = OWNER) -> list[int]:
    """What the topic's owner does (the operator as its admin user)."""
    return Queue(admin, topic).publish_settings(owner, version)


def same_slot_ids(topic: Topic, count: int) -> list[str]:
    slot = topic.slot_of("q0")
    return [i for i in (f"q{n}" for n in range(400)) if topic.slot_of(i) == slot][:count]


def test_a_client_with_a_stale_topic_obeys_the_published_quota_and_retries(
    make_queue: MakeQueue, redis_client: redis.Redis
) -> None:
    """A producer and a consumer built with an old `Topic` (no quota, two retries) obey what
    the owner published, and a change published later, without being rebuilt."""
    stale = make_queue()  # TOPIC: max_retries 2, no limits_max_pending
    ids = same_slot_ids(stale.topic, 6)
    assert stale.schedule(ids[0], b"", delay_ms=0).code is Code.CREATED

    publish(redis_client, dataclasses.replace(TOPIC, limits_max_pending=8, max_retries=0), 1)
    results = stale.schedule_many([ScheduleRequest(i, b"", delay_ms=0) for i in ids[1:4]])
    assert [r.code for r in results] == [Code.CREATED, Code.OVER_QUOTA, Code.OVER_QUOTA]
    [message] = claim(stale, ids[0])
    assert stale.nack(message.lease).code is Code.DEAD  # max_retries 0: one attempt only

    publish(redis_client, dataclasses.replace(TOPIC, limits_max_pending=0, max_retries=5), 2)
    assert stale.schedule(ids[2], b"", delay_ms=0).code is Code.CREATED  # no quota any more
    [message] = claim(stale, ids[1])
    assert stale.nack(message.lease).code is Code.RETRY_SCHEDULED


def test_the_published_expiry_and_retention_apply_to_a_client_that_has_none(
    make_queue: MakeQueue, redis_client: redis.Redis
) -> None:
    """The pipeline's case: its `Topic` has no default expiry and no outcome retention."""
    bare = make_queue()
    published = dataclasses.replace(
        TOPIC, expiry_ttl_ms=HOUR_MS, outcome_retention_ms=HOUR_MS, expiry_action=EndAction.DROP
    )
    publish(redis_client, published, 1)
    result = bare.schedule("order-1", b"x", delay_ms=0)
    assert bare.get("order-1").expire_at_ms == result.due_ms + HOUR_MS
    [message] = claim(bare, "order-1")
    assert bare.ack(message.lease).code is Code.ACKED
    assert bare.get("order-1").state is State.DONE
    assert bare.schedule("order-1", b"x", delay_ms=0).code is Code.ALREADY_DONE


def test_a_call_over_several_slots_obeys_each_slots_own_record(
    make_queue: MakeQueue, redis_client: redis.Redis
) -> None:
    """schedulemany-1 reads each slot's record, not the first one's for all: mid-publish (or
    with an owner of another version on a slot) the records of a broker's slots differ."""
    by_slot: dict[int, str] = {}
    for n in range(400):
        by_slot.setdefault(TOPIC.slot_of(f"r{n}"), f"r{n}")
    for slot, ttl_ms in ((0, HOUR_MS), (1, 2 * HOUR_MS)):
        record = dataclasses.replace(TOPIC, expiry_ttl_ms=ttl_ms)
        Queue(redis_client, record).run_steps(topic_record.publish(record, OWNER, 1, [slot]))
    bare = make_queue()  # no default expiry; slots 2 and 3 have no record: no expiry there
    requests = [ScheduleRequest(by_slot[s], b"", at_ms=10**12) for s in range(4)]
    calls = produce_plans.schedule(bare.topic, requests, Mode.CREATE).calls
    assert [call.script for call in calls] == [Script.SCHEDULE_MANY]
    bare.schedule_many(requests)
    assert [bare.get(by_slot[s]).expire_at_ms for s in range(4)] == [
        10**12 + HOUR_MS,
        10**12 + 2 * HOUR_MS,
        None,
        None,
    ]


def test_an_older_version_never_replaces_a_newer_record(redis_client: redis.Redis) -> None:
    newer = dataclasses.replace(TOPIC, max_retries=7)
    assert publish(redis_client, newer, 5) == [5] * TOPIC.slot_amount
    assert publish(redis_client, TOPIC, 4) == [5] * TOPIC.slot_amount  # kept
    record = redis_client.hgetall(slot_keys(TOPIC, 0).settings)
    assert record[b"max_retries"] == b"7"
    assert record[b"version"] == b"5"
    # another owner (the topic deleted and made again under its name) replaces it
    assert publish(redis_client, TOPIC, 1, owner="new-uid") == [1] * TOPIC.slot_amount
    assert redis_client.hget(slot_keys(TOPIC, 3).settings, "max_retries") == b"2"


def test_the_record_holds_each_recorded_topic_field_and_the_slot_share_of_the_quota(
    redis_client: redis.Redis,
) -> None:
    topic = dataclasses.replace(TOPIC, limits_max_pending=9)  # 4 slots: 3 each
    publish(redis_client, topic, 1)
    raw = cast(dict[bytes, bytes], redis_client.hgetall(slot_keys(topic, 2).settings))
    record = {k.decode(): v.decode() for k, v in raw.items()}
    assert record.pop("owner") == OWNER
    assert record.pop("version") == "1"
    # the layout fields only once the topic turns buckets on (test_record_buckets.py)
    assert set(record) == set(topic_record.RECORDED_FIELDS) - set(topic_record.LAYOUT_FIELDS)
    assert set(topic_record.RECORDED_FIELDS) <= {f.name for f in dataclasses.fields(Topic)}
    assert record["limits_max_pending"] == "3"
    assert record["retry_exhausted_action"] == "dead"


def test_the_topics_users_read_the_record_and_may_not_write_it(
    make_queue: MakeQueue, redis_client: redis.Redis
) -> None:
    """The restricted user of every service, producer and pipeline: Redis 7's read-only key
    pattern. It can neither publish other settings nor change the record by hand."""
    publish(redis_client, dataclasses.replace(TOPIC, max_retries=9), 1)
    user = make_queue()
    with pytest.raises(NoPermissionError):
        user.publish_settings(OWNER, 2)
    record = slot_keys(TOPIC, 0).settings
    assert user.redis.hget(record, "max_retries") == b"9"
    for command in (("HSET", record, "max_retries", "99"), ("DEL", record)):
        with pytest.raises(NoPermissionError):
            user.redis.execute_command(*command)
    assert redis_client.hget(record, "max_retries") == b"9"
    other = Topic("payments", namespace="billing")
    publish(redis_client, other, 1)
    with pytest.raises(NoPermissionError):  # another topic's record: not even read
        user.redis.hget(slot_keys(other, 0).settings, "max_retries")


def test_a_client_with_the_journal_off_journals_by_the_published_bound(
    make_queue: MakeQueue, redis_client: redis.Redis
) -> None:
    """Also the transitions whose only setting is the journal bound (reschedule here)."""
    publish(redis_client, dataclasses.replace(TOPIC, journal_max_len=100), 1)
    quiet = make_queue(journal_max_len=0)
    quiet.schedule("j", b"", delay_ms=60_000)
    quiet.reschedule("j", delay_ms=120_000)
    journal = slot_keys(TOPIC, TOPIC.slot_of("j")).key(Part.JOURNAL)
    entries = cast(list[tuple[bytes, dict[bytes, bytes]]], redis_client.xrange(journal))
    assert [fields[b"e"] for _, fields in entries] == [b"scheduled", b"rescheduled"]


def test_a_slot_move_run_as_the_topics_user_leaves_the_record_alone(
    make_queue: MakeQueue, redis_client: redis.Redis
) -> None:
    """A move (queue/slot_copy.py) goes over the slot's parts as the service user, who may not
    write the record: it is no part, so the move neither fails on it nor removes it."""
    publish(redis_client, TOPIC, 1)
    user = make_queue()
    user.schedule("moved", b"", delay_ms=60_000)
    keys = slot_keys(TOPIC, TOPIC.slot_of("moved"))
    assert delete_slot(user.redis, keys) >= 1
    assert user.get("moved").state is State.ABSENT
    assert redis_client.hget(keys.settings, "version") == b"1"


def test_publishing_unchanged_settings_again_writes_nothing(redis_client: redis.Redis) -> None:
    """The operator publishes on every pass: an unchanged record is only read, so a master
    whose writes are paused (a switchover) does not hold the pass up."""
    publish(redis_client, TOPIC, 3)
    redis_client.client_pause(10_000, all=False)  # writes wait 10 s, reads are answered
    try:
        started = time.monotonic()
        assert publish(redis_client, TOPIC, 3) == [3] * TOPIC.slot_amount
        assert time.monotonic() - started < 5.0
    finally:
        redis_client.client_unpause()


def test_a_record_written_over_with_bytes_that_are_no_text_is_published_again(
    redis_client: redis.Redis,
) -> None:
    """Regression: the record's readback decoded every field as strict UTF-8, and the topic's
    brokers are its tenant's (the admin password is in the topic's Secret): a record written
    over with b"\\xff" raised UnicodeDecodeError out of the operator's publish, which catches
    Redis errors only, and so out of the topic's health pass, failovers included, each pass."""
    publish(redis_client, TOPIC, 3)
    redis_client.hset(slot_keys(TOPIC, 0).settings, b"max_retries", b"\xff")
    redis_client.hset(slot_keys(TOPIC, 1).settings, b"\xfe", b"1")
    assert publish(redis_client, TOPIC, 3) == [3] * TOPIC.slot_amount
    assert redis_client.hget(slot_keys(TOPIC, 0).settings, "max_retries") == b"2"
    assert b"\xfe" not in redis_client.hgetall(slot_keys(TOPIC, 1).settings)


def test_the_owners_read_of_a_record_is_bounded_whatever_the_record_holds(
    redis_client: redis.Redis,
) -> None:
    """Regression: settings-1 answered the whole hash (HGETALL), which the operator reads for
    every slot of every broker on every pass; the tenant holds the brokers' admin login, so a
    record grown to gigabytes was read into the operator, the one process that runs every
    tenant's failovers. A record with more fields or longer values than any record has reads
    as none (and is written again whole)."""
    publish(redis_client, TOPIC, 3)
    settings = functions.library().function(Script.SETTINGS)
    grown, wide = slot_keys(TOPIC, 0).settings, slot_keys(TOPIC, 1).settings
    redis_client.hset(grown, "max_retries", "9" * 1_000_000)
    redis_client.hset(wide, mapping={f"f{n}": "1" for n in range(1000)})
    for key in (grown, wide):
        assert redis_client.fcall_ro(settings, 1, key) == []
    assert publish(redis_client, TOPIC, 3) == [3] * TOPIC.slot_amount
    assert redis_client.hget(grown, "max_retries") == b"2"
    assert redis_client.hlen(wide) == len(topic_record.recorded_values(TOPIC)) + 2
