"""Remembered outcomes (a topic's `outcome_retention_ms`) against a real redis-server.

A finished id (acked, cancelled, purged) is remembered for the retention: `get` answers its
outcome, create-only scheduling answers ALREADY_DONE instead of delivering it again, upsert
schedules it anew, and past the retention it is forgotten (by age, trimmed a bounded batch per
finishing call). With retention 0 nothing is remembered and nothing is left behind.
"""

from __future__ import annotations

import pytest
import redis

from delayq.local.waiting import wait_until
from delayq.queue.client import Queue
from delayq.queue.codes import Code
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import Mode, ScheduleRequest, State, Target
from delayq.queue.topic import Topic

from .conftest import TOPIC, MakeQueue, server_ms
from .test_engine import claim_one

HOUR_MS = 3_600_000


@pytest.fixture
def remembering(make_queue: MakeQueue) -> Queue:
    return make_queue(outcome_retention_ms=HOUR_MS)


def outcome_keys(topic: Topic) -> list[str]:
    return [
        slot_keys(topic, slot).key(part)
        for slot in topic.slots
        for part in (Part.OUTCOME, Part.FINISHED)
    ]


def test_an_acked_id_is_remembered_and_not_scheduled_again(
    remembering: Queue, redis_client: redis.Redis
) -> None:
    remembering.schedule("order-1", b"x", delay_ms=0)
    message = claim_one(remembering, "order-1")
    before = server_ms(redis_client)
    assert remembering.ack(message.lease).code is Code.ACKED

    info = remembering.get("order-1")
    assert info.state is State.DONE
    assert info.attempts == 1
    assert info.finished_ms is not None
    assert before <= info.finished_ms <= server_ms(redis_client)
    assert (info.payload, info.due_ms) == (b"", None)

    again = remembering.schedule("order-1", b"x", delay_ms=0)  # a producer's retry
    assert (again.code, again.state, again.due_ms) == (
        Code.ALREADY_DONE,
        State.DONE,
        info.finished_ms,
    )
    assert remembering.get("order-1").state is State.DONE  # nothing was scheduled
    assert remembering.stats().scheduled == 0


def test_cancel_and_purge_are_remembered_with_their_attempts(remembering: Queue) -> None:
    remembering.schedule("cancelled", b"x", delay_ms=HOUR_MS)
    remembering.cancel("cancelled")
    assert remembering.get("cancelled").state is State.CANCELLED
    # a remembered id is not live: nothing to cancel
    assert remembering.cancel("cancelled").code is Code.NOT_FOUND

    remembering.schedule("poison", b"x", delay_ms=0)
    message = claim_one(remembering, "poison")
    assert remembering.nack(message.lease, dead=True, reason="bad").code is Code.DEAD
    [purged] = remembering.purge(message.slot, ["poison"])
    assert purged.code is Code.PURGED
    info = remembering.get("poison")
    assert (info.state, info.attempts) == (State.PURGED, 1)

    results = remembering.schedule_many(
        [
            ScheduleRequest("cancelled", b"y", delay_ms=0),
            ScheduleRequest("poison", b"y", delay_ms=0),
        ],
        Mode.CREATE,
    )
    assert [(r.code, r.state) for r in results] == [
        (Code.ALREADY_DONE, State.CANCELLED),
        (Code.ALREADY_DONE, State.PURGED),
    ]


def test_upsert_schedules_a_remembered_id_anew_and_it_finishes_again(remembering: Queue) -> None:
    remembering.schedule("again", b"one", delay_ms=0)
    remembering.ack(claim_one(remembering, "again").lease)
    replaced = remembering.schedule("again", b"two", delay_ms=0, mode=Mode.UPSERT)
    assert replaced.code is Code.CREATED
    live = remembering.get("again")
    assert (live.state, live.payload) == (State.SCHEDULED, b"two")
    message = claim_one(remembering, "again")
    assert message.payload == b"two"
    remembering.ack(message.lease)
    assert remembering.get("again").state is State.DONE


