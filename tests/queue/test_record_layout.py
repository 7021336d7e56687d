"""The bytes a slot's `msg` hash holds per message (lua/includes/record_fields.lua), on a real
redis-server: the record docs/benchmarks.md ("Memory per pending message") and
bench/bench_layouts.py measure is the one the scripts write, on every path back to pending."""

from __future__ import annotations

import pytest
import redis

from delayq.queue.client import Queue
from delayq.queue.codes import Code
from delayq.queue.keys import Part, slot_keys
from delayq.queue.recurrence import Recurrence
from delayq.queue.schedules import Schedule, occurrence_id

from .conftest import TOPIC

HOUR_MS = 3_600_000


def raw_record(client: redis.Redis, message_id: str, slot_basis: str | None = None) -> bytes | None:
    slot = TOPIC.slot_of(slot_basis or message_id)
    record = client.hget(slot_keys(TOPIC, slot).key(Part.MSG), message_id)
    assert record is None or isinstance(record, bytes)
    return record


def test_a_fresh_record(queue: Queue, redis_client: redis.Redis) -> None:
    queue.schedule("plain", b"p", delay_ms=HOUR_MS)
    queue.schedule("headed", b"p", delay_ms=HOUR_MS, headers={"k": "v"})
    due_ms = queue.schedule("expiring", b"p", delay_ms=HOUR_MS, ttl_ms=5).due_ms
    assert raw_record(redis_client, "plain") == b"0:::0:p"
    assert raw_record(redis_client, "headed") == b'0:::9:{"k":"v"}p'
    assert raw_record(redis_client, "expiring") == f"0:::x{due_ms + 5}:0:p".encode()


@pytest.mark.parametrize(
    ("headers", "record"), [({}, b"0:::0:p"), ({"k": "v"}, b'0:::9:{"k":"v"}p')]
)
def test_an_occurrence_of_a_recurring_schedule_is_written_alike(
    queue: Queue, redis_client: redis.Redis, headers: dict[str, str], record: bytes
) -> None:
    schedule = Schedule("tick", Recurrence(every_ms=HOUR_MS), payload="p", headers=headers)
    first_due_ms = queue.put_schedule(schedule).first_due_ms
    assert raw_record(redis_client, occurrence_id("tick", first_due_ms), "tick") == record


def test_a_lease_given_back_or_redriven_returns_to_the_fresh_form(
    queue: Queue, redis_client: redis.Redis
) -> None:
    queue.schedule("a", b"p", delay_ms=0)
    slot = TOPIC.slot_of("a")
    epoch = queue.take_over(slot)
    [message] = queue.claim(slot, epoch).messages
    assert raw_record(redis_client, "a") == f"1:{message.due_ms}:{message.lease_id}:0:p".encode()
    assert queue.giveback_many([message])[0].code is Code.GIVEN_BACK
    assert raw_record(redis_client, "a") == b"0:::0:p"
    [message] = queue.claim(slot, epoch).messages
    queue.nack(message.lease, dead=True)
    assert queue.redrive(slot, ["a"])[0].code is Code.REDRIVEN
    assert raw_record(redis_client, "a") == b"0:::0:p"


#: Records as 0.1.0 wrote them (`<attempts>:<due or empty>:<headers_len>:`, no lease field),
#: waiting: fresh, with headers, a payload that looks like fields, retried once.
RELEASE_0_1_0_WAITING = {
    "fresh": (b"0::0:p", 0, {}, b"p"),
    "headed": (b'0::9:{"k":"v"}p', 0, {"k": "v"}, b"p"),
    "colons": (b"0::0:a:b", 0, {}, b"a:b"),
    "retried": (b"1::0:7:3:x", 1, {}, b"7:3:x"),
}


def test_records_a_0_1_0_broker_holds_are_read_and_delivered(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """A broker upgraded from 0.1.0 keeps its pending messages in 0.1.0's layout: each is read
    (get), claimed with its payload and headers and rewritten in the current layout; one 0.1.0
    had leased (`<attempts>:<due>:0:...` in prepare) is rolled back when its lease has run out
    and delivered again. Before, decoding them raised and the claim left them leased."""
    now_ms = int(redis_client.time()[0]) * 1000
    for message_id, (record, *_) in RELEASE_0_1_0_WAITING.items():
        keys = slot_keys(TOPIC, TOPIC.slot_of(message_id))
        redis_client.hset(keys.key(Part.MSG), message_id, record)
        redis_client.zadd(keys.key(Part.STORE), {message_id: now_ms - 10})
    leased = slot_keys(TOPIC, TOPIC.slot_of("leased"))
    redis_client.hset(leased.key(Part.MSG), "leased", f"1:{now_ms - 20}:0:q".encode())
    redis_client.zadd(leased.key(Part.PREPARE), {"leased": now_ms - 5})
    for message_id, (_, attempts, headers, payload) in RELEASE_0_1_0_WAITING.items():
        info = queue.get(message_id)
        assert (info.attempts, info.headers, info.payload) == (attempts, headers, payload)
    delivered = {}
    for slot in range(TOPIC.slot_amount):
        epoch = queue.take_over(slot)
        for message in queue.claim(slot, epoch).messages:
            delivered[message.id] = message
    assert sorted(delivered) == sorted([*RELEASE_0_1_0_WAITING, "leased"])
    for message_id, (_, attempts, headers, payload) in RELEASE_0_1_0_WAITING.items():
        message = delivered[message_id]
        assert (message.attempt, message.headers, message.payload) == (
            attempts + 1, headers, payload)
        headers_field = b"9:" if headers else b"0:"
        assert raw_record(redis_client, message_id) == (
            f"{attempts + 1}:{message.due_ms}:{message.lease_id}:".encode() + headers_field
            + (b'{"k":"v"}' if headers else b"") + payload)
    assert (delivered["leased"].attempt, delivered["leased"].payload) == (2, b"q")
    for message in delivered.values():
        assert queue.ack(message.lease).code is Code.ACKED
