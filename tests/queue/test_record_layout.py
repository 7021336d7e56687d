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