def test_a_retry_within_one_batch_is_not_mistaken_for_a_finished_id(remembering: Queue) -> None:
    """The same id twice in one create-only batch: the second finds the first live (EXISTS)."""
    results = remembering.schedule_many(
        [ScheduleRequest("twice", b"a", delay_ms=0), ScheduleRequest("twice", b"b", delay_ms=0)],
        Mode.CREATE,
    )
    assert [r.code for r in results] == [Code.CREATED, Code.EXISTS]


def test_past_the_retention_an_id_is_forgotten_and_trimmed(
    make_queue: MakeQueue, redis_client: redis.Redis
) -> None:
    queue = make_queue(outcome_retention_ms=300)
    short = queue.topic
    queue.schedule("brief", b"x", delay_ms=HOUR_MS)
    queue.cancel("brief")
    assert queue.get("brief").state is State.CANCELLED
    wait_until(lambda: queue.get("brief").state is State.ABSENT, 5.0, "the outcome forgotten")

    # forgotten, but stored until a finishing call of its slot trims it
    keys = slot_keys(short, short.slot_of("brief"))
    assert redis_client.zscore(keys.key(Part.FINISHED), "brief") is not None
    other = next(f"other-{n}" for n in range(100) if short.slot_of(f"other-{n}") == keys.slot)
    queue.schedule(other, b"x", delay_ms=HOUR_MS)
    queue.cancel(other)
    assert redis_client.zrange(keys.key(Part.FINISHED), 0, -1) == [other.encode()]
    assert redis_client.hkeys(keys.key(Part.OUTCOME)) == [other.encode()]
    assert queue.schedule("brief", b"x", delay_ms=HOUR_MS).code is Code.CREATED


def test_trimming_is_bounded_per_call(make_queue: MakeQueue, redis_client: redis.Redis) -> None:
    """A backlog of expired outcomes drains a bounded batch per finishing call: a call that
    finishes n messages forgets at most n + 64."""
    queue = make_queue(slot_amount=1, outcome_retention_ms=200)
    short = queue.topic
    ids = [f"bulk-{n}" for n in range(500)]
    queue.schedule_many([ScheduleRequest(i, b"", delay_ms=HOUR_MS) for i in ids], Mode.CREATE)
    queue.cancel_many([Target(i) for i in ids])
    finished = slot_keys(short, 0).key(Part.FINISHED)
    assert redis_client.zcard(finished) == 500
    wait_until(lambda: queue.get("bulk-0").state is State.ABSENT, 5.0, "the outcomes expired")
    queue.schedule("one", b"", delay_ms=HOUR_MS)
    queue.cancel("one")
    assert redis_client.zcard(finished) == 500 + 1 - 65
    assert redis_client.hlen(slot_keys(short, 0).key(Part.OUTCOME)) == 500 + 1 - 65


def test_retention_off_remembers_nothing(queue: Queue, redis_client: redis.Redis) -> None:
    queue.schedule("plain", b"x", delay_ms=0)
    queue.ack(claim_one(queue, "plain").lease)
    assert queue.get("plain").state is State.ABSENT
    assert queue.schedule("plain", b"x", delay_ms=HOUR_MS).code is Code.CREATED
    assert not any(redis_client.exists(key) for key in outcome_keys(TOPIC))


def test_dead_and_redriven_messages_are_live_not_outcomes(remembering: Queue) -> None:
    remembering.schedule("retry", b"x", delay_ms=0)
    message = claim_one(remembering, "retry")
    remembering.nack(message.lease, dead=True, reason="bad")
    assert remembering.get("retry").state is State.DEAD
    assert remembering.schedule("retry", b"x", delay_ms=0).code is Code.EXISTS
    remembering.redrive_all()
    assert remembering.get("retry").state is State.SCHEDULED
